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

The gRPC client (``trainctl.Client``, ``trainctl.TrainctlError``; see
``trainctl/client.py`` and docs/python-client.md) is imported only when first
used: it needs grpcio, protobuf, PyYAML and the generated ``trainctl.v1``
stubs, and ``report()`` needs none of them.
"""

import math
import os

__all__ = ["report", "checkpoint_dir"]

# The generated stubs (trainctl.v1.*_pb2) sit beside this file once installed;
# from a build tree, python/gen_stubs.sh writes them to a directory that
# $TRAINCTL_PYTHON_STUBS names (it holds trainctl/v1/).
_stubs = os.environ.get("TRAINCTL_PYTHON_STUBS")
if _stubs:
    __path__.append(os.path.join(_stubs, "trainctl"))

# Names of trainctl.client that `trainctl.X` offers, imported on first use.
_CLIENT_NAMES = ("Client", "TrainctlError", "Artifact")


def __getattr__(name):
    if name in _CLIENT_NAMES:
        from trainctl import client
        return getattr(client, name)
    raise AttributeError("module 'trainctl' has no attribute %r" % name)

# Metric keys the worker understands; others are accepted and ignored.
_KNOWN = ("steps_per_epoch", "lr", "samples_per_sec", "data_ms", "compute_ms", "comm_ms",
          "loss_scale", "skipped_steps", "peak_memory_bytes", "samples_seen",
          "eval_loss", "eval_accuracy", "eval_samples")
_INTS = ("steps_per_epoch", "skipped_steps", "peak_memory_bytes", "samples_seen", "eval_samples")

_fd = None
_broken = False


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


def report(step=None, epoch=None, loss=None, **scalars):
    """Reports training progress: global optimizer ``step`` (over all epochs),
    ``epoch`` (from 0), ``loss`` and other scalars (``lr``, ``samples_per_sec``,
    ``eval_loss``, ``eval_accuracy``...). Returns True when trainctl got it."""
    epoch = int(epoch) if epoch is not None else 0
    step = int(step) if step is not None else 0
    parts = ["metric", "kind=train", "epoch=%d" % epoch, "step=%d" % step]
    if loss is not None:
        text = _number(loss)
        if text is not None:
            parts.append("loss=" + text)
    for key in _KNOWN:
        if key in scalars and scalars[key] is not None:
            if key in _INTS:
                parts.append("%s=%d" % (key, int(scalars[key])))
            else:
                text = _number(scalars[key])
                if text is not None:
                    parts.append("%s=%s" % (key, text))
    if not _write("progress %d %d" % (epoch, step)):
        return False
    return _write(" ".join(parts))


def checkpoint_dir():
    """The directory trainctl keeps this job's checkpoints in (on this host),
    or None when not run by trainctl."""
    return os.environ.get("TRAINCTL_CHECKPOINT_DIR") or None
