"""Progress reports from a training script to trainctl, with no dependencies.

Under trainctl (a command job, or ``trainctl run``) the worker hands each
rank a status pipe in ``TRAINCTL_STATUS_FD``; ``report()`` writes one line of
the rank protocol to it (``worker/protocol/rank_protocol.h``). Anywhere else
(plain ``python train.py``, torchrun) both functions do nothing harmful, so
the same script runs unchanged::

    import trainctl
    for epoch in range(epochs):
        ...
        trainctl.report(step=step, epoch=epoch, loss=loss.item(), lr=lr)
    torch.save(state, os.path.join(trainctl.checkpoint_dir() or ".", "model.pt"))

Checkpoints and the final model go through trainctl too, so that
``trainctl checkpoints``, ``fetch``, ``resume`` and restarts see them::

    ckpt = trainctl.load_checkpoint()          # None on a fresh start
    if ckpt is not None:
        state = ckpt.load()                    # torch.load(ckpt.path)
        start_epoch = ckpt.epoch
    ...
    trainctl.save_checkpoint(state, step=step, epoch=epoch + 1)
    trainctl.save_model(model.state_dict())

The gRPC client (``trainctl.Client``, ``trainctl.TrainctlError``; see
``trainctl/client.py`` and docs/python-client.md) is imported only when first
used: it needs grpcio, protobuf, PyYAML and the generated ``trainctl.v1``
stubs, and ``report()`` needs none of them.
"""

import math
import os
import re
import shutil
import sys
import tempfile
import zlib
import threading

__all__ = ["report", "checkpoint_dir", "should_checkpoint", "save_checkpoint", "save_model",
           "load_checkpoint", "load_state_dict", "Checkpoint"]

# The generated stubs (trainctl.v1.*_pb2) sit beside this file once installed;
# from a build tree, python/gen_stubs.sh writes them to a directory that
# $TRAINCTL_PYTHON_STUBS names (it holds trainctl/v1/).
_stubs = os.environ.get("TRAINCTL_PYTHON_STUBS")
if _stubs:
    __path__.append(os.path.join(_stubs, "trainctl"))

# Names of trainctl.client that `trainctl.X` offers, imported on first use
# (grpc, protobuf and the stubs only then); those of trainctl.jobs need none.
_CLIENT_NAMES = ("Client", "TrainctlError", "WaitTimeout", "Artifact")
_JOBS_NAMES = ("Job", "JobState", "AttemptState", "RankState", "FailureKind")


def __getattr__(name):
    if name in _CLIENT_NAMES:
        from trainctl import client
        return getattr(client, name)
    if name in _JOBS_NAMES:
        from trainctl import jobs
        return getattr(jobs, name)
    raise AttributeError("module 'trainctl' has no attribute %r" % name)

# Metric keys with a field of their own in trainctl.v1.MetricPoint; any other
# name is a custom scalar (MetricPoint.scalars): stored, listed by
# `trainctl metrics` and charted by the dashboard.
_KNOWN = ("steps_per_epoch", "lr", "samples_per_sec", "data_ms", "compute_ms", "comm_ms",
          "loss_scale", "skipped_steps", "peak_memory_bytes", "samples_seen",
          "eval_loss", "eval_accuracy", "eval_samples")
_INTS = ("steps_per_epoch", "skipped_steps", "peak_memory_bytes", "samples_seen", "eval_samples")

# A custom scalar's name (the worker refuses others) and how many one report carries.
_SCALAR_NAME = re.compile(r"^[A-Za-z0-9_./-]{1,64}$")
_MAX_SCALARS = 32

_fd = None
_broken = False
# The last report's epoch and step, and a lock held while one is written:
# the rank's start-up hook (_rank_boot/sitecustomize.py) sends them in its
# heartbeat under the same lock, so the step it sends never goes back.
_report_lock = threading.Lock()
_last_epoch = 0
_last_step = 0
_warned = set()


def _warn_once(key, text):
    if key not in _warned:
        _warned.add(key)
        sys.stderr.write("trainctl.report: %s\n" % text)


def _status_fd():
    global _fd
    if _fd is None:
        try:
            _fd = int(os.environ.get("TRAINCTL_STATUS_FD", "-1"))
        except ValueError:
            _fd = -1
    return _fd


def _write(line):
    global _broken
    fd = _status_fd()
    if fd < 0 or _broken:
        return False
    data = (line + "\n").encode("ascii", "replace")
    try:
        while data:
            n = os.write(fd, data)
            data = data[n:]
    except OSError:
        _broken = True  # The worker went away; training goes on.
        return False
    return True


def _number(value):
    value = float(value)
    return repr(value) if math.isfinite(value) else None


def _is_eval_name(key):
    """An evaluation's value: eval_loss, val_f1, eval/top5, val.acc..."""
    for prefix in ("eval", "val"):
        if key.startswith(prefix) and len(key) > len(prefix) and key[len(prefix)] in "_./-":
            return True
    return False


def _metric_line(kind, epoch, step, values):
    """The `metric` line of one point: only the names in ``values`` (a dict
    of the report's arguments), so that trainctl stores what was reported
    and nothing else."""
    parts = ["metric", "kind=" + kind, "epoch=%d" % epoch, "step=%d" % step]
    for key in ("loss",) + _KNOWN:
        if key in values:
            if key in _INTS:
                parts.append("%s=%d" % (key, int(values[key])))
            else:
                text = _number(values[key])
                if text is not None:
                    parts.append("%s=%s" % (key, text))
    custom = 0
    for key in sorted(values):
        value = values[key]
        if key == "loss" or key in _KNOWN:
            continue
        if not _SCALAR_NAME.match(key):
            _warn_once(key, "%r is not a scalar name (1-64 of A-Z a-z 0-9 _ . / -): not reported" % key)
            continue
        if custom == _MAX_SCALARS:
            _warn_once("#max", "more than %d scalars in one report: the rest are not reported" % _MAX_SCALARS)
            break
        try:
            text = _number(value)
        except (TypeError, ValueError):
            _warn_once(key, "%s=%r is not a number: not reported" % (key, value))
            continue
        if text is not None:
            parts.append("s.%s=%s" % (key, text))
            custom += 1
    return " ".join(parts)


def report(step=None, epoch=None, loss=None, kind=None, **scalars):
    """Reports training progress: global optimizer ``step`` (over all epochs),
    ``epoch`` (from 0), ``loss`` and other scalars: trainctl's own (``lr``,
    ``samples_per_sec``, ``eval_loss``, ``eval_accuracy``...) and any of your
    own (``val_f1=0.82``: names of 1-64 letters, digits and ``_./-``, at most
    32 per report). Returns True when trainctl got it.

    Evaluations are their own points: names that start with ``eval`` or
    ``val`` and ``_``, ``.``, ``/`` or ``-`` (``eval_accuracy``,
    ``val_f1``) are stored as an eval point (``trainctl metrics --kind
    eval``), the rest as a train point, so one call may report both.
    ``kind="eval"`` makes the whole report an evaluation (``loss`` is then
    the eval loss); ``kind="train"`` keeps it all in one train point.
    trainctl stores only the names given: nothing reported reads as 0."""
    if kind not in (None, "train", "eval"):
        raise ValueError("trainctl.report: kind must be 'train' or 'eval', not %r" % (kind,))
    epoch = int(epoch) if epoch is not None else 0
    step = int(step) if step is not None else 0
    values = dict((k, v) for k, v in scalars.items() if v is not None)
    train, evaluation = {}, {}
    if loss is not None:
        (evaluation if kind == "eval" else train)["eval_loss" if kind == "eval" else "loss"] = loss
    for key, value in values.items():
        if kind == "eval" and key == "eval_loss" and "eval_loss" in evaluation:
            raise ValueError("trainctl.report: kind='eval' takes loss or eval_loss, not both")
        if kind == "train" or (kind is None and not _is_eval_name(key)):
            train[key] = value
        elif key in _KNOWN and not key.startswith("eval_") and key != "steps_per_epoch":
            _warn_once("eval:" + key, "%s is a training field: not reported with kind='eval'" % key)
        else:
            evaluation[key] = value
    lines = []
    if train or not evaluation:
        lines.append(_metric_line("train", epoch, step, train))
    if evaluation:
        # An eval point keeps the train points' steps per epoch: the
        # coordinator orders a job's points by epoch * steps_per_epoch + step.
        if "steps_per_epoch" in train:
            evaluation.setdefault("steps_per_epoch", train["steps_per_epoch"])
        lines.append(_metric_line("eval", epoch, step, evaluation))
    global _last_epoch, _last_step
    with _report_lock:
        _last_epoch, _last_step = epoch, step
        if not _write("progress %d %d" % (epoch, step)):
            return False
    return all([_write(line) for line in lines])


def checkpoint_dir():
    """The directory trainctl keeps this job's checkpoints in (on this host),
    or None when not run by trainctl."""
    return os.environ.get("TRAINCTL_CHECKPOINT_DIR") or None


def should_checkpoint():
    """True once trainctl is preempting this job (docs/queues.md): save a
    checkpoint now and exit 0 (or let SIGTERM end the process); the job
    resumes later on freed slots. A preemption sends SIGTERM after making
    the file in ``TRAINCTL_PREEMPT_FILE``, and SIGKILL after the
    coordinator's --preemption-grace-s. False when not run by trainctl."""
    path = os.environ.get("TRAINCTL_PREEMPT_FILE")
    return bool(path) and os.path.exists(path)


# --- checkpoints and the final model --------------------------------------------
# The worker records (and `trainctl fetch` serves) only files named as
# trainctl names them, directly in TRAINCTL_CHECKPOINT_DIR
# (common/jobspec/artifact_names.h): <job>.ckpt-epoch-EEEEEE[-SSSSSSSSSS].pt,
# <job>.model.pt. A script's checkpoint carries its global step in the second
# number, so that two checkpoints of one epoch never share a file.


class Checkpoint(object):
    """A checkpoint to continue from: ``path`` (a file on this host), ``epoch``
    (epochs completed when it was saved: the epoch to start at) and ``step``
    (the global optimizer step)."""

    __slots__ = ("path", "epoch", "step")

    def __init__(self, path, epoch, step):
        self.path = path
        self.epoch = epoch
        self.step = step

    def load(self, map_location="cpu", **kwargs):
        """``torch.load(self.path, map_location=...)``: what save_checkpoint was given."""
        import torch
        return torch.load(self.path, map_location=map_location, **kwargs)

    def __repr__(self):
        return "Checkpoint(path=%r, epoch=%d, step=%d)" % (self.path, self.epoch, self.step)


def _env_int(name, default):
    try:
        return int(os.environ.get(name, ""))
    except ValueError:
        return default


def _job_prefix():
    job = os.environ.get("TRAINCTL_JOB_ID", "")
    return job + "." if job else ""


def _crc32_of(path):
    crc = 0
    with open(path, "rb") as f:
        while True:
            block = f.read(1 << 20)
            if not block:
                break
            crc = zlib.crc32(block, crc)
    return "crc32:%08x" % (crc & 0xFFFFFFFF)


def _umask():
    """This process's umask (read by setting it and setting it back)."""
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def _fsync_dir(directory):
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomically(obj_or_path, directory, name):
    """Puts obj_or_path (a file to copy, bytes, or an object for torch.save) at
    directory/name: written to a temporary file there, fsync'ed, renamed over
    the name, the directory fsync'ed. Returns the final path."""
    final = os.path.join(directory, name)
    if isinstance(obj_or_path, (str, os.PathLike)):
        source = os.fspath(obj_or_path)
        if os.path.abspath(source) == os.path.abspath(final):
            return final  # already in place (written by the script itself)
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + name + ".", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as out:
            if isinstance(obj_or_path, (str, os.PathLike)):
                with open(os.fspath(obj_or_path), "rb") as src:
                    shutil.copyfileobj(src, out, 1 << 20)
            elif isinstance(obj_or_path, (bytes, bytearray, memoryview)):
                out.write(obj_or_path)
            else:
                import torch
                torch.save(obj_or_path, out)
            out.flush()
            os.fsync(out.fileno())
        # mkstemp made it 0600; give it the mode any file this process
        # creates gets (0644 under umask 022, 0600 under the 077 a worker
        # daemon and `trainctl run` give ranks), never more.
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, final)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(directory)
    return final


def _is_rank0():
    return _env_int("RANK", 0) == 0


def save_checkpoint(obj_or_path, step, epoch=0):
    """Saves a checkpoint into the job's checkpoint directory and records it
    with trainctl (``trainctl checkpoints``, ``fetch --checkpoint STEP``,
    ``resume``, restarts after a failure).

    ``obj_or_path``: an object (``torch.save`` writes it: a dict of
    state_dicts, say), bytes, or the path of a file the script wrote (copied).
    ``step``: the global optimizer step (>= 1); ``epoch``: epochs completed
    (the epoch a job continuing from it starts at). Written atomically
    (temporary file, fsync, rename). Only rank 0 saves: on other ranks this
    does nothing and returns None. Returns the file's path. Outside trainctl
    the file goes to the current directory and nothing is recorded."""
    step, epoch = int(step), int(epoch)
    if step < 1 or epoch < 0:
        raise ValueError("save_checkpoint: step must be >= 1 and epoch >= 0, got step=%d epoch=%d" % (step, epoch))
    if not _is_rank0():
        return None
    directory = checkpoint_dir() or "."
    name = "%sckpt-epoch-%06d-%010d.pt" % (_job_prefix(), epoch, step)
    path = os.path.abspath(_write_atomically(obj_or_path, directory, name))
    # checkpoint EPOCHS_DONE GLOBAL_STEP SIZE CHECKSUM EPOCH_CONSUMED PATH
    # (worker/protocol/rank_protocol.cc, FormatCheckpoint); EPOCH_CONSUMED is
    # the engine's position inside an epoch, 0 for a script.
    _write("checkpoint %d %d %d %s 0 %s" % (epoch, step, os.path.getsize(path), _crc32_of(path), path))
    return path


def save_model(obj_or_path):
    """Saves the final model into the job's checkpoint directory as
    ``<job id>.model.pt`` and records it: ``trainctl fetch JOB`` gets it.
    ``obj_or_path`` as for save_checkpoint (``model.state_dict()`` is usual).
    Only rank 0 saves (elsewhere: None). Returns the file's path."""
    if not _is_rank0():
        return None
    directory = checkpoint_dir() or "."
    path = os.path.abspath(_write_atomically(obj_or_path, directory, _job_prefix() + "model.pt"))
    _write("model %s" % path)
    return path


def load_checkpoint():
    """The checkpoint this job should continue from, or None on a fresh
    start: after a restart, the job's newest recorded checkpoint; in a job
    made by ``trainctl resume`` (or ``resume_from``), the newest checkpoint
    of the job it continues. A ``Checkpoint`` (``.path``, ``.epoch``,
    ``.step``, ``.load()``). None, too, on a host that has no copy
    (``checkpoint.shared: false`` and another host wrote it: rank 0 always
    has it; share the directory, or broadcast from rank 0)."""
    path = os.environ.get("TRAINCTL_RESUME_FROM")
    if not path or not os.path.isfile(path):
        return None
    return Checkpoint(path, _env_int("TRAINCTL_RESUME_EPOCH", 0), _env_int("TRAINCTL_RESUME_STEP", 0))


def _is_torchscript(path):
    import zipfile
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as z:
        return any(n.endswith("/constants.pkl") or n == "constants.pkl" for n in z.namelist())


def load_state_dict(path, module=None, map_location="cpu"):
    """A plain ``state_dict`` (name -> tensor) for ``nn.Module.load_state_dict``
    from a file trainctl or a script wrote: an engine checkpoint
    (``<job>.ckpt-epoch-*.pt``, a TorchScript archive: its model parameters
    and buffers under their own names), an engine final model
    (``<job>.model.pt``, TorchScript, whose names have '.' as '_': pass
    ``module`` to get that module's names back), or a ``torch.save`` file of
    a state_dict, a module or a dict with a ``"model"`` state_dict."""
    import torch
    path = os.fspath(path)
    if not _is_torchscript(path):
        obj = torch.load(path, map_location=map_location)
        if isinstance(obj, torch.nn.Module):
            return obj.state_dict()
        if isinstance(obj, dict) and isinstance(obj.get("model"), dict):
            return obj["model"]
        if isinstance(obj, dict):
            return obj
        raise ValueError("%s holds a %s, not a state_dict" % (path, type(obj).__name__))
    script = torch.jit.load(path, map_location=map_location)
    children = dict(script.named_children())
    if "params" in children:
        # An engine checkpoint (worker/trainer/checkpoint.cc): submodules
        # "params" and "buffers", each tensors t0..tN and their "names".
        out = {}
        for part in ("params", "buffers"):
            sub = children.get(part)
            if sub is None:
                continue
            names = [n for n in getattr(sub, "names").split("\n") if n]
            for i, name in enumerate(names):
                out[name] = getattr(sub, "t%d" % i).detach()
        return out
    # An engine final model: parameters and buffers flat on the module.
    flat = {}
    for name, tensor in list(script.named_parameters()) + list(script.named_buffers()):
        flat[name] = tensor.detach()
    if module is None:
        return flat
    out = {}
    for name in module.state_dict():
        key = name.replace(".", "_")
        if key in flat:
            out[name] = flat[key]
    return out
