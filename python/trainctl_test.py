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
        # Eval names make an eval point of their own, after the train point.
        self.assertEqual(lines[1:3], ["metric kind=train epoch=0 step=3 loss=1.5",
                                      "metric kind=eval epoch=0 step=3 s.eval/top5=0.5 s.val_f1=0.8"])
        self.assertEqual(warned.count("'bad name' is not a scalar name"), 1)
        self.assertEqual(warned.count("text='x' is not a number"), 1)

    def _lines(self, **kwargs):
        r, w = os.pipe()
        os.environ["TRAINCTL_STATUS_FD"] = str(w)
        self.t._fd = None
        self.assertTrue(self.t.report(**kwargs))
        os.close(w)
        lines = os.read(r, 4096).decode().splitlines()
        os.close(r)
        return lines

    def test_eval_reports_are_eval_points_with_only_what_was_reported(self):
        self.assertEqual(self._lines(step=40, epoch=1, val_f1=0.75, eval_accuracy=0.5),
                         ["progress 1 40", "metric kind=eval epoch=1 step=40 eval_accuracy=0.5 s.val_f1=0.75"])
        # One call with both: a train point and an eval point; the eval point
        # keeps steps_per_epoch (the coordinator orders points by it).
        self.assertEqual(self._lines(step=8, loss=0.5, lr=0.01, steps_per_epoch=4, eval_loss=0.25,
                                     eval_samples=10, valid=1.0),
                         ["progress 0 8",
                          "metric kind=train epoch=0 step=8 loss=0.5 steps_per_epoch=4 lr=0.01 s.valid=1.0",
                          "metric kind=eval epoch=0 step=8 steps_per_epoch=4 eval_loss=0.25 eval_samples=10"])
        # kind="eval": loss is the eval loss; custom names of any form go with it.
        self.assertEqual(self._lines(step=9, kind="eval", loss=0.3, f1=0.9),
                         ["progress 0 9", "metric kind=eval epoch=0 step=9 eval_loss=0.3 s.f1=0.9"])
        # kind="train": everything in one train point, as before.
        self.assertEqual(self._lines(step=2, kind="train", loss=1.0, val_f1=0.5),
                         ["progress 0 2", "metric kind=train epoch=0 step=2 loss=1.0 s.val_f1=0.5"])
        # A bare step is a train point with nothing in it (a heartbeat).
        self.assertEqual(self._lines(step=3), ["progress 0 3", "metric kind=train epoch=0 step=3"])

    def test_eval_report_refuses_what_is_not_an_evaluation(self):
        with self.assertRaisesRegex(ValueError, "kind must be 'train' or 'eval', not 'test'"):
            self.t.report(step=1, kind="test")
        with self.assertRaisesRegex(ValueError, "loss or eval_loss, not both"):
            self.t.report(step=1, kind="eval", loss=0.1, eval_loss=0.2)
        import io
        err, sys.stderr = sys.stderr, io.StringIO()
        try:
            lines = self._lines(step=4, kind="eval", lr=0.1, eval_accuracy=0.5)
            warned = sys.stderr.getvalue()
        finally:
            sys.stderr = err
        self.assertEqual(lines[1], "metric kind=eval epoch=0 step=4 eval_accuracy=0.5")
        self.assertIn("lr is a training field: not reported with kind='eval'", warned)

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


def _engine_layout_class():
    import torch

    class Named(torch.nn.Module):
        names: str

        def __init__(self, tensors, names):
            super().__init__()
            for i, t in enumerate(tensors):
                self.register_parameter("t%d" % i, torch.nn.Parameter(t))
            self.names = names

        def forward(self):
            return 0

    class EngineLayout(torch.nn.Module):
        format_version: int

        def __init__(self, net):
            super().__init__()
            sd = net.state_dict()
            self.params = Named([v.clone() for v in sd.values()], "\n".join(sd.keys()))
            self.format_version = 2

        def forward(self):
            return 0
    return EngineLayout


def _EngineLayout(net):
    return _engine_layout_class()(net)


class CheckpointTest(unittest.TestCase):
    """save_checkpoint/save_model write files the worker accepts and the
    status lines that record them; load_checkpoint reads the worker's
    TRAINCTL_RESUME_* variables."""

    def setUp(self):
        import tempfile
        import trainctl
        self.t = trainctl
        self.t._fd = None
        self.t._broken = False
        self.dir = tempfile.mkdtemp()
        self.r, self.w = os.pipe()
        self.env = dict(os.environ)
        os.environ.update({"TRAINCTL_STATUS_FD": str(self.w), "TRAINCTL_CHECKPOINT_DIR": self.dir,
                           "TRAINCTL_JOB_ID": "job-1", "RANK": "0"})
        for k in ("TRAINCTL_RESUME_FROM", "TRAINCTL_RESUME_EPOCH", "TRAINCTL_RESUME_STEP"):
            os.environ.pop(k, None)

    def tearDown(self):
        import shutil
        os.environ.clear()
        os.environ.update(self.env)
        os.close(self.r)
        try:
            os.close(self.w)
        except OSError:
            pass
        shutil.rmtree(self.dir)

    def lines(self):
        os.close(self.w)
        return os.read(self.r, 65536).decode().splitlines()

    def test_save_checkpoint_writes_a_job_named_file_and_its_record(self):
        import zlib
        path = self.t.save_checkpoint(b"state", step=120, epoch=2)
        self.assertEqual(path, os.path.join(self.dir, "job-1.ckpt-epoch-000002-0000000120.pt"))
        with open(path, "rb") as f:
            self.assertEqual(f.read(), b"state")
        crc = "crc32:%08x" % (zlib.crc32(b"state") & 0xFFFFFFFF)
        self.assertEqual(self.lines(), ["checkpoint 2 120 5 %s 0 %s" % (crc, path)])
        self.assertEqual(sorted(os.listdir(self.dir)), ["job-1.ckpt-epoch-000002-0000000120.pt"],
                         "no temporary file is left")

    def test_save_checkpoint_copies_a_file_and_saves_objects_with_torch(self):
        src = os.path.join(self.dir, "mine.pt")
        with open(src, "wb") as f:
            f.write(b"x" * 3000000)
        path = self.t.save_checkpoint(src, step=1)
        self.assertEqual(os.path.getsize(path), 3000000)
        import torch
        path = self.t.save_checkpoint({"w": torch.ones(2)}, step=2, epoch=1)
        self.assertTrue(torch.equal(torch.load(path)["w"], torch.ones(2)))
        lines = self.lines()
        self.assertTrue(lines[0].startswith("checkpoint 0 1 3000000 crc32:"), lines[0])
        self.assertTrue(lines[1].startswith("checkpoint 1 2 "), lines[1])

    def test_saved_files_follow_the_umask(self):
        # Issue #45 item 5: under the 077 a worker daemon and `trainctl run`
        # give ranks, a saved checkpoint is 0600 (it used to be forced 0644);
        # under 022, what any new file gets.
        import stat
        old = os.umask(0o077)
        try:
            private = self.t.save_checkpoint(b"s", step=1)
            os.umask(0o022)
            shared = self.t.save_model(b"m")
        finally:
            os.umask(old)
        self.assertEqual(stat.S_IMODE(os.stat(private).st_mode), 0o600)
        self.assertEqual(stat.S_IMODE(os.stat(shared).st_mode), 0o644)

    def test_only_rank_0_saves(self):
        os.environ["RANK"] = "1"
        self.assertIsNone(self.t.save_checkpoint(b"s", step=1))
        self.assertIsNone(self.t.save_model(b"m"))
        self.assertEqual(os.listdir(self.dir), [])
        self.assertEqual(self.lines(), [])

    def test_bad_step_is_refused(self):
        with self.assertRaises(ValueError):
            self.t.save_checkpoint(b"s", step=0)

    def test_save_model_writes_the_final_model_and_its_line(self):
        path = self.t.save_model(b"model")
        self.assertEqual(path, os.path.join(self.dir, "job-1.model.pt"))
        self.assertEqual(self.lines(), ["model " + path])

    def test_load_checkpoint_follows_the_resume_variables(self):
        self.assertIsNone(self.t.load_checkpoint())
        path = self.t.save_checkpoint(b"s", step=40, epoch=4)
        os.environ.update({"TRAINCTL_RESUME_FROM": path, "TRAINCTL_RESUME_EPOCH": "4",
                           "TRAINCTL_RESUME_STEP": "40"})
        c = self.t.load_checkpoint()
        self.assertEqual((c.path, c.epoch, c.step), (path, 4, 40))
        os.environ["TRAINCTL_RESUME_FROM"] = os.path.join(self.dir, "elsewhere.pt")
        self.assertIsNone(self.t.load_checkpoint(), "no copy on this host")

    def test_load_state_dict_of_torch_save_files(self):
        import torch
        net = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
        for i, obj in enumerate((net.state_dict(), net, {"model": net.state_dict(), "step": 3})):
            path = os.path.join(self.dir, "f%d.pt" % i)
            torch.save(obj, path)
            fresh = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
            fresh.load_state_dict(self.t.load_state_dict(path))
            self.assertTrue(torch.equal(fresh[0].weight, net[0].weight))

    def test_load_state_dict_of_an_engine_checkpoints_layout(self):
        # worker/trainer/checkpoint.cc: submodule "params" with tensors
        # t0..tN and their names, one a line, in the string "names".
        import torch
        net = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU(), torch.nn.Linear(2, 1))
        path = os.path.join(self.dir, "job-1.ckpt-epoch-000001.pt")
        torch.jit.script(_EngineLayout(net)).save(path)
        fresh = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU(), torch.nn.Linear(2, 1))
        state = self.t.load_state_dict(path)
        self.assertEqual(list(state), ["0.weight", "0.bias", "2.weight", "2.bias"])
        fresh.load_state_dict(state)
        self.assertTrue(torch.equal(fresh[2].weight, net[2].weight))

    def test_load_state_dict_of_a_torchscript_model_maps_flat_names_back(self):
        import torch
        net = torch.nn.Sequential(torch.nn.Linear(3, 2))

        class Flat(torch.nn.Module):  # the engine's export: '.' as '_'
            def __init__(self):
                super().__init__()
                self.register_parameter("0_weight", torch.nn.Parameter(net[0].weight.detach().clone()))
                self.register_parameter("0_bias", torch.nn.Parameter(net[0].bias.detach().clone()))

            def forward(self, x):
                return x
        path = os.path.join(self.dir, "job-1.model.pt")
        torch.jit.script(Flat()).save(path)
        fresh = torch.nn.Sequential(torch.nn.Linear(3, 2))
        fresh.load_state_dict(self.t.load_state_dict(path, fresh))
        self.assertTrue(torch.equal(fresh[0].weight, net[0].weight))

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
