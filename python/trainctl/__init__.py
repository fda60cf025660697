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
import re
import sys
import threading

__all__ = ["report", "checkpoint_dir", "should_checkpoint"]

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


def report(step=None, epoch=None, loss=None, **scalars):
    """Reports training progress: global optimizer ``step`` (over all epochs),
    ``epoch`` (from 0), ``loss`` and other scalars: trainctl's own (``lr``,
    ``samples_per_sec``, ``eval_loss``, ``eval_accuracy``...) and any of your
    own (``val_f1=0.82``: names of 1-64 letters, digits and ``_./-``, at most
    32 per report). Returns True when trainctl got it."""
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
    custom = 0
    for key in sorted(scalars):
        value = scalars[key]
        if key in _KNOWN or value is None:
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
    global _last_epoch, _last_step
    with _report_lock:
        _last_epoch, _last_step = epoch, step
        if not _write("progress %d %d" % (epoch, step)):
            return False
    return _write(" ".join(parts))


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
