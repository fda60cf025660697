"""trainctl's start-up hook for the Python ranks of a command job.

The worker puts this directory first on a command rank's PYTHONPATH, so
Python's ``site`` imports this module at start-up, before the user's script,
which stays unchanged (docs/failures.md#hangs). Under trainctl
(``TRAINCTL_STATUS_FD`` set) it

* registers ``faulthandler`` on SIGUSR1 for all threads: before it stops the
  ranks of an attempt that hung, the worker sends SIGUSR1 to each rank, whose
  Python stacks then go to its stderr, i.e. its log (``trainctl logs``).
  faulthandler dumps from its C signal handler, so a rank blocked in a C call
  (a Gloo all-reduce, ``time.sleep``) dumps too;
* starts a daemon thread that looks once a second at where the main thread
  is and writes a heartbeat to the status pipe: the rank's last
  ``trainctl.report`` step, how often the main thread's stack has changed
  (``moves``: a rank blocked in one call never changes it) and for how long
  its innermost frame has been in torch's collective or autograd code
  (``torch_ms``: a rank waiting for its peers). The coordinator names the
  rank that stopped from these (coordinator/jobs/script_watch.h).

Then it imports the ``sitecustomize`` it shadows (Debian's), if any.
"""

import os
import sys


def _torch_wait_file(name):
    # Where a rank blocked on its peers sits: a collective (torch.distributed),
    # DDP's forward or its gradient all-reduce inside backward.
    name = name.replace("\\", "/")
    return ("/torch/distributed/" in name or "/torch/autograd/" in name or "/torch/nn/parallel/" in name
            or name.endswith("/torch/_tensor.py"))


def _start(fd):
    import faulthandler
    import signal
    import threading
    import time

    faulthandler.register(signal.SIGUSR1, all_threads=True, chain=False)
    main = threading.main_thread().ident

    def sample():
        moves = 0
        last = None
        torch_since = None
        while True:
            time.sleep(1.0)
            frame = sys._current_frames().get(main)
            if frame is None:
                return  # The main thread ended: the interpreter is exiting.
            now = time.monotonic()
            stack = []
            f = frame
            while f is not None:
                stack.append((id(f.f_code), f.f_lasti))
                f = f.f_back
            stack = tuple(stack)
            if stack != last:
                moves += 1
                last = stack
            if _torch_wait_file(frame.f_code.co_filename):
                torch_since = torch_since or now
            else:
                torch_since = None
            torch_ms = int((now - torch_since) * 1000) if torch_since else 0
            del frame, f
            tc = sys.modules.get("trainctl")
            lock = getattr(tc, "_report_lock", None)
            words = "phase=train moves=%d torch_ms=%d" % (moves, torch_ms)
            try:
                if lock is None:
                    os.write(fd, ("progress 0 0 %s\n" % words).encode())
                else:
                    # Under report()'s lock: the step never goes back.
                    with lock:
                        os.write(fd, ("progress %d %d %s\n" % (tc._last_epoch, tc._last_step, words)).encode())
            except OSError:
                return  # The worker went away.

    threading.Thread(target=sample, name="trainctl-sampler", daemon=True).start()


def _boot():
    try:
        fd = int(os.environ.get("TRAINCTL_STATUS_FD", ""))
    except ValueError:
        return
    # Only in the process the worker started: its children (a spawned
    # DataLoader worker, a subprocess) inherit the environment, not the pipe.
    booted = os.environ.get("TRAINCTL_RANK_BOOTED")
    if fd < 0 or (booted and booted != str(os.getpid())):
        return
    os.environ["TRAINCTL_RANK_BOOTED"] = str(os.getpid())
    _start(fd)


try:
    _boot()
except Exception as e:  # Never keep the user's script from starting.
    sys.stderr.write("trainctl: rank start-up hook failed: %r\n" % (e,))

# Chain to the sitecustomize this one shadows.
_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
_self = sys.modules.pop("sitecustomize", None)
try:
    import sitecustomize  # noqa: F401
except ImportError:
    pass
# The import system files whatever sys.modules holds under this name once
# this module ends: the shadowed one, or this one when there is none.
sys.modules.setdefault("sitecustomize", _self)
