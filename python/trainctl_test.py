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


if __name__ == "__main__":
    unittest.main()
