"""Unit test of the trainctl Python module: lines on the status fd, silence without one."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


class ReportTest(unittest.TestCase):
    def setUp(self):
        import trainctl
        self.t = trainctl
        self.t._fd = None
        self.t._broken = False

    def test_without_fd_does_nothing(self):
        os.environ.pop("TRAINCTL_STATUS_FD", None)
        os.environ.pop("TRAINCTL_CHECKPOINT_DIR", None)
        self.assertFalse(self.t.report(step=1, loss=0.5))
        self.assertIsNone(self.t.checkpoint_dir())

    def test_writes_protocol_lines(self):
        r, w = os.pipe()
        os.environ["TRAINCTL_STATUS_FD"] = str(w)
        os.environ["TRAINCTL_CHECKPOINT_DIR"] = "/tmp/ck"
        self.assertTrue(self.t.report(step=7, epoch=1, loss=0.25, lr=0.1, accuracy=0.9,
                                      samples_seen=64.0))
        os.close(w)
        lines = os.read(r, 4096).decode().splitlines()
        self.assertEqual(lines, ["progress 1 7",
                                 "metric kind=train epoch=1 step=7 loss=0.25 lr=0.1 samples_seen=64 "
                                 "s.accuracy=0.9"])
        self.assertEqual(self.t.checkpoint_dir(), "/tmp/ck")

    def test_custom_scalars_are_sent_by_name_and_bad_ones_warned_about_once(self):
        r, w = os.pipe()
        os.environ["TRAINCTL_STATUS_FD"] = str(w)
        import io
        err, sys.stderr = sys.stderr, io.StringIO()
        try:
            for _ in range(2):
                self.assertTrue(self.t.report(step=3, loss=1.5, val_f1=0.8, **{"eval/top5": 0.5, "bad name": 1,
                                                                              "nan_one": float("nan"),
                                                                              "text": "x"}))
            warned = sys.stderr.getvalue()
        finally:
            sys.stderr = err
        os.close(w)
        lines = os.read(r, 4096).decode().splitlines()
        self.assertEqual(lines[1], "metric kind=train epoch=0 step=3 loss=1.5 s.eval/top5=0.5 s.val_f1=0.8")
        self.assertEqual(warned.count("'bad name' is not a scalar name"), 1)
        self.assertEqual(warned.count("text='x' is not a number"), 1)

    def test_closed_pipe_is_not_an_error(self):
        r, w = os.pipe()
        os.close(r)
        os.environ["TRAINCTL_STATUS_FD"] = str(w)
        import signal
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        self.assertFalse(self.t.report(step=1, loss=float("nan")))
        os.close(w)

    def test_should_checkpoint_follows_the_preemption_file(self):
        import tempfile
        os.environ.pop("TRAINCTL_PREEMPT_FILE", None)
        self.assertFalse(self.t.should_checkpoint())
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "rank-0.preempted")
            os.environ["TRAINCTL_PREEMPT_FILE"] = path
            self.assertFalse(self.t.should_checkpoint())
            open(path, "w").close()
            self.assertTrue(self.t.should_checkpoint())
        os.environ.pop("TRAINCTL_PREEMPT_FILE", None)



class RankBootHookTest(unittest.TestCase):
    """The command ranks' start-up hook (trainctl/_rank_boot/sitecustomize.py)
    in a real interpreter, as the worker starts one: first on PYTHONPATH."""

    def test_heartbeats_and_dumps_stacks_on_sigusr1(self):
        import signal
        import subprocess
        here = os.path.dirname(os.path.abspath(__file__))
        script = (
            "import os, sys, threading, trainctl\n"
            "trainctl.report(step=5)\n"
            "print(sys.modules['sitecustomize'].__file__, flush=True)\n"
            "def parked():\n"
            "    threading.Event().wait()\n"
            "parked()\n")
        r, w = os.pipe()
        env = dict(os.environ, PYTHONPATH=os.path.join(here, "trainctl", "_rank_boot") + os.pathsep + here,
                   TRAINCTL_STATUS_FD=str(w))
        env.pop("TRAINCTL_RANK_BOOTED", None)
        p = subprocess.Popen([sys.executable, "-c", script], env=env, pass_fds=(w,),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        os.close(w)
        try:
            status = os.fdopen(r)
            # Blocks until the hook's first heartbeat (about a second in).
            self.assertEqual(status.readline(), "progress 0 5\n")
            status.readline()  # its metric line
            beat = status.readline().split()
            self.assertEqual(beat[:3], ["progress", "0", "5"])
            self.assertIn("moves=1", beat)
            self.assertIn("torch_ms=0", beat)
            # The hook chained to the sitecustomize it shadows, if any: it
            # is not the one left in sys.modules then.
            first = p.stdout.readline().decode()
            self.assertTrue(first.strip().endswith("sitecustomize.py"), first)
            p.send_signal(signal.SIGUSR1)
            # Read the dump as it comes (stderr ends only when the process does).
            err = []
            for line in p.stderr:
                err.append(line.decode())
                text = "".join(err)
                if " in parked" in text and " in sample" in text:
                    break
        finally:
            p.kill()
            p.wait()
        err = "".join(err)
        self.assertIn("most recent call first", err)
        self.assertIn(" in sample", err)  # the hook's own thread: all threads are dumped
        self.assertIn(" in parked", err)
        self.assertIsNone(None if p.returncode == -signal.SIGKILL else p.returncode, "SIGUSR1 did not end it")

    def test_not_started_without_a_status_fd_or_in_a_child(self):
        import subprocess
        here = os.path.dirname(os.path.abspath(__file__))
        check = "import threading; print(sorted(t.name for t in threading.enumerate()))"
        env = dict(os.environ, PYTHONPATH=os.path.join(here, "trainctl", "_rank_boot"))
        env.pop("TRAINCTL_STATUS_FD", None)
        env.pop("TRAINCTL_RANK_BOOTED", None)
        out = subprocess.run([sys.executable, "-c", check], env=env, capture_output=True, timeout=20)
        self.assertEqual(out.stdout.decode().strip(), "['MainThread']")
        # A child of a rank (same environment, another pid): no second sampler.
        env.update(TRAINCTL_STATUS_FD="1", TRAINCTL_RANK_BOOTED="1")
        out = subprocess.run([sys.executable, "-c", check], env=env, capture_output=True, timeout=20)
        self.assertEqual(out.stdout.decode().strip(), "['MainThread']")


if __name__ == "__main__":
    unittest.main()
