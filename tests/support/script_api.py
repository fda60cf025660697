"""A command job's script using trainctl's Python API (script_api_e2e_test):
checkpoints and the final model through trainctl, and, when resumed, the
checkpoint it continues from."""
import sys

import torch

import trainctl

ckpt = trainctl.load_checkpoint()
if ckpt is None:
    print("fresh start", flush=True)
    start = 0
else:
    state = ckpt.load()
    print("resumed from %s epoch %d step %d w=%s" % (ckpt.path, ckpt.epoch, ckpt.step, state["w"]),
          flush=True)
    start = ckpt.epoch

torch.manual_seed(7)
model = torch.nn.Linear(3, 2)
trainctl.report(step=start * 10 + 5, epoch=start, loss=0.5, lr=0.1)
# An evaluation: eval fields only (issue #44 item 3).
trainctl.report(step=start * 10 + 5, epoch=start, val_f1=0.25, eval_accuracy=0.75)
path = trainctl.save_checkpoint({"w": [start + 1.0, 2.0], "model": model.state_dict()},
                                step=(start + 1) * 10, epoch=start + 1)
print("saved checkpoint %s" % path, flush=True)
trainctl.save_model(model.state_dict())
print("model weight sum %.6f" % model.weight.sum().item(), flush=True)
sys.exit(0)
