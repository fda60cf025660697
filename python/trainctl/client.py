"""trainctl Python client: submit, query, watch, cancel, resume and fetch
training jobs on a trainctl-coordinator, over its gRPC API.

    from trainctl.client import Client, JobState

    client = Client()                      # address, token, CA as the CLI finds them
    job = client.submit_script("train.py", nproc_per_node=2, args=["--epochs", "3"])
    job = client.wait(job)                 # the final Job
    print(job.state)                       # SUCCEEDED (a JobState)
    for line in client.log_lines(job):     # or: for p in client.metric_points(job)
        print(line.rank, line.text)

The calls mirror the ``trainctl`` CLI (client/cli) and the C++ client
(client/trainctl/client.h). Jobs come back as ``Job`` (trainctl/jobs.py: a
read-only view of the ``trainctl.v1.Job`` message with JobState and
FailureKind names); the other messages (JobUpdate, MetricBatch, LogChunk,
LogLine, MetricPoint, ArtifactChunk) are the generated ``trainctl.v1``
protobuf classes.

Where the coordinator is: ``address``, else $TRAINCTL_COORDINATOR (or
$TRAINCTL_ADDRESS), else ``coordinator:`` in $XDG_CONFIG_HOME (or
~/.config)/trainctl/config.yaml, else localhost:7070. The token and CA file:
each from its argument, else $TRAINCTL_TOKEN / $TRAINCTL_CA, else ``token:`` /
``ca:`` in that file (``trainctl login`` writes it). A CA means TLS; without
one a token goes only to a loopback address (FAILED_PRECONDITION otherwise,
before anything is sent).

A JOB argument is a Job message, an id, a job name, or the start of an id
(the CLI's rule): several matches are an INVALID_ARGUMENT listing them,
unless ``latest`` (then the newest).

Errors: every failure is a TrainctlError whose ``code`` is the gRPC status
code (grpc.StatusCode) and ``message`` the coordinator's reason; problems
found before anything is sent use the same codes (INVALID_ARGUMENT for a bad
job.yaml, ALREADY_EXISTS for a fetch onto an existing file).

Several coordinators (active and standby on one store): ``address`` (or
the setting) may be a comma-separated list, "a:7070,b:7070", as the CLI's
--coordinator. A standby answers UNAVAILABLE with the trailing metadata
``trainctl-active-coordinator: HOST:PORT``: the call goes there (also when
it is not in the list). An address that cannot be reached leads to the next
one, round robin with a short backoff, within ``timeout``. A unary call is
sent again only when it certainly did not run (a standby answered, or the
connection never became ready) or when it is idempotent (reads, and submit
by its request_id); cancel is never sent twice. Streams (watch, logs,
fetch) open on the coordinator the last call found active; watch moves on
by the same rule when it resumes. The active address is kept for the
process (the next Client of the same list starts there).

Thread-safety: a Client may be used from several threads; an iterator
(watch, logs) belongs to the thread that reads it.
"""

import contextlib
import dataclasses
import errno
import os
import secrets
import shutil
import tempfile
import threading
import time
import zlib

import grpc
import yaml

try:
    from trainctl.v1 import job_pb2, job_service_pb2, metrics_pb2
except ImportError as e:  # pragma: no cover - depends on the installation
    raise ImportError(
        "trainctl.client needs the generated trainctl.v1 stubs: run python/gen_stubs.sh DIR and set "
        "TRAINCTL_PYTHON_STUBS=DIR, or install the package (cmake --install): %s" % e) from e

from trainctl import codepack, jobspec
# ACTIVE_COORDINATOR_KEY and is_loopback_address are this module's API too.
from trainctl._transport import (ACTIVE_COORDINATOR_KEY, TrainctlError, _invalid, _remembered,  # noqa: F401
                                 _remembered_lock, _Transport, is_loopback_address, parse_coordinator_list)
from trainctl.jobs import AttemptState, FailureKind, Job, JobState, RankState

__all__ = ["Client", "TrainctlError", "WaitTimeout", "Artifact", "Job", "JobState", "AttemptState", "RankState",
           "FailureKind", "script_job_spec", "resolve_settings", "parse_coordinator_list"]

DEFAULT_COORDINATOR = "localhost:7070"
# ListJobs page size (the coordinator's default).
_LIST_PAGE_SIZE = 100
_TERMINAL = (job_pb2.JOB_STATE_SUCCEEDED, job_pb2.JOB_STATE_FAILED, job_pb2.JOB_STATE_CANCELLED,
             job_pb2.JOB_STATE_TIMEOUT)


class WaitTimeout(TrainctlError, TimeoutError):
    """``Client.wait`` gave up: the job had not ended within its timeout.
    ``job`` is the last Job seen (None when none could be read); ``code`` is
    DEADLINE_EXCEEDED. Also a TimeoutError, so either except clause catches it."""

    def __init__(self, message, job=None):
        super().__init__(grpc.StatusCode.DEADLINE_EXCEEDED, message)
        self.job = job


@dataclasses.dataclass(frozen=True)
class Artifact:
    """A fetched file: where it was written and what it is."""

    # The local file written (mode 0600).
    path: str
    size: int
    # "crc32:xxxxxxxx", checked against the bytes written.
    checksum: str
    # Where it lies on the worker that holds it, and that worker.
    source_path: str
    worker_id: str


@dataclasses.dataclass(frozen=True)
class CancelledJobs:
    """What ``Client.cancel_jobs`` did (or, with dry_run, would do)."""

    # The jobs cancelled (dry_run: that would be), by id.
    job_ids: list
    count: int
    # Nothing was cancelled.
    dry_run: bool


# --- where the coordinator is ------------------------------------------------


def config_file_path(environ=None):
    """$XDG_CONFIG_HOME (or $HOME/.config)/trainctl/config.yaml; "" without either."""
    environ = os.environ if environ is None else environ
    config_dir = environ.get("XDG_CONFIG_HOME", "")
    if not config_dir and environ.get("HOME"):
        config_dir = environ["HOME"] + "/.config"
    return config_dir + "/trainctl/config.yaml" if config_dir else ""


# Scalars as text, as yaml-cpp reads them (`token: 12345` is "12345").
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _is_null(node):
    return isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null" and not node.style


def _config_value(key, environ):
    """One scalar key of the config file ("" when the file or key is absent);
    a malformed file is an INVALID_ARGUMENT naming path:line:col."""
    path = config_file_path(environ)
    if not path:
        return ""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError):
        return ""
    try:
        doc = yaml.compose(text, Loader=_YAML_LOADER)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = "%d:%d" % (mark.line + 1, mark.column + 1) if mark else "1:1"
        raise _invalid("%s:%s: %s" % (path, where, e.problem or e.context))
    if doc is None or _is_null(doc):
        return ""
    if not isinstance(doc, yaml.MappingNode):
        raise _invalid("%s: expected a mapping such as `coordinator: host:port`" % path)
    node = next((v for k, v in doc.value if isinstance(k, yaml.ScalarNode) and k.value == key), None)
    if node is None:
        return ""
    if not isinstance(node, yaml.ScalarNode) or _is_null(node) or not node.value:
        raise _invalid("%s:%d:%d: %s: %s" % (
            path, node.start_mark.line + 1, node.start_mark.column + 1, key,
            "expected host:port" if key == "coordinator" else "expected a string"))
    return node.value


def _setting(given, env_names, key, environ):
    """``given``, else the first non-empty $env_name, else the config file's ``key``, else ""."""
    if given:
        return given
    for name in env_names:
        if environ.get(name):
            return environ[name]
    return _config_value(key, environ)


def resolve_settings(address=None, token=None, ca=None, environ=None):
    """(address, token, ca_file) as the trainctl CLI resolves them (client/cli/cli.cc)."""
    environ = os.environ if environ is None else environ
    address = _setting(address, ("TRAINCTL_COORDINATOR", "TRAINCTL_ADDRESS"), "coordinator", environ)
    token = _setting(token, ("TRAINCTL_TOKEN",), "token", environ)
    ca = _setting(ca, ("TRAINCTL_CA",), "ca", environ)
    return address or DEFAULT_COORDINATOR, token, ca


# --- a script as a command job -----------------------------------------------


def _script_job_name(script):
    """The job's name from the program's, as the CLI makes it (client/cli/
    script_job.cc): "train_DDP.py" -> "train-ddp"; "script" when nothing is left."""
    name = ""
    for c in os.path.splitext(os.path.basename(script))[0]:
        if len(name) >= 40:
            break
        c = c.lower()
        if "a" <= c <= "z" or "0" <= c <= "9":
            name += c
        elif name and not name.endswith("-"):
            name += "-"
    return name.rstrip("-") or "script"


def _count(value, what):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _invalid("%s: must be an integer >= 1, got %r" % (what, value))
    return value


def _text(value, what):
    """A str, or a number written out (argv and env are strings)."""
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise _invalid("%s: must be a string, got %s %r" % (what, type(value).__name__, value))


def script_job_spec(script, args=(), *, nproc_per_node=1, nnodes=1, working_dir=".", python=None, env=None,
                    name=None, queue=None, max_restarts=None, priority=None, cpus=None, memory=None, pids=None,
                    wait_for_capacity=False, max_runtime_s=None, overrides=None):
    """The JobSpec ``trainctl submit --nproc-per-node N SCRIPT -- ARGS``
    sends (client/cli/script_job.cc's ScriptJobSpec), read back through the
    job.yaml reader so it is checked as any job.yaml is (INVALID_ARGUMENT,
    one line per problem). Client.submit_script submits it.

    script: the program, relative to ``working_dir`` or absolute; a .py file
        runs as ``PYTHON SCRIPT ARGS``, anything else as ``SCRIPT ARGS``.
    args: the program's arguments (a list; numbers are written out).
    nproc_per_node, nnodes: ranks per node and nodes, as torchrun's;
        world_size = nproc_per_node * nnodes; nnodes > 1 puts the job on
        exactly nnodes workers, nproc_per_node on each (scheduling.nodes).
    working_dir: where every rank starts (command.working_dir), made
        absolute here (the CLI uses the current directory). Workers must see
        it and the script there: a shared filesystem, or a worker on this host.
        (This builder sends nothing: Client.submit_script uploads the
        directory instead unless upload=False.)
    python: the interpreter of a .py script (--python; default "python3").
    env: extra environment for every rank (command.env), e.g. {"OMP_NUM_THREADS": 2}.
    name: the job's name (default: the script's, "train_ddp.py" -> "train-ddp").
    queue, max_restarts, priority: queue, restart.max_restarts, priority;
        max_restarts defaults to torchrun's 0, as the CLI's (not a job.yaml's 3).
    cpus, memory, pids: resources.* limits per rank (memory: bytes or "4Gi").
    wait_for_capacity: scheduling.wait_for_capacity (--wait-for-capacity).
    max_runtime_s: scheduling.max_runtime_s (--max-runtime): past it the job
        is stopped (checkpoint first) and ends TIMEOUT.
    overrides: more job.yaml paths to values, as submit()'s (--set).
    """
    script = _text(script, "script")
    if not script:
        raise _invalid("script: empty (expected a program such as train.py)")
    if isinstance(args, (str, bytes)):
        raise _invalid("args: must be a list of arguments, got the string %r (shlex.split() it)" % (args,))
    argv_tail = [_text(a, "args[%d]" % i) for i, a in enumerate(args)]
    spec = job_pb2.JobSpec(name=_script_job_name(script) if name is None else _text(name, "name"))
    spec.world_size = _count(nproc_per_node, "nproc_per_node") * _count(nnodes, "nnodes")
    if nnodes > 1:
        # torchrun's --nnodes: exactly nnodes workers, nproc_per_node ranks each (the CLI's rule).
        spec.scheduling.nodes = nnodes
    if script.endswith(".py"):
        spec.command.argv.append(_text(python, "python") if python is not None else "python3")
    spec.command.argv.append(script)
    spec.command.argv.extend(argv_tail)
    spec.command.working_dir = os.path.abspath(_text(working_dir, "working_dir"))
    for key, value in (env or {}).items():
        spec.command.env[_text(key, "env")] = _text(value, "env.%s" % key)
    if queue is not None:
        spec.queue = _text(queue, "queue")
    # Numbers through the job.yaml reader: its checks and "4Gi".
    sets = dict(overrides or {})
    # A script restarts as under torchrun: never, unless asked (the CLI's
    # rule; overrides, as --set, come last).
    if max_restarts is None and "restart.max_restarts" not in sets:
        max_restarts = 0
    for path, value in (("restart.max_restarts", max_restarts), ("priority", priority), ("resources.cpus", cpus),
                        ("resources.memory", memory), ("resources.pids", pids),
                        ("scheduling.max_runtime_s", max_runtime_s)):
        if value is not None:
            sets[path] = value
    if wait_for_capacity:
        sets["scheduling.wait_for_capacity"] = True
    return _checked(lambda: jobspec.parse_job_yaml(jobspec.spec_to_yaml(spec), script, sets))


# --- the client --------------------------------------------------------------


class Client(_Transport):
    """A connection to a trainctl-coordinator; see the module docstring."""

    def __init__(self, address=None, token=None, ca=None, *, timeout=10.0, latest=False,
                 tls_server_name=None, watch_reconnect_for=120.0):
        """Connects and waits until the coordinator answers, at most ``timeout``
        seconds (UNAVAILABLE naming the address when nothing listens).

        timeout: also bounds every unary call (streams are unbounded).
        latest: a JOB that matches several jobs means the newest (the CLI's --latest).
        tls_server_name: the name the coordinator's certificate must carry when
            it differs from the address's host (tests).
        watch_reconnect_for: how long watch(), fetch() and logs(follow=True) resume a broken stream, in seconds.
        """
        self.address, token, self.ca_file = resolve_settings(address, token, ca)
        self.timeout = timeout
        self.latest = latest
        self.watch_reconnect_for = watch_reconnect_for
        self._tls_server_name = tls_server_name
        self._metadata = (("authorization", "Bearer " + token),) if token else ()
        self._root_certs = None
        if self.ca_file:
            try:
                with open(self.ca_file, "rb") as f:
                    self._root_certs = f.read()
            except OSError as e:
                raise _invalid("CA file %s: %s" % (self.ca_file, e.strerror))
        self._addresses = parse_coordinator_list(self.address)
        self._has_token = bool(token)
        # Every address of the list before any is dialled: the token goes in
        # clear text to none beyond this host.
        for a in self._addresses:
            self._check_token_transport(a)
        self._list_key = ",".join(self._addresses)
        self._lock = threading.Lock()
        self._channels = {}  # address -> channel, made on first use
        with _remembered_lock:
            self._current = _remembered.get(self._list_key, self._addresses[0])
        self._next = self._addresses.index(self._current) if self._current in self._addresses else 0
        self._connect()

    @property
    def active_address(self):
        """The coordinator calls go to now (the one that last answered as active)."""
        with self._lock:
            return self._current

    def close(self):
        """Closes the connection; calls in flight end with CANCELLED."""
        with self._lock:
            channels, self._channels = list(self._channels.values()), {}
        for entry in channels:
            entry.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- jobs ---

    def submit(self, spec, /, *, request_id=None, **overrides):
        """Submits a job; it is PENDING (stored) when this returns the Job.

        spec: a job.yaml path, a dict in job.yaml's shape, or a JobSpec.
        overrides: job.yaml paths to values, the CLI's --set:
            ``submit("job.yaml", **{"training.epochs": 2}, name="run-7")``;
            a str value is YAML text as after --set key=, others are written
            as YAML would; a mapping replaces the whole mapping.

        The YAML is read here (trainctl.jobspec: INVALID_ARGUMENT with every
        shape error and its line, nothing sent); ranges, cross-field rules and
        defaults are the coordinator's (INVALID_ARGUMENT naming each field).

        Safe to retry: the call sends a request_id (given, or a random one)
        and sends it again when an answer may have been lost (UNAVAILABLE:
        within the timeout, to the active coordinator; DEADLINE_EXCEEDED: up
        to twice more): one call makes at most one job.
        """
        return self._submit(self._read_spec(spec, overrides), request_id)

    def submit_script(self, script, /, args=(), *, nproc_per_node=1, nnodes=1, working_dir=".", upload=True,
                      python=None, env=None, name=None, queue=None, max_restarts=None, priority=None, cpus=None,
                      memory=None, pids=None, wait_for_capacity=False, max_runtime_s=None, request_id=None,
                      **overrides):
        """Submits your own program as a command job, as
        ``trainctl submit --nproc-per-node N SCRIPT -- ARGS`` does: every rank
        runs ``python3 SCRIPT ARGS`` (a .py SCRIPT; another program runs
        itself) under torchrun's environment (docs/command-jobs.md). Returns
        the Job (PENDING); ``wait`` it.

        upload=True (the default, as the CLI's): ``working_dir`` is packed
        (upload_code) and travels with the job as command.code; the ranks
        start in their unpacked copy (command.working_dir empty), so the
        directory may change or go once this returns. upload=False: the
        ranks start in ``working_dir`` itself, which every worker must see
        (trainctl submit --no-upload). What cannot be packed (a link out of
        the directory, over 64 MiB) is a ValueError before any call.

        The other keywords are script_job_spec's (the spec this sends);
        request_id and **overrides are submit's (``**{"restart.on_hang": "fail"}``).
        """
        spec = script_job_spec(script, args, nproc_per_node=nproc_per_node, nnodes=nnodes, working_dir=working_dir,
                               python=python, env=env, name=name, queue=queue, max_restarts=max_restarts,
                               priority=priority, cpus=cpus, memory=memory, pids=pids,
                               wait_for_capacity=wait_for_capacity, max_runtime_s=max_runtime_s,
                               overrides=overrides)
        if upload:
            spec.command.code.CopyFrom(self.upload_code(spec.command.working_dir))
            spec.command.ClearField("working_dir")
        return self._submit(spec, request_id)

    def upload_code(self, directory=".", *, max_bytes=codepack.DEFAULT_MAX_BYTES):
        """Packs ``directory`` as ``trainctl submit`` does (trainctl.codepack:
        .gitignore/.trainctlignore honoured; .git, __pycache__ and *.pyc
        skipped; links inside followed) and uploads it (JobService.UploadCode);
        returns the CodePackage to set as a spec's ``command.code``.
        ValueError, before any call, for what cannot be packed (naming the
        link and its target, or the limit and the biggest files)."""
        source = os.path.normpath(os.path.abspath(os.fspath(directory)))
        scratch = tempfile.mkdtemp(prefix="trainctl-code-")
        try:
            packed = codepack.pack_directory(source, os.path.join(scratch, "code.tar"), max_bytes=max_bytes)
            code = job_pb2.CodePackage(digest=packed.digest, size_bytes=packed.size_bytes, files=packed.files,
                                       source=source)
            self.upload_archive(packed.path, code)
            return code
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def upload_archive(self, path, code):
        """Uploads the archive file ``path`` that ``code`` (a CodePackage:
        digest, size_bytes) describes, in 1 MiB pieces; returns True when the
        coordinator had it already (it ends the call early and nothing more
        is sent). Safe to retry: the archive is stored by its digest."""
        chunk_bytes = 1 << 20  # UploadCodeChunk.data: at most 1 MiB (job_service.proto)
        try:
            size = os.stat(path).st_size
        except OSError as e:
            raise _invalid("upload code: %s: %s" % (path, e.strerror)) from None
        if size != code.size_bytes:
            raise _invalid("upload code: %s is %d bytes, the package says %d" % (path, size, code.size_bytes))

        def chunks():  # a fresh stream for every try, the file from its start
            with open(path, "rb") as f:
                data = f.read(chunk_bytes)
                yield job_service_pb2.UploadCodeChunk(digest=code.digest, size_bytes=code.size_bytes, data=data)
                while len(data) == chunk_bytes:
                    data = f.read(chunk_bytes)
                    if not data:
                        break
                    yield job_service_pb2.UploadCodeChunk(data=data)

        try:
            resp = self._unary("UploadCode", chunks, timeout=self.timeout + (size // chunk_bytes + 1))
        except TrainctlError as e:
            if e.code == grpc.StatusCode.UNIMPLEMENTED:
                raise TrainctlError(e.code, "the coordinator at %s does not take code uploads (JobService.UploadCode;"
                                    " it is older than this client): upgrade it, or submit with upload=False and a "
                                    "directory every worker has" % self.active_address) from None
            raise
        if resp.digest and resp.digest != code.digest:
            raise TrainctlError(grpc.StatusCode.DATA_LOSS, "upload code: the coordinator stored %s, expected %s"
                                % (resp.digest, code.digest))
        return resp.already_stored

    def get(self, job):
        """The job (a Job) with its attempts and checkpoints. NOT_FOUND when no job matches."""
        if isinstance(job, (Job, job_pb2.Job)):
            return Job(self._unary("GetJob", job_service_pb2.GetJobRequest(job_id=job.id)))
        return self.resolve(job)

    def list(self, states=None, limit=0):
        """Jobs (Job), newest first, without attempts; only those in ``states``
        (JobState members, or names: "running", "succeeded", ...) when given;
        at most ``limit`` (0 = all), following the coordinator's pages."""
        if limit < 0:
            raise _invalid("limit: must be >= 0")
        req = job_service_pb2.ListJobsRequest(states=[_job_state(s) for s in states or ()])
        out = []
        while True:
            req.page_size = _LIST_PAGE_SIZE if limit == 0 else min(_LIST_PAGE_SIZE, limit - len(out))
            resp = self._unary("ListJobs", req)
            out.extend(Job(j) for j in resp.jobs)
            req.page_token = resp.next_page_token
            if not req.page_token or (limit and len(out) >= limit):
                break
        return out[:limit] if limit else out

    def cancel(self, job, reason=""):
        """Stops every rank and marks the job CANCELLED (recording ``reason``);
        returns the Job. FAILED_PRECONDITION when it already ended."""
        req = job_service_pb2.CancelJobRequest(job_id=self._job_id(job), reason=reason)
        return Job(self._unary("CancelJob", req, idempotent=False))

    def cancel_jobs(self, queue="", owner="", states=None, dry_run=False, reason=""):
        """Cancels, in one call, every job not yet ended that matches all the
        filters given: ``queue``, ``owner`` (a token name), ``states``
        (JobState members or names: "pending", "running", ...). At least one
        is required (INVALID_ARGUMENT otherwise). A submitter's filters match
        only its own jobs (another ``owner`` is PERMISSION_DENIED). With
        ``dry_run`` nothing is cancelled. Returns a CancelledJobs: the ids
        cancelled (or that would be) and their count."""
        req = job_service_pb2.CancelJobsRequest(queue=queue, owner=owner, reason=reason, dry_run=dry_run,
                                                states=[_job_state(s) for s in states or ()])
        # A dry run only reads; a real one is never sent twice (as cancel()).
        resp = self._unary("CancelJobs", req, idempotent=dry_run)
        return CancelledJobs(job_ids=list(resp.job_ids), count=resp.count, dry_run=resp.dry_run)

    def resume(self, job, *, request_id=None, **overrides):
        """Submits a new job that continues ``job`` from its newest checkpoint
        (``trainctl resume``): the source's spec with ``overrides`` on top
        (e.g. ``**{"training.epochs": 10}`` trains 10 epochs in all) and
        resume_from set. Returns the new Job."""
        source = self.get(job)
        base = job_pb2.JobSpec()
        base.CopyFrom(source.spec)
        base.ClearField("resume_from")
        spec = _checked(lambda: jobspec.parse_job_yaml(jobspec.spec_to_yaml(base), "job " + source.id, overrides))
        spec.resume_from.job = source.id
        return self._submit(spec, request_id)

    def resolve(self, ref, latest=None):
        """The job ``ref`` names (client/cli's ResolveJob): its id; else the
        jobs with that name; else the jobs whose id starts with it. Several:
        the newest when ``latest`` (default: the client's), else
        INVALID_ARGUMENT listing them. NOT_FOUND when none."""
        latest = self.latest if latest is None else latest
        try:
            return Job(self._unary("GetJob", job_service_pb2.GetJobRequest(job_id=ref)))
        except TrainctlError as e:
            if e.code != grpc.StatusCode.NOT_FOUND:
                raise
            not_found = e
        try:
            jobs = self.list()  # newest first
        except TrainctlError:
            raise not_found from None
        named = [j for j in jobs if j.spec.name == ref]
        found = named or [j for j in jobs if j.id.startswith(ref)]
        if not found:
            raise TrainctlError(grpc.StatusCode.NOT_FOUND,
                                "no job '%s' (not an id, a job name or the start of an id)" % ref)
        if len(found) > 1 and not latest:
            ids = [j.id for j in found[:10]]
            raise _invalid("JOB: '%s' matches %d jobs by %s, newest first: %s%s; give an id, or latest=True for "
                           "the newest" % (ref, len(found), "name" if named else "id prefix", ", ".join(ids),
                                           ", ..." if len(found) > len(ids) else ""))
        return Job(self._unary("GetJob", job_service_pb2.GetJobRequest(job_id=found[0].id)))

    # --- following a job ---

    def watch(self, job, include_history=True, timeout=None):
        """Iterates over the job's updates (trainctl.v1.JobUpdate: ``job``,
        ``event`` or ``metrics``, see update.WhichOneof("update")) until the
        job ends; with include_history, its stored events and metrics first.

        A broken stream (the coordinator restarted, the network dropped) is
        resumed for up to watch_reconnect_for seconds after the break: the
        events missed meanwhile come first (after the last event seen, by
        Event.seq), stored metrics are not sent again. ``timeout`` bounds the
        whole watch in seconds (DEADLINE_EXCEEDED). Leaving the loop early
        cancels the stream. The job is resolved now, not at the first next().
        """
        job_id = self._job_id(job)
        deadline = None if timeout is None else time.monotonic() + timeout
        return self._watch(job_id, include_history, deadline)

    def wait(self, job, timeout=None):
        """Blocks until the job ends (SUCCEEDED, FAILED, CANCELLED or TIMEOUT) and
        returns it (a Job, with its attempts): ``client.wait(job).state``.
        It does not raise for a job that failed; look at the state.

        Follows the job's watch stream (resumed after a break as watch() is),
        so it returns as soon as the coordinator records the end.
        ``timeout``: seconds; past it a WaitTimeout (a TimeoutError) names
        the job and the state it was last seen in. None: no limit.
        """
        if timeout is not None and timeout < 0:
            raise _invalid("timeout: must be >= 0 seconds (None: no limit), got %r" % (timeout,))
        deadline = None if timeout is None else time.monotonic() + timeout
        job_id = self._job_id(job)
        last = job if isinstance(job, Job) else None
        while True:
            timed_out = False
            try:
                for update in self._watch(job_id, False, deadline):
                    if update.HasField("job"):
                        last = Job(update.job)
            except TrainctlError as e:
                if e.code != grpc.StatusCode.DEADLINE_EXCEEDED or deadline is None:
                    raise
                timed_out = True
            try:
                current = self.get(job_id)  # with its attempts; also the state named on a timeout
            except TrainctlError:
                if not timed_out:
                    raise
                current = last
            if current is not None and current.done:
                return current
            if timed_out or (deadline is not None and time.monotonic() >= deadline):
                raise _wait_timeout(job_id, timeout, current) from None
            # The stream ended before the job did (a coordinator stopping):
            # watch again shortly, within the same deadline.
            last = current
            time.sleep(0.2)

    def metrics(self, job, rank=None, kind=None):
        """The job's stored metric points (also after it ended), oldest first:
        a list of trainctl.v1.MetricBatch, one per run of points of one
        attempt. ``rank``: only that rank; ``kind``: "train" (train windows)
        or "eval" (evaluations: end-of-epoch points with the eval results,
        then a script's eval reports); a MetricPoint.Kind value: only that
        kind. A point carries only the fields its rank reported
        (``point.HasField("loss")``)."""
        batches = []
        for req in self._metrics_requests(job, rank, kind):
            first = len(batches)
            while True:
                resp = self._unary("GetMetrics", req)
                for b in resp.batches:
                    # A page may continue the previous page's attempt: one batch per run.
                    if len(batches) > first and batches[-1].attempt == b.attempt:
                        batches[-1].points.extend(b.points)
                    else:
                        batches.append(b)
                req.page_token = resp.next_page_token
                if not req.page_token:
                    break
        return batches

    def metric_points(self, job, rank=None, kind=None):
        """Iterates over the job's stored metric points
        (trainctl.v1.MetricPoint: step, epoch, loss, lr, samples_per_sec,
        eval, scalars, ...), oldest first, one page at a time:
        ``for p in client.metric_points(job): print(p.step, p.loss)``.
        ``rank`` and ``kind`` ("train", "eval") as metrics(), which groups
        the same points by attempt. Checked now: a bad ``kind`` is
        INVALID_ARGUMENT here, not at the first next()."""
        return self._metric_points(self._metrics_requests(job, rank, kind))

    def _metrics_requests(self, job, rank, kind):
        # "eval" is two stored kinds: the engine's epoch ends and a script's eval reports.
        kinds = {None: [0], "train": [metrics_pb2.MetricPoint.KIND_TRAIN],
                 "eval": [metrics_pb2.MetricPoint.KIND_EPOCH_END, metrics_pb2.MetricPoint.KIND_EVAL]}
        if kind not in kinds and kind not in metrics_pb2.MetricPoint.Kind.values():
            raise _invalid("kind: one of 'train', 'eval', got %r" % (kind,))
        job_id = self._job_id(job)
        reqs = []
        for one_kind in kinds.get(kind, [kind]):
            req = job_service_pb2.GetMetricsRequest(job_id=job_id, kind=one_kind)
            if rank is not None:
                req.rank = rank
            reqs.append(req)
        return reqs

    def _metric_points(self, reqs):
        for req in reqs:
            while True:
                resp = self._unary("GetMetrics", req)
                for b in resp.batches:
                    yield from b.points
                req.page_token = resp.next_page_token
                if not req.page_token:
                    break

    def logs(self, job, rank=None, attempt=0, tail=0, follow=False):
        """Iterates over the job's log lines as trainctl.v1.LogChunk (one
        rank's lines each, in order; chunk.lines[i].text): every rank of the
        latest attempt unless ``rank``/``attempt`` (from 1) say otherwise;
        ``tail``: only the last N kept lines per rank first; ``follow``: new
        lines until the job ends (a pending job is waited for first), resumed
        after a break for up to watch_reconnect_for seconds, after each rank's
        last line delivered (LogLine.seq): none twice.
        Checked now: a rank or attempt the job does not have is INVALID_ARGUMENT."""
        if rank is not None and rank < 0:
            raise _invalid("rank: must be >= 0")
        if attempt < 0:
            raise _invalid("attempt: must be >= 1 (0 = latest)")
        if tail < 0:
            raise _invalid("tail: must be >= 0")
        found = self.get(job)
        if attempt > len(found.attempts):
            have = len(found.attempts)
            raise _invalid("attempt: %d is out of range: job %s has %d attempt(s)%s" % (
                attempt, found.id, have, " (1..%d)" % have if have else " yet"))
        world = found.spec.world_size
        if rank is not None and world > 0 and rank >= world:
            raise _invalid("rank: %d is outside job %s's world: world_size %d (ranks 0..%d)" % (
                rank, found.id, world, world - 1))
        req = job_service_pb2.GetLogsRequest(job_id=found.id, attempt=attempt, tail_lines=tail, follow=follow)
        if rank is not None:
            req.rank = rank
        wait_placed = follow and attempt == 0 and not found.attempts and found.state == job_pb2.JOB_STATE_PENDING
        return self._logs(req, wait_placed)

    def log_lines(self, job, rank=None, attempt=0, tail=0, follow=False):
        """logs(), one line at a time: iterates over trainctl.v1.LogLine
        (``line.text``, ``line.rank``, ``line.stream``: 1 stdout, 2 stderr;
        ``line.time``), in each rank's order:
        ``for line in client.log_lines(job, follow=True): print(line.rank, line.text)``.
        The arguments, the checks (now) and the resumption are logs()'s."""
        return self._lines(self.logs(job, rank=rank, attempt=attempt, tail=tail, follow=follow))

    @staticmethod
    def _lines(chunks):
        with contextlib.closing(chunks):  # leaving the loop cancels the stream
            for chunk in chunks:
                yield from chunk.lines

    def fetch(self, job, step=None, path=None, force=False):
        """Downloads the job's final model (or its checkpoint at global
        ``step``) from the worker that holds it, through the coordinator;
        returns an Artifact.

        path: where to write it (default: JOB-model.pt, or JOB-step-STEP.pt,
        in the current directory). The file is written under a temporary name
        beside it, mode 0600, created without following links, and renamed to
        ``path`` only once its bytes match the recorded checksum (DATA_LOSS
        otherwise). An existing ``path`` is kept (ALREADY_EXISTS) unless ``force``.
        """
        step = step or 0
        if step < 0:
            raise _invalid("step: a global step > 0 (Job.checkpoints)")
        job_id = self._job_id(job)
        out = os.fspath(path) if path is not None else _default_out_name(job_id, step)
        if not force and os.path.lexists(out):
            raise _exists(out)
        req = job_service_pb2.FetchArtifactRequest(job_id=job_id, checkpoint_step=step)
        with _PrivateFile(out, replace=force) as f:
            head = self._receive_artifact(req, f)
            f.commit()
        return Artifact(path=out, size=head.size, checksum=head.checksum, source_path=head.path,
                        worker_id=head.worker_id)

    # --- internals ---

    def _job_id(self, job):
        return job.id if isinstance(job, (Job, job_pb2.Job)) else self.resolve(job).id

    @staticmethod
    def _read_spec(spec, overrides):
        if isinstance(spec, job_pb2.JobSpec):
            if not overrides:
                return spec
            return _checked(lambda: jobspec.parse_job_yaml(jobspec.spec_to_yaml(spec), "<JobSpec>", overrides))
        if isinstance(spec, dict):
            return _checked(lambda: jobspec.parse_job_dict(spec, overrides))
        if isinstance(spec, (str, os.PathLike)):
            return _checked(lambda: jobspec.parse_job_file(os.fspath(spec), overrides))
        raise TypeError("submit: a job.yaml path, a dict or a trainctl.v1.JobSpec, got %s" % type(spec).__name__)

    def _submit(self, spec, request_id):
        req = job_service_pb2.SubmitJobRequest(spec=spec, request_id=request_id or secrets.token_hex(16))
        for attempt in range(3):
            if attempt:
                time.sleep(0.25 * attempt)
            try:
                # Idempotent by its request id: an answer lost to UNAVAILABLE
                # is sent again within the timeout, and the retry returns the
                # first call's job, never a second.
                return Job(self._unary("SubmitJob", req).job)
            except TrainctlError as e:
                # One lost to the deadline: twice more.
                if e.code != grpc.StatusCode.DEADLINE_EXCEEDED or attempt == 2:
                    raise

    def _watch(self, job_id, include_history, deadline):
        """The generator behind watch() (client/client.cc's Watch loop)."""
        last_seq = 0  # The newest event delivered: a resumed stream continues after it.

        def open_watch(stub):
            req = job_service_pb2.WatchJobRequest(job_id=job_id, include_history=include_history or last_seq > 0,
                                                  after_event_seq=last_seq)
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            return stub.WatchJob(req, timeout=remaining, metadata=self._metadata)

        # Closed (the stream cancelled) also when the caller leaves its loop.
        with contextlib.closing(self._resumed(open_watch, lambda: True, deadline, "watch of %s" % job_id)) as updates:
            for update in updates:
                if update.HasField("event"):
                    last_seq = max(last_seq, update.event.seq)
                yield update

    def _logs(self, req, wait_placed):
        """The generator behind logs()."""
        if wait_placed:
            # A pending job has no attempt to follow yet: wait until it is
            # placed, so submit then logs(follow=True) shows the first attempt.
            for update in self._watch(req.job_id, False, None):
                if update.HasField("job") and update.job.state != job_pb2.JOB_STATE_PENDING:
                    break
        # What was delivered (a resumed stream continues after it): the
        # attempt of the last line and, of that attempt, each rank's last
        # LogLine.seq.
        last_attempt, last_seq = 0, {}

        def open_logs(stub):
            if last_attempt:
                req.tail_lines = 0  # the tail was sent; everything after it is owed
                req.after_attempt = last_attempt
                req.after_seq.clear()
                req.after_seq.update(last_seq)
            return stub.GetLogs(req, metadata=self._metadata)

        with contextlib.closing(self._resumed(open_logs, lambda: req.follow)) as chunks:
            for chunk in chunks:
                if chunk.attempt != last_attempt:
                    last_attempt, last_seq = chunk.attempt, {}
                for line in chunk.lines:
                    if line.seq > 0:
                        last_seq[chunk.rank] = max(last_seq.get(chunk.rank, 0), line.seq)
                yield chunk

    def _receive_artifact(self, req, out):
        """Streams FetchArtifact into ``out``, checking order, size and
        checksum; returns the first chunk (without data). A stream that
        breaks after bytes arrived is opened again at the next byte
        (FetchArtifactRequest.offset) for up to watch_reconnect_for seconds
        after the break, as watch() is; the file must still be the same."""
        head, offset, crc = None, 0, 0
        fresh = False  # the next chunk is the first of a stream

        def open_fetch(stub):
            nonlocal fresh
            fresh = True
            req.offset = offset
            return stub.FetchArtifact(req, metadata=self._metadata)

        with contextlib.closing(self._resumed(open_fetch, lambda: head is not None)) as chunks:
            for chunk in chunks:
                if fresh and head is None:
                    head = job_service_pb2.ArtifactChunk()
                    head.CopyFrom(chunk)
                    head.ClearField("data")
                    head.ClearField("offset")
                elif fresh and (chunk.size, chunk.checksum, chunk.path, chunk.worker_id) != (
                        head.size, head.checksum, head.path, head.worker_id):
                    raise TrainctlError(grpc.StatusCode.DATA_LOSS, (
                        "fetch: the file changed while the fetch was resumed (%s: %d bytes, %s -> %s: %d bytes, "
                        "%s)") % (head.path, head.size, head.checksum, chunk.path, chunk.size, chunk.checksum))
                fresh = False
                if chunk.offset != offset:
                    raise TrainctlError(grpc.StatusCode.DATA_LOSS,
                                        "fetch: a piece at offset %d, expected %d" % (chunk.offset, offset))
                out.write(chunk.data)
                crc = zlib.crc32(chunk.data, crc)
                offset += len(chunk.data)
        if head is None:
            raise TrainctlError(grpc.StatusCode.DATA_LOSS, "fetch: the coordinator sent nothing")
        if offset != head.size:
            raise TrainctlError(grpc.StatusCode.DATA_LOSS, "fetch: got %d bytes of %d" % (offset, head.size))
        got = "crc32:%08x" % crc
        if head.checksum and got != head.checksum:
            raise TrainctlError(grpc.StatusCode.DATA_LOSS,
                                "fetch: the bytes are %s, expected %s" % (got, head.checksum))
        return head

def _wait_timeout(job_id, timeout, last):
    if last is None:
        return WaitTimeout("job %s did not end within %gs" % (job_id, timeout))
    reason = last.state_reason.split("\n", 1)[0]
    if len(reason) > 200:
        reason = reason[:197] + "..."
    return WaitTimeout("job %s did not end within %gs: it is %s%s" % (
        job_id, timeout, last.state, " (%s)" % reason if reason else ""), job=last)


def _exists(path):
    return TrainctlError(grpc.StatusCode.ALREADY_EXISTS, "%s exists; not overwritten (force=True to replace it)" % path)


def _checked(parse):
    """parse(), with a job spec's errors as INVALID_ARGUMENT (one per line)."""
    try:
        return parse()
    except jobspec.SpecErrors as e:
        raise _invalid(str(e)) from None


def _job_state(state):
    if isinstance(state, str):
        try:
            return job_pb2.JobState.Value("JOB_STATE_" + state.upper())
        except ValueError:
            raise _invalid("states: unknown state '%s'; one of pending, scheduled, running, restarting, succeeded, "
                           "failed, cancelled" % state) from None
    return state


def _default_out_name(job_id, step):
    """"<job>-model.pt" or "<job>-step-<N>.pt" in the current directory, whatever the id holds."""
    job = job_id.replace("/", "_")
    if not job or job.startswith("."):
        job = "job" + job
    return "%s-step-%d.pt" % (job, step) if step > 0 else "%s-model.pt" % job


class _PrivateFile:
    """A new file at ``path``, mode 0600 (common/safe_file.h's SafeFileWriter):
    written under a random temporary name beside it, created with
    O_EXCL|O_NOFOLLOW (a planted link is never written through), fsync'ed,
    then renamed into place by commit(); without ``replace`` an existing
    file at ``path`` is kept (ALREADY_EXISTS). Left without commit(), the
    temporary file is removed."""

    def __init__(self, path, replace):
        self.path = path
        self.replace = replace
        directory, self.name = os.path.split(path)
        if not self.name:
            raise _invalid("path: %r names a directory, not a file" % path)
        self.temp = "%s.tmp.%s" % (self.name, secrets.token_hex(8))
        self.dir_fd = self.fd = -1
        try:
            self.dir_fd = os.open(directory or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            self.fd = os.open(self.temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                              0o600, dir_fd=self.dir_fd)
        except OSError as e:
            self._abandon()
            raise _os_error("creating", path, e) from None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._abandon()

    def write(self, data):
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self.fd, view):]
        except OSError as e:
            raise _os_error("writing", self.path, e) from None

    def commit(self):
        try:
            os.fsync(self.fd)
            os.close(self.fd)
            self.fd = -1
            if self.replace:
                os.rename(self.temp, self.name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
            else:
                # link never replaces an existing name (nor follows a link there).
                os.link(self.temp, self.name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd, follow_symlinks=False)
                os.unlink(self.temp, dir_fd=self.dir_fd)
            self.temp = None
            os.fsync(self.dir_fd)
        except FileExistsError:
            raise _exists(self.path) from None
        except OSError as e:
            raise _os_error("renaming a new file into", self.path, e) from None

    def _abandon(self):
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self.dir_fd >= 0:
            if self.temp is not None:
                try:
                    os.unlink(self.temp, dir_fd=self.dir_fd)
                except OSError:
                    pass
            os.close(self.dir_fd)
            self.dir_fd = -1


def _os_error(what, path, e):
    """An OSError as common/safe_file.h maps errno to a code."""
    codes = {errno.ENOSPC: grpc.StatusCode.RESOURCE_EXHAUSTED, errno.EDQUOT: grpc.StatusCode.RESOURCE_EXHAUSTED,
             errno.EACCES: grpc.StatusCode.PERMISSION_DENIED, errno.EPERM: grpc.StatusCode.PERMISSION_DENIED,
             errno.EROFS: grpc.StatusCode.PERMISSION_DENIED, errno.EEXIST: grpc.StatusCode.ALREADY_EXISTS,
             errno.ENOENT: grpc.StatusCode.NOT_FOUND, errno.ENOTDIR: grpc.StatusCode.NOT_FOUND}
    return TrainctlError(codes.get(e.errno, grpc.StatusCode.INTERNAL), "%s '%s': %s" % (what, path, e.strerror))
