#!/usr/bin/python3
"""Writes the small PyTorch-made files the engine's tests load from C++.

Run with Debian's python3-torch:
    /usr/bin/python3 worker/engine/testdata/gen_torch_files.py

  tensors_dict.pt   torch.save({"inputs": x, "targets": y}): x = arange(24) as
                    float32 [6, 4] / 10, y = int64 [0 1 2 0 1 2]
  tensors_tuple.pt  torch.save((x, y)) with the same x, y
  tensors_view.pt   torch.save of views into a bigger storage (x[::2], y[::2])
  tiny_script.pt    torch.jit.script(TinyNet()).save(): Linear(4 -> 3), ReLU,
                    Linear(3 -> 2), weights from torch.manual_seed(0)
"""
import os

import torch

HERE = os.path.dirname(os.path.abspath(__file__))


class TinyNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 3)
        self.fc2 = torch.nn.Linear(3, 2)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def main():
    x = torch.arange(24, dtype=torch.float32).reshape(6, 4) / 10
    y = torch.tensor([0, 1, 2, 0, 1, 2], dtype=torch.int64)
    torch.save({"inputs": x, "targets": y}, os.path.join(HERE, "tensors_dict.pt"))
    torch.save((x, y), os.path.join(HERE, "tensors_tuple.pt"))
    torch.save((x[::2], y[::2]), os.path.join(HERE, "tensors_view.pt"))
    torch.manual_seed(0)
    m = torch.jit.script(TinyNet())
    m.save(os.path.join(HERE, "tiny_script.pt"))
    # Reference output for the C++ test: forward(ones(1, 4)).
    print("tiny_script forward(ones(1,4)) =", m(torch.ones(1, 4)).tolist())


if __name__ == "__main__":
    main()
