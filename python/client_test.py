"""End-to-end test of the Python client (trainctl.client) against a real
trainctl-coordinator and a real trainctl-worker on loopback, started from
the build directory in $TRAINCTL_BUILD_DIR (default: <repo>/build) with the
flags tests/support/cluster.cc uses, in a temporary directory, on ports the
kernel chooses.

    TRAINCTL_BUILD_DIR=build TRAINCTL_PYTHON_STUBS=DIR /usr/bin/python3 python/client_test.py

Without $TRAINCTL_PYTHON_STUBS (and no installed trainctl.v1), the stubs are
generated into the temporary directory with python/gen_stubs.sh. Every wait
is bounded; the daemons are stopped when the test ends, also when it fails
(and, through setpriv --pdeathsig where there is one, when it is killed).
"""
import datetime
import glob
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

EXAMPLE = os.path.join(REPO, "examples", "mlp-synthetic.yaml")
# The whole test's work: the cluster's files, the stubs, fetched files.
WORK = tempfile.mkdtemp(prefix="trainctl_pyclient_")


def _ensure_stubs():
    """Generates the stubs into WORK unless they can be imported already."""
    if os.environ.get("TRAINCTL_PYTHON_STUBS"):
        return
    try:
        import trainctl.v1.job_pb2  # noqa: F401  (installed beside the package)
        return
    except ImportError:
        pass
    out = os.path.join(WORK, "stubs")
    subprocess.run([os.path.join(HERE, "gen_stubs.sh"), out], check=True, timeout=60)
    import trainctl
    trainctl.__path__.append(os.path.join(out, "trainctl"))
    os.environ["TRAINCTL_PYTHON_STUBS"] = out  # for the docs' example, run as a program


_ensure_stubs()

import grpc  # noqa: E402
from trainctl import codepack  # noqa: E402
from trainctl.client import Client, FailureKind, Job, JobState, TrainctlError, script_job_spec  # noqa: E402
from trainctl.v1 import auth_pb2, auth_pb2_grpc, job_pb2, job_service_pb2, job_service_pb2_grpc  # noqa: E402
from trainctl.v1 import metrics_pb2, worker_service_pb2, worker_service_pb2_grpc  # noqa: E402

# Bounds for every wait (generous: a loaded 2-core machine).
START_TIMEOUT_S = 30
JOB_TIMEOUT_S = 60


def _build_dir():
    return os.path.abspath(os.environ.get("TRAINCTL_BUILD_DIR") or os.path.join(REPO, "build"))


def _wait_for_binary(path, timeout=START_TIMEOUT_S):
    """Waits while the binary is missing or being replaced by a build."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if os.access(path, os.X_OK) and os.path.getsize(path) > 0:
                return path
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError("%s: missing (set TRAINCTL_BUILD_DIR to a trainctl build directory)" % path)
        time.sleep(0.5)


class Cluster:
    """A coordinator and worker daemons as child processes (tests/support/cluster.cc)."""

    def __init__(self, build_dir, directory):
        self.build_dir = build_dir
        self.dir = directory
        self.coordinator = None
        self.workers = {}
        self.address = None
        self.admin_token = None
        self._channel = None
        self._starts = 0
        self.tls_dir = None

    def _spawn(self, argv, log_name):
        # A test that dies takes its cluster with it.
        prefix = ["setpriv", "--pdeathsig", "KILL", "--"] if shutil.which("setpriv") else []
        deadline = time.monotonic() + START_TIMEOUT_S
        with open(os.path.join(self.dir, log_name), "ab") as log:
            while True:
                _wait_for_binary(argv[0])
                try:
                    return subprocess.Popen(prefix + argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
                except OSError:  # ETXTBSY: a build is writing the binary right now.
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)

    def log(self, name):
        with open(os.path.join(self.dir, name), errors="replace") as f:
            return f.read()

    def start_coordinator(self):
        """Starts the coordinator; again: on the same port and database."""
        argv = [os.path.join(self.build_dir, "coordinator", "trainctl-coordinator"),
                "--listen=" + (self.address or "127.0.0.1:0"), "--db=%s/state.db" % self.dir,
                "--heartbeat_interval_ms=200", "--lease_timeout_ms=1500", "--stop_grace_s=2",
                "--admin_token_file=%s/admin.token" % self.dir]
        if self.tls_dir:
            argv.append("--tls_dir=" + self.tls_dir)
        log = "coordinator-%d.log" % self._starts
        self._starts += 1
        self.coordinator = self._spawn(argv, log)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            text = self.log(log)
            pos = text.find("listening on ")
            if pos >= 0 and "\n" in text[pos:]:
                self.address = text[pos + len("listening on "):].split("\n", 1)[0].strip()
                with open(os.path.join(self.dir, "admin.token")) as f:
                    self.admin_token = f.readline().strip()
                if self._channel is None and self.tls_dir:
                    with open(os.path.join(self.tls_dir, "ca.crt"), "rb") as f:
                        creds = grpc.ssl_channel_credentials(f.read())
                    self._channel = grpc.secure_channel(self.address, creds)
                elif self._channel is None:
                    self._channel = grpc.insecure_channel(self.address)
                return
            if self.coordinator.poll() is not None:
                raise AssertionError("the coordinator exited:\n" + text)
            time.sleep(0.05)
        raise AssertionError("the coordinator did not listen within %ds:\n%s" % (START_TIMEOUT_S, text))

    def init_tls(self):
        """``trainctl-coordinator init``: a CA, the coordinator's certificate
        and key; from then on the coordinator serves TLS."""
        coordinator = _wait_for_binary(os.path.join(self.build_dir, "coordinator", "trainctl-coordinator"))
        with open(os.path.join(self.dir, "init.log"), "wb") as log:
            subprocess.run([coordinator, "init", "--dir=%s/tls" % self.dir, "--db=%s/state.db" % self.dir],
                           stdout=log, stderr=log, check=True, timeout=START_TIMEOUT_S)
        self.tls_dir = os.path.join(self.dir, "tls")

    def kill_coordinator(self):
        self.coordinator.kill()
        self.coordinator.wait(10)

    def _admin(self):
        return (("authorization", "Bearer " + self.admin_token),)

    def create_token(self, role, name):
        """A new token's secret, created with the admin token."""
        stub = auth_pb2_grpc.AuthServiceStub(self._channel)
        resp = stub.CreateToken(auth_pb2.CreateTokenRequest(role=role, name=name), timeout=10,
                                metadata=self._admin())
        return resp.secret

    def start_worker(self, name, slots, extra=()):
        token_file = os.path.join(self.dir, "worker-%s.token" % name)
        fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.create_token(auth_pb2.ROLE_WORKER, "worker-" + name) + "\n")
        rank_binary = _wait_for_binary(os.path.join(self.build_dir, "worker", "trainer", "trainctl-rank"))
        argv = [os.path.join(self.build_dir, "worker", "daemon", "trainctl-worker"),
                "--coordinator=" + self.address, "--slots=%d" % slots,
                "--work_dir=%s/worker-%s" % (self.dir, name), "--address=127.0.0.1",
                "--rank_binary=" + rank_binary, "--rank_timeout_s=20", "--stop_grace_s=2",
                "--token_file=" + token_file] + list(extra)
        self.workers[name] = self._spawn(argv, "worker-%s.log" % name)

    def wait_workers(self, n):
        stub = worker_service_pb2_grpc.WorkerServiceStub(self._channel)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                resp = stub.ListWorkers(worker_service_pb2.ListWorkersRequest(), timeout=2, metadata=self._admin())
                if len(resp.workers) >= n:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.05)
        raise AssertionError("%d worker(s) did not register within %ds" % (n, START_TIMEOUT_S))

    def stop(self):
        """SIGTERM (the workers stop their ranks), then SIGKILL; always reaps."""
        if self._channel is not None:
            self._channel.close()
        for proc, grace in [(w, 10) for w in self.workers.values()] + [(self.coordinator, 5)]:
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def logs_tail(self):
        out = []
        for path in sorted(glob.glob(os.path.join(self.dir, "*.log"))):
            with open(path, errors="replace") as f:
                out.append("--- %s\n%s" % (os.path.basename(path), "".join(f.readlines()[-30:])))
        return "\n".join(out)


class ClusterTestCase(unittest.TestCase):
    """A test with ``self.cluster``: on failure, the daemons' last lines say why."""

    def run(self, result=None):
        failures = len(result.failures) + len(result.errors) if result else 0
        out = super().run(result)
        cluster = getattr(self, "cluster", None)
        if cluster is not None and result and len(result.failures) + len(result.errors) > failures:
            sys.stderr.write(cluster.logs_tail() + "\n")
        return out


class ClientTest(ClusterTestCase):
    """Every call of trainctl.client against one cluster: a coordinator and a
    worker with two CPU slots that runs command jobs."""

    @classmethod
    def setUpClass(cls):
        cls.cluster = Cluster(_build_dir(), os.path.join(WORK, "cluster"))
        os.mkdir(cls.cluster.dir)
        try:
            cls.cluster.start_coordinator()
            cls.cluster.start_worker("a", slots=2, extra=["--allow_commands"])
            cls.cluster.wait_workers(1)
            cls.client = Client(cls.cluster.address, token=cls.cluster.admin_token)
        except BaseException:
            cls.cluster.stop()
            raise

    @classmethod
    def tearDownClass(cls):
        if hasattr(cls, "client"):
            cls.client.close()
        cls.cluster.stop()

    def wait_state(self, job, states, timeout=JOB_TIMEOUT_S):
        """Polls until the job is in one of ``states``; returns it."""
        deadline = time.monotonic() + timeout
        while True:
            got = self.client.get(job)
            if got.state in states or time.monotonic() > deadline:
                return got
            time.sleep(0.1)

    def test_submit_watch_metrics_fetch(self):
        job = self.client.submit(EXAMPLE, **{"training.epochs": 1, "name": "py-train", "world_size": "2"})
        self.assertTrue(job.id.startswith("py-train-"), job.id)
        self.assertEqual(job.state, job_pb2.JOB_STATE_PENDING)
        self.assertEqual(job.spec.training.epochs, 1)  # the override, not the file's 3
        self.assertEqual(job.spec.model.mlp.input_dim, 5)
        self.assertEqual(len(job.request_id), 32)

        events, snapshots, points = [], [], 0
        for update in self.client.watch(job, timeout=JOB_TIMEOUT_S):
            kind = update.WhichOneof("update")
            if kind == "event":
                events.append(update.event)
            elif kind == "job":
                snapshots.append(update.job.state)
            elif kind == "metrics":
                points += len(update.metrics.points)
        final = self.client.get(job)
        self.assertEqual(final.state, job_pb2.JOB_STATE_SUCCEEDED, final.state_reason)
        self.assertEqual(snapshots[-1], job_pb2.JOB_STATE_SUCCEEDED)
        self.assertEqual([e.seq for e in events], list(range(1, len(events) + 1)))
        self.assertEqual(events[0].type, "submitted")
        self.assertGreater(points, 0)

        batches = self.client.metrics(job)
        self.assertTrue(batches and all(b.attempt == 1 for b in batches))
        self.assertTrue(any(p.loss > 0 for b in batches for p in b.points))
        self.assertEqual(self.client.metrics(job, rank=1, kind="train")[0].points[0].rank, 1)

        out = os.path.join(WORK, "model.pt")
        got = self.client.fetch(job, path=out)
        with open(out, "rb") as f:
            data = f.read()
        self.assertGreater(len(data), 0)
        self.assertEqual(got.size, len(data))
        self.assertEqual(got.path, out)
        self.assertTrue(got.checksum.startswith("crc32:"))
        self.assertEqual(stat.S_IMODE(os.stat(out).st_mode), 0o600)
        with self.assertRaises(TrainctlError) as refused:
            self.client.fetch(job, path=out)
        self.assertEqual(refused.exception.code, grpc.StatusCode.ALREADY_EXISTS)
        self.assertEqual(os.listdir(WORK).count("model.pt"), 1)
        self.assertEqual(self.client.fetch(job, path=out, force=True).size, len(data))
        self.assertEqual([n for n in os.listdir(WORK) if ".tmp." in n], [])

        # A checkpoint, by its global step.
        record = final.checkpoints[-1]
        ckpt = self.client.fetch(job.id, step=record.global_step, path=os.path.join(WORK, "ckpt.pt"))
        self.assertEqual((ckpt.size, ckpt.checksum), (record.size_bytes, record.checksum))
        self.assertEqual(os.path.getsize(ckpt.path), record.size_bytes)
        with self.assertRaises(TrainctlError) as missing:
            self.client.fetch(job, step=10 ** 9, path=os.path.join(WORK, "none.pt"))
        self.assertEqual(missing.exception.code, grpc.StatusCode.NOT_FOUND)
        self.assertFalse(os.path.exists(os.path.join(WORK, "none.pt")))

        lines = [line.text for chunk in self.client.logs(job, rank=0) for line in chunk.lines]
        self.assertTrue(lines)

        resumed = self.client.resume(job.id, **{"training.epochs": 2})
        self.assertNotEqual(resumed.id, job.id)
        self.assertEqual(resumed.spec.resume_from.job, job.id)
        self.assertEqual(resumed.spec.training.epochs, 2)
        done = self.wait_state(resumed, (job_pb2.JOB_STATE_SUCCEEDED, job_pb2.JOB_STATE_FAILED))
        self.assertEqual(done.state, job_pb2.JOB_STATE_SUCCEEDED, done.state_reason)
        self.assertTrue(done.attempts[0].resumed_from)

    def test_submit_script_wait_logs_metrics(self):
        # docs/python-client.md's first example, on a script of two ranks.
        script_dir = tempfile.mkdtemp(prefix="script-", dir=WORK)
        with open(os.path.join(script_dir, "train_ddp.py"), "w") as f:
            f.write(TRAIN_SCRIPT)
        with open(os.path.join(script_dir, "notes.log"), "w") as f:
            f.write("not shipped")
        with open(os.path.join(script_dir, ".trainctlignore"), "w") as f:
            f.write("*.log\n")
        job = self.client.submit_script("train_ddp.py", nproc_per_node=2, args=["--epochs", 3],
                                        working_dir=script_dir, python=sys.executable, env={"GREETING": "hi"})
        # The code travelled with the job (upload=True, the default): the
        # directory can go at once, and the ranks run their own copy.
        shutil.rmtree(script_dir)
        self.assertIsInstance(job, Job)
        self.assertTrue(job.id.startswith("train-ddp-"), job.id)
        self.assertIs(job.state, JobState.PENDING)
        self.assertEqual(job.world_size, 2)
        self.assertEqual(list(job.spec.command.argv), [sys.executable, "train_ddp.py", "--epochs", "3"])
        self.assertEqual(job.spec.command.working_dir, "")
        self.assertRegex(job.spec.command.code.digest, r"^sha256:[0-9a-f]{64}$")
        self.assertEqual((job.spec.command.code.files, job.spec.command.code.source), (2, script_dir))

        done = self.client.wait(job, timeout=JOB_TIMEOUT_S)
        self.assertIs(done.state, JobState.SUCCEEDED, done.state_reason)
        self.assertEqual("%s" % done.state, "SUCCEEDED")
        self.assertTrue(done.done and done.succeeded)
        self.assertIsNone(done.failure_kind)
        self.assertEqual(len(done.attempts), 1)
        self.assertTrue(done.owner)  # the admin token's name
        self.assertTrue(done.submitted <= done.started <= done.finished, (done.submitted, done.finished))
        self.assertLess(abs(datetime.datetime.now(datetime.timezone.utc) - done.finished).total_seconds(), 600)
        # Waiting on a job that ended returns it at once.
        self.assertEqual(self.client.wait(done.id, timeout=JOB_TIMEOUT_S).id, job.id)

        lines = [(line.rank, line.text) for line in self.client.log_lines(job)]
        for rank in (0, 1):
            self.assertIn((rank, "rank %d of 2: ['--epochs', '3'] GREETING=hi" % rank), lines)
        self.assertIn((1, "done"), lines)
        followed = [line.text for line in self.client.log_lines(job, rank=1, follow=True)]  # ends with the job
        self.assertEqual(followed[-1], "done")
        points = list(self.client.metric_points(job))
        self.assertEqual(sorted({(p.rank, p.step) for p in points}), [(r, s) for r in (0, 1) for s in (1, 2, 3)])
        train = list(self.client.metric_points(job, rank=0, kind="train"))
        self.assertEqual([(p.step, p.loss, dict(p.scalars)) for p in train],
                         [(1, 1.0, {}), (2, 0.5, {}), (3, 0.25, {})])
        self.assertTrue(all(p.kind == metrics_pb2.MetricPoint.KIND_TRAIN for p in train))
        # report(val_f1=...) is an eval report: its own kind, no loss invented.
        evals = list(self.client.metric_points(job, rank=0, kind="eval"))
        self.assertEqual([(p.step, dict(p.scalars), p.HasField("loss")) for p in evals],
                         [(3, {"val_f1": 0.75}, False)])
        self.assertTrue(all(p.kind == metrics_pb2.MetricPoint.KIND_EVAL for p in evals))
        self.assertEqual([p.scalars["val_f1"] for p in points if "val_f1" in p.scalars], [0.75, 0.75])
        self.assertEqual(sum(len(b.points) for b in self.client.metrics(job)), len(points))

    def test_docs_first_example(self):
        # docs/python-client.md's first example, as written, as a program in
        # a directory holding train.py; the CLI's settings come from the
        # environment.
        with open(os.path.join(REPO, "docs", "python-client.md")) as f:
            doc = f.read()
        example = doc.split("```python\n", 1)[1].split("```", 1)[0]
        self.assertLessEqual(len(example.strip().splitlines()), 5, example)
        script_dir = tempfile.mkdtemp(prefix="docs-", dir=WORK)
        with open(os.path.join(script_dir, "train.py"), "w") as f:
            f.write(TRAIN_SCRIPT)
        env = dict(os.environ, TRAINCTL_COORDINATOR=self.cluster.address, TRAINCTL_TOKEN=self.cluster.admin_token,
                   PYTHONPATH=HERE)
        if env.get("TRAINCTL_PYTHON_STUBS"):  # the program runs in another directory
            env["TRAINCTL_PYTHON_STUBS"] = os.path.abspath(env["TRAINCTL_PYTHON_STUBS"])
        out = subprocess.run([sys.executable, "-c", example], cwd=script_dir, env=env, capture_output=True,
                             text=True, timeout=JOB_TIMEOUT_S)
        self.assertEqual(out.returncode, 0, out.stderr)
        lines = out.stdout.splitlines()
        self.assertEqual(lines[0], "SUCCEEDED", out.stdout)
        self.assertIn("1 3 0.25", lines[1:])  # rank step loss

    def test_submit_script_sends_the_cli_spec(self):
        # The spec trainctl submit builds for a script, as the coordinator
        # resolves it (a dry run of each): the same one, defaults included
        # (restarts: torchrun's 0).
        script_dir = tempfile.mkdtemp(prefix="cli-", dir=WORK)
        cli = _wait_for_binary(os.path.join(self.cluster.build_dir, "client", "trainctl"))
        out = subprocess.run(
            [cli, "--coordinator", self.cluster.address, "--token", self.cluster.admin_token, "-o", "json", "submit",
             "--dry-run", "--nproc-per-node", "2", "--set", "resources.memory=256Mi",
             "--set", "restart.on_hang=fail", "--python", "/usr/bin/python3", "train.py", "--lr", "0.1", "a b"],
            cwd=script_dir, capture_output=True, text=True, timeout=START_TIMEOUT_S)
        self.assertEqual(out.returncode, 0, out.stderr)
        cli_spec = job_pb2.JobSpec()
        from google.protobuf import json_format
        json_format.ParseDict(json.loads(out.stdout)["job"]["spec"], cli_spec)

        spec = script_job_spec("train.py", ["--lr", 0.1, "a b"], nproc_per_node=2, memory="256Mi",
                               python="/usr/bin/python3", working_dir=script_dir,
                               overrides={"restart.on_hang": "fail"})
        resolved = self.client._unary("SubmitJob", job_service_pb2.SubmitJobRequest(spec=spec, dry_run=True)).job
        self.assertEqual(resolved.spec, cli_spec)
        self.assertEqual(resolved.spec.resources.memory, 256 << 20)
        self.assertEqual(resolved.spec.name, "train")
        self.assertTrue(resolved.spec.restart.HasField("max_restarts"))
        self.assertEqual(resolved.spec.restart.max_restarts, 0)

    def test_upload_code_is_the_cli_archive_and_stored_once(self):
        # One tree through `trainctl submit SCRIPT` (the C++ packer and
        # upload) and through trainctl.codepack: the same files, byte for
        # byte the same archive (the same digest), so the Python upload
        # finds it stored.
        src = tempfile.mkdtemp(prefix="code-", dir=WORK)
        files = {"train.py": "print('shipped')\n", ".gitignore": "*.log\n!keep.log\nbuild/\n/top.txt\n",
                 "keep.log": "k", "drop.log": "d", "build/out.o": "o", "top.txt": "t", "sub/top.txt": "s",
                 "sub/.gitignore": "*.tmp\n", "sub/a.tmp": "", "m.pyc": "c", "__pycache__/m.pyc": "c",
                 ".git/HEAD": "ref", ".trainctlignore": "data/\n", "data/big.bin": "b" * 5000,
                 "pkg/deep/mod.py": "x = 1\n"}
        for rel, text in files.items():
            os.makedirs(os.path.dirname(os.path.join(src, rel)), exist_ok=True)
            with open(os.path.join(src, rel), "w") as f:
                f.write(text)
        os.symlink("pkg/deep/mod.py", os.path.join(src, "link.py"))
        cli = _wait_for_binary(os.path.join(self.cluster.build_dir, "client", "trainctl"))
        out = subprocess.run(
            [cli, "--coordinator", self.cluster.address, "--token", self.cluster.admin_token, "-o", "json", "submit",
             "--python", sys.executable, "train.py"], cwd=src, capture_output=True, text=True, timeout=START_TIMEOUT_S)
        self.assertEqual(out.returncode, 0, out.stderr)
        doc = json.loads(out.stdout)
        cli_job = job_pb2.Job()
        from google.protobuf import json_format
        json_format.ParseDict(doc.get("job", doc), cli_job, ignore_unknown_fields=True)
        cli_code = cli_job.spec.command.code
        self.assertRegex(cli_code.digest, r"^sha256:[0-9a-f]{64}$")

        packed = codepack.pack_directory(src, os.path.join(WORK, "py-code.tar"))
        names = subprocess.run(["tar", "tf", packed.path], capture_output=True, text=True, check=True).stdout
        self.assertEqual(names.splitlines(), [".gitignore", ".trainctlignore", "keep.log", "link.py", "pkg/",
                                              "pkg/deep/", "pkg/deep/mod.py", "sub/", "sub/.gitignore",
                                              "sub/top.txt", "train.py"])
        self.assertEqual((packed.digest, packed.size_bytes, packed.files),
                         (cli_code.digest, cli_code.size_bytes, cli_code.files))
        code = job_pb2.CodePackage(digest=packed.digest, size_bytes=packed.size_bytes, files=packed.files)
        self.assertTrue(self.client.upload_archive(packed.path, code))  # already stored
        self.assertEqual(self.client.upload_code(src).digest, cli_code.digest)
        self.assertEqual(self.client.wait(cli_job.id, timeout=JOB_TIMEOUT_S).state, JobState.SUCCEEDED)

        # New code, in three 1 MiB pieces: stored by this upload, then
        # already there.
        with open(os.path.join(src, "train.py"), "a") as f:
            f.write("# changed\n")
        with open(os.path.join(src, "weights.bin"), "wb") as f:
            f.write(os.urandom(5 << 19))
        os.unlink(packed.path)
        packed = codepack.pack_directory(src, packed.path)
        self.assertNotEqual(packed.digest, cli_code.digest)
        self.assertGreater(packed.size_bytes, 2 << 20)
        code = job_pb2.CodePackage(digest=packed.digest, size_bytes=packed.size_bytes, files=packed.files)
        self.assertFalse(self.client.upload_archive(packed.path, code))
        self.assertTrue(self.client.upload_archive(packed.path, code))
        bad = job_pb2.CodePackage(digest="sha256:" + "0" * 64, size_bytes=packed.size_bytes)
        with self.assertRaises(TrainctlError) as cm:
            self.client.upload_archive(packed.path, bad)
        self.assertEqual(cm.exception.code, grpc.StatusCode.DATA_LOSS, cm.exception)

    def test_submit_script_refuses_before_any_call_and_upload_false_keeps_the_path(self):
        src = tempfile.mkdtemp(prefix="refuse-", dir=WORK)
        with open(os.path.join(src, "train.py"), "w") as f:
            f.write("print('x')\n")
        os.symlink("/etc/hostname", os.path.join(src, "escape"))
        before = len(self.client.list())
        with self.assertRaises(ValueError) as cm:
            self.client.submit_script("train.py", working_dir=src, python=sys.executable)
        self.assertIn(src + "/escape -> /etc/hostname", str(cm.exception))
        self.assertIn("outside", str(cm.exception))
        self.assertEqual(len(self.client.list()), before)

        # upload=False: the ranks start in the directory itself (shared).
        job = self.client.submit_script("train.py", working_dir=src, upload=False, python=sys.executable)
        self.assertEqual(job.spec.command.working_dir, src)
        self.assertFalse(job.spec.command.HasField("code"))
        self.assertEqual(self.client.wait(job, timeout=JOB_TIMEOUT_S).state, JobState.SUCCEEDED)

    def test_wait_times_out(self):
        # Too large for the cluster: it stays PENDING.
        job = self.client.submit(EXAMPLE, name="py-wait", world_size=4, **{"scheduling.wait_for_capacity": True})
        pending = self.client.list(states=[JobState.PENDING])
        self.assertIn(job.id, [j.id for j in pending])
        self.assertTrue(all(isinstance(j, Job) and j.state is JobState.PENDING for j in pending))
        started = time.monotonic()
        with self.assertRaises(TimeoutError) as timed_out:
            self.client.wait(job, timeout=1.5)
        self.assertGreaterEqual(time.monotonic() - started, 1.4)
        self.assertLess(time.monotonic() - started, 1.5 + 10)
        e = timed_out.exception
        self.assertIsInstance(e, TrainctlError)
        self.assertEqual(e.code, grpc.StatusCode.DEADLINE_EXCEEDED)
        self.assertIn("job %s did not end within 1.5s: it is PENDING" % job.id, str(e))
        self.assertIs(e.job.state, JobState.PENDING)
        self.client.cancel(job, reason="wait test")
        ended = self.client.wait("py-wait", timeout=JOB_TIMEOUT_S)
        self.assertIs(ended.state, JobState.CANCELLED)
        self.assertIs(ended.failure_kind, None)  # never placed: no attempt
        with self.assertRaises(TrainctlError) as bad:
            self.client.wait(job, timeout=-1)
        self.assertEqual(bad.exception.code, grpc.StatusCode.INVALID_ARGUMENT)

    def test_viewer_may_read_but_not_submit(self):
        secret = self.cluster.create_token(auth_pb2.ROLE_VIEWER, "py-viewer")
        with Client(self.cluster.address, token=secret) as viewer:
            self.assertIsInstance(viewer.list(), list)
            with self.assertRaises(TrainctlError) as denied:
                viewer.submit(EXAMPLE, name="py-denied")
            self.assertEqual(denied.exception.code, grpc.StatusCode.PERMISSION_DENIED)
            self.assertTrue(denied.exception.message)
        with Client(self.cluster.address, token="t-bogus") as stranger:
            with self.assertRaises(TrainctlError) as unknown:
                stranger.list()
            self.assertEqual(unknown.exception.code, grpc.StatusCode.UNAUTHENTICATED)

    def test_job_references(self):
        # Too large for the cluster's two slots: refused, unless it may wait
        # for capacity; then it stays PENDING and runs nothing.
        with self.assertRaises(TrainctlError) as refused:
            self.client.submit(EXAMPLE, name="py-ref", world_size=4)
        self.assertEqual(refused.exception.code, grpc.StatusCode.FAILED_PRECONDITION)
        self.assertIn("needs 4 cpu slots", refused.exception.message)
        waits = {"scheduling.wait_for_capacity": True}
        first = self.client.submit(EXAMPLE, name="py-ref", world_size=4, **waits)
        self.assertEqual(self.client.get("py-ref").id, first.id)
        self.assertEqual(self.client.get(first.id[:-2]).id, first.id)
        self.assertEqual(self.client.get(first).id, first.id)
        # A retried submission (same request_id) gets the first one's job.
        again = self.client.submit(EXAMPLE, name="py-ref", world_size=4, request_id=first.request_id, **waits)
        self.assertEqual(again.id, first.id)

        second = self.client.submit(EXAMPLE, name="py-ref", world_size=4, **waits)
        with self.assertRaises(TrainctlError) as ambiguous:
            self.client.get("py-ref")
        self.assertEqual(ambiguous.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn(second.id + ", " + first.id, ambiguous.exception.message)
        self.assertEqual(self.client.resolve("py-ref", latest=True).id, second.id)

        with self.assertRaises(TrainctlError) as unknown:
            self.client.get("py-no-such-job")
        self.assertEqual(unknown.exception.code, grpc.StatusCode.NOT_FOUND)

        listed = [j.id for j in self.client.list(states=["pending"])]
        self.assertIn(first.id, listed)
        for job in (first, second):
            self.assertEqual(self.client.cancel(job.id, reason="done testing").state, job_pb2.JOB_STATE_CANCELLED)
        with self.assertRaises(TrainctlError) as ended:
            self.client.cancel(first)
        self.assertEqual(ended.exception.code, grpc.StatusCode.FAILED_PRECONDITION)

    def test_invalid_specs(self):
        # Shape errors are found here, with their place, and nothing is sent.
        with self.assertRaises(TrainctlError) as local:
            self.client.submit(EXAMPLE, **{"training.epochs": "three", "model.input_dims": 5})
        self.assertEqual(local.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("override: model.input_dims: unknown key in model; did you mean 'input_dim'?",
                      local.exception.message)
        self.assertIn("training.epochs: must be an integer, got 'three'", local.exception.message)
        # Ranges are the coordinator's.
        with self.assertRaises(TrainctlError) as remote:
            self.client.submit(EXAMPLE, **{"training.optimizer.lr": -1})
        self.assertEqual(remote.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("training.optimizer.lr", remote.exception.message)
        self.assertEqual([j for j in self.client.list() if j.spec.training.optimizer.lr < 0], [])


# The script of test_submit_script_wait_logs_metrics: each rank prints, and
# reports three train windows and one evaluation (trainctl.report).
TRAIN_SCRIPT = """
import os, sys
import trainctl
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
print("rank %d of %d: %s GREETING=%s" % (rank, world, sys.argv[1:], os.environ.get("GREETING")), flush=True)
for step in (1, 2, 3):
    trainctl.report(step=step, epoch=0, loss=1.0 / 2 ** (step - 1), lr=0.1)
trainctl.report(step=3, epoch=0, val_f1=0.75)
print("done", flush=True)
"""


class WatchResumeTest(ClusterTestCase):
    """A watch outlives a coordinator restart: it resumes after the last
    event it delivered, none repeated or lost (after_event_seq)."""

    def setUp(self):
        self.cluster = Cluster(_build_dir(), os.path.join(WORK, "restart"))
        os.mkdir(self.cluster.dir)
        self.addCleanup(self.cluster.stop)
        self.cluster.start_coordinator()
        self.client = Client(self.cluster.address, token=self.cluster.admin_token)
        self.addCleanup(self.client.close)

    def test_watch_resumes_after_restart(self):
        job = self.client.submit(EXAMPLE, name="py-watch")  # no worker: it stays PENDING
        updates = self.client.watch(job, timeout=JOB_TIMEOUT_S)
        seqs = []
        for update in updates:  # the stored history, then the first snapshot
            if update.HasField("event"):
                seqs.append(update.event.seq)
            if update.HasField("job"):
                break
        self.assertEqual(seqs, [1])

        self.cluster.kill_coordinator()
        self.cluster.start_coordinator()
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:  # the client's channel reconnects by itself
            try:
                self.client.cancel(job, reason="restart test")
                break
            except TrainctlError as e:
                if e.code != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

        types, last = [], None
        for update in updates:
            if update.HasField("event"):
                seqs.append(update.event.seq)
                types.append(update.event.type)
            if update.HasField("job"):
                last = update.job.state
        self.assertEqual(seqs, list(range(1, len(seqs) + 1)))
        self.assertIn("cancelled", types)
        self.assertEqual(last, job_pb2.JOB_STATE_CANCELLED)


class StreamResumeTest(ClusterTestCase):
    """A fetch and logs(follow=True) outlive a coordinator restart: the fetch
    goes on at the next byte (FetchArtifactRequest.offset), every byte once,
    the whole checked; the log lines come once each, in order
    (GetLogsRequest.after_seq)."""

    def setUp(self):
        self.cluster = Cluster(_build_dir(), tempfile.mkdtemp(prefix="restart-", dir=WORK))
        self.addCleanup(self.cluster.stop)
        self.cluster.start_coordinator()
        self.cluster.start_worker("a", slots=1, extra=["--allow_commands"])
        self.cluster.wait_workers(1)
        self.client = Client(self.cluster.address, token=self.cluster.admin_token)
        self.addCleanup(self.client.close)

    def test_fetch_resumes_after_restart(self):
        job = self.client.submit(EXAMPLE, **{"training.epochs": 1, "name": "py-fetch", "world_size": "1"})
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while self.client.get(job).state != job_pb2.JOB_STATE_SUCCEEDED:
            self.assertLess(time.monotonic(), deadline, "the job did not succeed")
            time.sleep(0.2)
        path = self.client.get(job).final_model
        # 64 MiB in place of the model (the same file of the job): more than
        # gRPC lets the coordinator send ahead of a client that holds its
        # first piece, so the restart cuts the file.
        model = os.urandom(64 << 20)
        with open(path, "r+b") as f:
            f.truncate(0)
            f.write(model)

        class Gate:
            """Keeps what it is given; holds the first write until released."""
            def __init__(self):
                self.data, self.first, self.release = [], threading.Event(), threading.Event()

            def write(self, b):
                self.data.append(bytes(b))
                if not self.first.is_set():
                    self.first.set()
                    self.release.wait()

        gate, result = Gate(), {}
        req = job_service_pb2.FetchArtifactRequest(job_id=job.id)

        def fetch():
            try:
                result["head"] = self.client._receive_artifact(req, gate)
            except BaseException as e:  # reported by the test thread
                result["error"] = e

        ended = []
        real_ended = self.client._stream_ended
        with mock.patch.object(self.client, "_stream_ended",
                               side_effect=lambda *a: ended.append(a[2]) or real_ended(*a)):
            fetcher = threading.Thread(target=fetch)
            fetcher.start()
            started = gate.first.wait(START_TIMEOUT_S)
            try:
                if started:
                    self.cluster.kill_coordinator()
                    self.cluster.start_coordinator()
            finally:
                gate.release.set()
                fetcher.join(JOB_TIMEOUT_S)
        self.assertTrue(started, "no first piece: %r" % (result,))
        self.assertFalse(fetcher.is_alive())
        self.assertNotIn("error", result)
        self.assertEqual(result["head"].size, len(model))
        self.assertTrue(b"".join(gate.data) == model, "the fetched bytes differ from the file")
        # One stream broke after delivering; any others (before the worker
        # was back) delivered nothing.
        self.assertEqual(ended.count(True), 1, ended)


    def test_logs_follow_resumes_after_restart(self):
        lines = 150
        spec = tempfile.NamedTemporaryFile("w", suffix=".yaml", dir=WORK, delete=False)
        with spec:
            spec.write("name: py-logs\nworld_size: 1\ndevice: cpu\ncommand:\n  argv: [/bin/sh, -c, "
                       "'i=1; while [ $i -le %d ]; do echo \"line $i\"; i=$((i+1)); sleep 0.04; done']\n" % lines)
        job = self.client.submit(spec.name)
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while self.client.get(job).state != job_pb2.JOB_STATE_RUNNING:
            self.assertLess(time.monotonic(), deadline, "the job did not start")
            time.sleep(0.1)
        got, restarted = [], False
        for chunk in self.client.logs(job, follow=True):
            got.extend(line.text for line in chunk.lines if line.stream == 1)  # STREAM_STDOUT
            if len(got) >= 20 and not restarted:
                self.cluster.kill_coordinator()
                self.cluster.start_coordinator()
                restarted = True
            self.assertLess(time.monotonic(), deadline, "the stream did not end with the job")
        self.assertTrue(restarted, "only %d lines came" % len(got))
        self.assertEqual(got, ["line %d" % i for i in range(1, lines + 1)])


class TlsTest(ClusterTestCase):
    """A TLS coordinator, found through the CLI's config file."""

    def setUp(self):
        self.cluster = Cluster(_build_dir(), os.path.join(WORK, "tls"))
        os.mkdir(self.cluster.dir)
        self.addCleanup(self.cluster.stop)
        self.cluster.init_tls()
        self.cluster.start_coordinator()

    def test_config_file_and_ca(self):
        config_home = os.path.join(self.cluster.dir, "config")
        os.makedirs(os.path.join(config_home, "trainctl"))
        ca = os.path.join(self.cluster.tls_dir, "ca.crt")
        with open(os.path.join(config_home, "trainctl", "config.yaml"), "w") as f:
            f.write('coordinator: "%s"\ntoken: "%s"\nca: %s\n' % (self.cluster.address, self.cluster.admin_token, ca))
        with mock.patch.dict(os.environ, {"XDG_CONFIG_HOME": config_home}):
            for name in ("TRAINCTL_COORDINATOR", "TRAINCTL_ADDRESS", "TRAINCTL_TOKEN", "TRAINCTL_CA"):
                os.environ.pop(name, None)
            with Client() as client:
                self.assertEqual((client.address, client.ca_file), (self.cluster.address, ca))
                job = client.submit(EXAMPLE, name="py-tls")
                self.assertEqual(client.get("py-tls").id, job.id)
        # Without the CA, the TLS port does not answer a plaintext client.
        started = time.monotonic()
        with self.assertRaises(TrainctlError) as plain:
            Client(self.cluster.address, token=self.cluster.admin_token, ca="")
        self.assertEqual(plain.exception.code, grpc.StatusCode.UNAVAILABLE)
        self.assertIn(self.cluster.address, plain.exception.message)
        self.assertLess(time.monotonic() - started, 10)


class EnumTest(unittest.TestCase):
    """trainctl.jobs' enums are the protos', value for value and name for name."""

    def test_enums_match_the_protos(self):
        from trainctl.jobs import AttemptState, RankState
        for ours, theirs, prefix in ((JobState, job_pb2.JobState, "JOB_STATE_"),
                                     (AttemptState, job_pb2.AttemptState, "ATTEMPT_STATE_"),
                                     (RankState, job_pb2.RankState, "RANK_STATE_"),
                                     (FailureKind, job_pb2.FailureKind, "FAILURE_KIND_")):
            proto = {v.name[len(prefix):]: v.number for v in theirs.DESCRIPTOR.values}
            self.assertTrue(all(v.name.startswith(prefix) for v in theirs.DESCRIPTOR.values), prefix)
            self.assertEqual({m.name: m.value for m in ours}, proto, ours.__name__)
        self.assertEqual(JobState.SUCCEEDED, job_pb2.JOB_STATE_SUCCEEDED)
        self.assertEqual(FailureKind.HANG, job_pb2.FAILURE_KIND_HANG)

    def test_names(self):
        self.assertEqual(str(JobState.SUCCEEDED), "SUCCEEDED")
        self.assertEqual("%s/%d/%5s|" % (JobState.FAILED, JobState.FAILED, FailureKind.NAN), "FAILED/6/  NAN|")
        self.assertEqual(f"{JobState.RUNNING} {JobState.RUNNING:d}", "RUNNING 3")
        self.assertIs(JobState.parse("succeeded"), JobState.SUCCEEDED)
        with self.assertRaises(ValueError) as bad:
            JobState.parse("done")
        self.assertIn("one of pending, scheduled", str(bad.exception))
        self.assertTrue(JobState.CANCELLED.terminal and not JobState.RESTARTING.terminal)
        self.assertEqual(JobState.of(99), 99)  # from a newer coordinator

    def test_job_view(self):
        proto = job_pb2.Job(id="j-1", state=job_pb2.JOB_STATE_FAILED, state_reason="rank 1 hung", owner="ann",
                            restarts=1, final_model="")
        proto.spec.name, proto.spec.world_size, proto.spec.queue = "j", 2, "team"
        proto.submit_time.FromSeconds(1700000000)
        proto.attempts.add(number=1, failure_kind=job_pb2.FAILURE_KIND_SIGNAL)
        proto.attempts.add(number=2, failure_kind=job_pb2.FAILURE_KIND_HANG)
        job = Job(proto)
        self.assertEqual((job.id, job.name, job.owner, job.queue, job.world_size, job.restarts),
                         ("j-1", "j", "ann", "team", 2, 1))
        self.assertIs(job.state, JobState.FAILED)
        self.assertIs(job.failure_kind, FailureKind.HANG)
        self.assertTrue(job.done and not job.succeeded)
        self.assertEqual(job.submitted, datetime.datetime(2023, 11, 14, 22, 13, 20, tzinfo=datetime.timezone.utc))
        self.assertIsNone(job.finished)
        self.assertEqual(job.attempts[0].number, 1)
        self.assertTrue(job.HasField("spec"))  # the message's own API reads through
        self.assertEqual(repr(job), "Job(id='j-1', name='j', state=FAILED, failure_kind=HANG)")
        self.assertEqual(job, Job(job_pb2.Job.FromString(proto.SerializeToString())))
        with self.assertRaises(AttributeError):
            job.state = JobState.RUNNING
        import pickle
        self.assertEqual(pickle.loads(pickle.dumps(job)), job)
        self.assertIn("metric_summary", dir(job))
        self.assertIsNone(Job(job_pb2.Job(id="j-2")).failure_kind)


class ScriptJobSpecTest(unittest.TestCase):
    """script_job_spec: trainctl submit SCRIPT's job, and clear errors."""

    def test_spec(self):
        spec = script_job_spec("jobs/Train_DDP v2.py", ["--epochs", 3], nproc_per_node=2, nnodes=2,
                               working_dir="/srv/code", env={"OMP_NUM_THREADS": 2}, queue="team-a", cpus=1.5,
                               memory="1.5Gi", pids=64, priority=5, wait_for_capacity=True)
        self.assertEqual(spec.name, "train-ddp-v2")
        self.assertEqual(spec.world_size, 4)
        self.assertEqual(spec.scheduling.nodes, 2)
        self.assertEqual(list(spec.command.argv), ["python3", "jobs/Train_DDP v2.py", "--epochs", "3"])
        self.assertEqual(spec.command.working_dir, "/srv/code")
        self.assertEqual(dict(spec.command.env), {"OMP_NUM_THREADS": "2"})
        self.assertEqual((spec.queue, spec.priority), ("team-a", 5))
        self.assertEqual((spec.resources.cpus, spec.resources.memory, spec.resources.pids), (1.5, 3 << 29, 64))
        self.assertTrue(spec.scheduling.wait_for_capacity)
        # Another program runs itself; the working directory is made absolute.
        spec = script_job_spec("./run.sh", name="mine", working_dir=".")
        self.assertEqual((spec.name, list(spec.command.argv), spec.command.working_dir),
                         ("mine", ["./run.sh"], os.getcwd()))
        self.assertEqual(script_job_spec("__.py").name, "script")
        # Restarts as torchrun's: none unless asked; overrides come last.
        self.assertEqual(script_job_spec("t.py").restart.max_restarts, 0)
        self.assertEqual(script_job_spec("t.py", max_restarts=2).restart.max_restarts, 2)
        self.assertEqual(script_job_spec("t.py", overrides={"restart.max_restarts": 4}).restart.max_restarts, 4)

    def test_errors_name_the_field(self):
        for kwargs, message in (
                ({"args": "--epochs 3"}, "args: must be a list of arguments, got the string '--epochs 3'"),
                ({"nproc_per_node": 0}, "nproc_per_node: must be an integer >= 1, got 0"),
                ({"nnodes": True}, "nnodes: must be an integer >= 1, got True"),
                ({"env": {"A": None}}, "env.A: must be a string, got NoneType None"),
                ({"memory": "lots"}, "override: resources.memory: must be a byte quantity"),
                ({"overrides": {"restart.max_restarts": "x"}}, "restart.max_restarts: must be an integer")):
            with self.assertRaises(TrainctlError) as bad:
                script_job_spec("train.py", **kwargs)
            self.assertEqual(bad.exception.code, grpc.StatusCode.INVALID_ARGUMENT, kwargs)
            self.assertIn(message, bad.exception.message, kwargs)


class SettingsTest(unittest.TestCase):
    """Address, token and CA as the CLI finds them (client/cli/cli.cc)."""

    def setUp(self):
        self.home = tempfile.mkdtemp(dir=WORK)
        os.makedirs(os.path.join(self.home, ".config", "trainctl"))
        self.config = os.path.join(self.home, ".config", "trainctl", "config.yaml")

    def write_config(self, text):
        with open(self.config, "w") as f:
            f.write(text)

    def test_order(self):
        from trainctl.client import resolve_settings
        env = {"HOME": self.home}
        self.assertEqual(resolve_settings(environ=env), ("localhost:7070", "", ""))
        self.write_config("coordinator: conf:1\ntoken: 12345\nca: /etc/ca.crt\n")
        self.assertEqual(resolve_settings(environ=env), ("conf:1", "12345", "/etc/ca.crt"))
        env.update(TRAINCTL_ADDRESS="addr:2", TRAINCTL_TOKEN="tok", TRAINCTL_CA="")
        self.assertEqual(resolve_settings(environ=env), ("addr:2", "tok", "/etc/ca.crt"))
        env["TRAINCTL_COORDINATOR"] = "coord:3"
        self.assertEqual(resolve_settings(environ=env)[0], "coord:3")
        self.assertEqual(resolve_settings("flag:4", "t", "c", environ=env), ("flag:4", "t", "c"))
        xdg = {"XDG_CONFIG_HOME": os.path.join(self.home, ".config"), "HOME": "/nonexistent"}
        self.assertEqual(resolve_settings(environ=xdg)[0], "conf:1")

    def test_malformed_config(self):
        from trainctl.client import resolve_settings
        self.write_config("coordinator: [a, b]\n")
        with self.assertRaises(TrainctlError) as bad:
            resolve_settings(environ={"HOME": self.home})
        self.assertEqual(bad.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertEqual(bad.exception.message, self.config + ":1:14: coordinator: expected host:port")


def _non_loopback_ipv4():
    """An IPv4 address of an interface of this host that is up and not
    loopback (SIOCGIFADDR per interface), or None."""
    import fcntl
    import socket
    import struct
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue  # no IPv4 address
            ip = socket.inet_ntoa(packed[20:24])
            if not ip.startswith("127."):
                return ip
    return None


class _RecordingListener:
    """A TCP listener on every interface that keeps every byte it is sent
    and answers an empty HTTP/2 SETTINGS frame (so a gRPC client counts the
    connection ready and sends its calls): the eavesdropper on a plaintext
    connection."""

    def __init__(self):
        import socket
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("0.0.0.0", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.05)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.data = b""
        self.stop = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        import socket
        conns = []
        while not self.stop:
            try:
                c, _ = self.sock.accept()
                c.settimeout(0.05)
                c.sendall(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
                conns.append(c)
                self.connections += 1
            except socket.timeout:
                pass
            for c in conns:
                try:
                    self.data += c.recv(4096)
                except socket.timeout:
                    pass
                except OSError:
                    pass
        for c in conns:
            c.close()
        self.sock.close()

    def close(self):
        self.stop = True
        self.thread.join(5)


class PlaintextTokenTest(unittest.TestCase):
    """Issue #45 item 3: the client sent its Bearer token in clear text to a
    non-loopback address; now it refuses before it dials."""

    def test_loopback_rule(self):
        from trainctl.client import is_loopback_address
        for local in ("127.0.0.1:7070", "127.1.2.3:1", "localhost:7070", "LOCALHOST:1", "[::1]:7070", "::1",
                      "[::ffff:127.0.0.1]:80", "unix:/run/trainctl.sock", "dns:///localhost:7070",
                      "ipv4:127.0.0.1:7070", "127.0.0.1"):
            self.assertTrue(is_loopback_address(local), local)
        for remote in ("10.0.0.1:7070", "192.0.2.2:7070", "0.0.0.0:7070", "[::]:7070", "coord:7070",
                       "127.evil.example:7070", "localhost.evil.example:7070", "[fd00::2]:7070",
                       "[::ffff:10.0.0.1]:7070", ":7070", "", "[::1", "dns:///coord:7070", "128.0.0.1:7070"):
            self.assertFalse(is_loopback_address(remote), remote)

    def test_no_token_in_clear_text_beyond_loopback(self):
        ip = _non_loopback_ipv4()
        if ip is None:
            self.skipTest("this host has no non-loopback IPv4 address")
        # Only what the test gives: no token or CA from the environment or a config file.
        environ = {k: v for k, v in os.environ.items() if not k.startswith("TRAINCTL_")}
        environ.update(HOME=WORK, XDG_CONFIG_HOME=WORK)
        patcher = mock.patch.dict(os.environ, environ, clear=True)
        patcher.start()
        self.addCleanup(patcher.stop)
        listener = _RecordingListener()
        self.addCleanup(listener.close)
        remote = "%s:%d" % (ip, listener.port)
        token = "tct_t-0badc0de_" + "ab" * 32
        for address in (remote, "127.0.0.1:1," + remote):
            with self.assertRaises(TrainctlError) as refused:
                Client(address, token=token, ca="", timeout=5)
            self.assertEqual(refused.exception.code, grpc.StatusCode.FAILED_PRECONDITION)
            self.assertIn("refusing to send the token in clear text to " + remote, refused.exception.message)
            self.assertIn("$TRAINCTL_CA", refused.exception.message)
        with mock.patch.dict(os.environ, {"TRAINCTL_COORDINATOR": remote, "TRAINCTL_TOKEN": token}):
            with self.assertRaises(TrainctlError) as from_env:
                Client()
            self.assertEqual(from_env.exception.code, grpc.StatusCode.FAILED_PRECONDITION)
        self.assertEqual(listener.connections, 0)
        self.assertEqual(listener.data, b"")
        # What the client did before: a plaintext channel carrying the token
        # hands the eavesdropper the token verbatim.
        with grpc.insecure_channel(remote) as channel:
            try:
                job_service_pb2_grpc.JobServiceStub(channel).ListJobs(
                    job_service_pb2.ListJobsRequest(), timeout=3, metadata=(("authorization", "Bearer " + token),))
            except grpc.RpcError:
                pass
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and token.encode() not in listener.data:
            time.sleep(0.02)
        self.assertTrue(listener.data.startswith(b"PRI * HTTP/2.0"), listener.data[:40])
        self.assertIn(("Bearer " + token).encode(), listener.data)


class JobSpecTest(unittest.TestCase):
    """job.yaml -> JobSpec in Python, as common/jobspec reads it."""

    def parse(self, text, **overrides):
        from trainctl import jobspec
        return jobspec.parse_job_yaml(text, "j.yaml", overrides)

    def errors(self, text, **overrides):
        from trainctl import jobspec
        with self.assertRaises(jobspec.SpecErrors) as e:
            self.parse(text, **overrides)
        return [str(x) for x in e.exception.errors]

    def test_examples_round_trip(self):
        from trainctl import jobspec
        paths = glob.glob(os.path.join(REPO, "examples", "*.yaml")) + \
            glob.glob(os.path.join(REPO, "examples", "*", "job.yaml"))
        self.assertGreater(len(paths), 2)
        for path in paths:
            spec = jobspec.parse_job_file(path)
            self.assertTrue(spec.name, path)
            self.assertEqual(jobspec.parse_job_yaml(jobspec.spec_to_yaml(spec)), spec, path)

    def test_values(self):
        spec = self.parse("name: a\nmodel: {name: cnn, classes: 10}\ntraining:\n  optimizer: {name: sgd, lr: 1e-2}\n"
                          "command:\n  argv: [python3, '5']\n  env: {OMP_NUM_THREADS: 2}\n"
                          "data: {train: {format: csv, path: x.csv, header: false}, seed: 18446744073709551615}\n"
                          "health: {on_nan: fail}\n")
        self.assertEqual(spec.model.WhichOneof("kind"), "cnn")
        self.assertEqual(spec.training.optimizer.name, job_pb2.OPTIMIZER_SGD)
        self.assertEqual(spec.training.optimizer.lr, 0.01)
        self.assertEqual(list(spec.command.argv), ["python3", "5"])
        self.assertEqual(dict(spec.command.env), {"OMP_NUM_THREADS": "2"})
        self.assertTrue(spec.data.train.csv.HasField("header"))
        self.assertEqual(spec.data.seed, 2 ** 64 - 1)
        self.assertEqual(spec.health.on_nan, job_pb2.HealthSpec.ON_NAN_FAIL)

    def test_overrides(self):
        spec = self.parse("name: a\n", **{"training.optimizer.lr": 0.5, "model": {"name": "mlp", "hidden": [4, 2]},
                                          "world_size": "3", "data.train": "{format: synthetic, length: 9}"})
        self.assertEqual(spec.training.optimizer.lr, 0.5)
        self.assertEqual(list(spec.model.mlp.hidden), [4, 2])
        self.assertEqual(spec.world_size, 3)
        self.assertEqual(spec.data.train.synthetic.length, 9)
        self.assertEqual(self.parse("", name="b").name, "b")
        self.assertEqual(self.errors("name: a\n", **{"name.x": 1}),
                         ["override: name.x: 'name' is not a mapping in the file"])

    def test_byte_quantities(self):
        # resources.memory as common/jobspec reads it (spec_fields.h).
        for text, want in (("4Gi", 4 << 30), ("'512Mi'", 512 << 20), ("1.5Gi", 3 << 29), ("2G", 2 * 10 ** 9),
                           ("1000", 1000), ("3k", 3000), ("0.5Ki", 512)):
            self.assertEqual(self.parse("name: a\nresources: {memory: %s}\n" % text).resources.memory, want, text)
        for text in ("-1", "4XB", "Gi", "1e3", "9.3e18", "99999999999Ti"):
            self.assertEqual(self.errors("name: a\nresources: {memory: %s}\n" % text), [
                "j.yaml:2:21: resources.memory: must be a byte quantity (bytes, or a number with Ki, Mi, Gi, Ti, "
                "K, M, G or T: 512Mi, 4Gi), got '%s'" % text], text)

    def test_errors_name_their_place(self):
        self.assertEqual(self.errors("name: a\nworld_size: '2'\nwold: 1\nname: b\nmodel: {name: mlp}\n"), [
            "j.yaml:2:13: world_size: must be an integer, got the string '2'",
            "j.yaml:3:1: wold: unknown key",
            "j.yaml:4:1: name: duplicate key (first at line 1)"])
        self.assertEqual(self.errors("name: a\ndevice: gpu\nmodel: {input_dim: 5}\n"), [
            "j.yaml:2:9: device: must be one of auto, cuda, cpu, got 'gpu'; did you mean 'cpu'?",
            "j.yaml:3:8: model.name: required: one of mlp, cnn, torchscript"])
        self.assertEqual(self.errors("name: a\nmodel: {name: mlp, hidden: [%s]}\n" % ",".join(["1"] * 65)),
                         ["j.yaml:2:28: model.hidden: at most 64 entries, got 65"])
        self.assertEqual(self.errors("name: a\n---\nname: b\n"),
                         ["j.yaml:1:1: holds several YAML documents; a job.yaml holds one"])
        self.assertEqual(self.errors(""),
                         ["j.yaml:1:1: the file is empty; a job needs at least name, model and data.train"])
        self.assertEqual(self.errors("- a\n"), ["j.yaml:1:1: must be a mapping of job fields, got a list"])
        self.assertIn("not valid YAML", self.errors("name: [a\n")[0])


class CancelJobsTest(ClusterTestCase):
    """Client.cancel_jobs against a coordinator with no worker (every job
    stays PENDING): a dry run cancels nothing, a filter cancels exactly its
    jobs, a submitter cancels only its own, no filter is refused."""

    def setUp(self):
        self.cluster = Cluster(_build_dir(), tempfile.mkdtemp(prefix="cancel-jobs-", dir=WORK))
        self.addCleanup(self.cluster.stop)
        self.cluster.start_coordinator()
        self.client = Client(self.cluster.address, token=self.cluster.admin_token)
        self.addCleanup(self.client.close)

    def test_filters_dry_run_and_ownership(self):
        a = [self.client.submit(EXAMPLE, name="py-bulk-a", queue="qa") for _ in range(2)]
        b = self.client.submit(EXAMPLE, name="py-bulk-b", queue="qb")
        with Client(self.cluster.address, token=self.cluster.create_token(auth_pb2.ROLE_SUBMITTER, "py-sub")) as sub:
            mine = sub.submit(EXAMPLE, name="py-bulk-mine", queue="qa")
            # A submitter matches only its own jobs, and may not name another owner.
            self.assertEqual(sub.cancel_jobs(queue="qa", dry_run=True).job_ids, [mine.id])
            with self.assertRaises(TrainctlError) as denied:
                sub.cancel_jobs(owner="admin")
            self.assertEqual(denied.exception.code, grpc.StatusCode.PERMISSION_DENIED)

        with self.assertRaises(TrainctlError) as unfiltered:
            self.client.cancel_jobs()
        self.assertEqual(unfiltered.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        with self.assertRaises(TrainctlError) as ended:
            self.client.cancel_jobs(states=["succeeded"])
        self.assertEqual(ended.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("states:", ended.exception.message)

        want = sorted([j.id for j in a] + [mine.id])
        dry = self.client.cancel_jobs(queue="qa", states=["pending"], dry_run=True)
        self.assertEqual((sorted(dry.job_ids), dry.count, dry.dry_run), (want, 3, True))
        self.assertEqual(self.client.get(a[0].id).state, job_pb2.JOB_STATE_PENDING)

        done = self.client.cancel_jobs(queue="qa", reason="py bulk")
        self.assertEqual((sorted(done.job_ids), done.count, done.dry_run), (want, 3, False))
        for job_id in want:
            got = self.client.get(job_id)
            self.assertEqual(got.state, job_pb2.JOB_STATE_CANCELLED)
            self.assertIn("py bulk", got.state_reason)
        self.assertEqual(self.client.get(b.id).state, job_pb2.JOB_STATE_PENDING)
        # Ended jobs match nothing any more.
        self.assertEqual(self.client.cancel_jobs(queue="qa").count, 0)


class ImportTest(unittest.TestCase):
    """``import trainctl`` stays dependency-free (command jobs' report())."""

    def test_report_without_grpc(self):
        code = ("import sys; sys.modules['grpc'] = None; sys.modules['yaml'] = None\n"
                "import trainctl\n"
                "assert trainctl.report(step=1, loss=0.5) is False\n"
                "try:\n    trainctl.Client\nexcept ImportError:\n    pass\nelse:\n    raise SystemExit('imported')\n")
        env = dict(os.environ, PYTHONPATH=HERE)
        env.pop("TRAINCTL_STATUS_FD", None)
        subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=30)


def tearDownModule():
    if os.environ.get("TRAINCTL_KEEP_TEST_DIRS") is None:
        shutil.rmtree(WORK, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
