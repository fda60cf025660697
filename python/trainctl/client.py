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
import os
import secrets
import shutil
import tempfile
import threading
import time

import grpc

try:
    from trainctl.v1 import job_pb2, job_service_pb2
except ImportError as e:  # pragma: no cover - depends on the installation
    raise ImportError(
        "trainctl.client needs the generated trainctl.v1 stubs: run python/gen_stubs.sh DIR and set "
        "TRAINCTL_PYTHON_STUBS=DIR, or install the package (cmake --install): %s" % e) from e

from trainctl import codepack, jobspec
# ACTIVE_COORDINATOR_KEY and is_loopback_address are this module's API too.
from trainctl._transport import (ACTIVE_COORDINATOR_KEY, TrainctlError, _invalid, _remembered,  # noqa: F401
                                 _remembered_lock, _Transport, is_loopback_address, parse_coordinator_list)
from trainctl._outputs import Artifact, _Outputs
from trainctl._settings import (DEFAULT_COORDINATOR, _checked, config_file_path,  # noqa: F401
                                resolve_settings, script_job_spec)
from trainctl.jobs import AttemptState, FailureKind, Job, JobState, RankState

__all__ = ["Client", "TrainctlError", "WaitTimeout", "Artifact", "Job", "JobState", "AttemptState", "RankState",
           "FailureKind", "script_job_spec", "resolve_settings", "parse_coordinator_list"]

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
class CancelledJobs:
    """What ``Client.cancel_jobs`` did (or, with dry_run, would do)."""

    # The jobs cancelled (dry_run: that would be), by id.
    job_ids: list
    count: int
    # Nothing was cancelled.
    dry_run: bool


# --- where the coordinator is ------------------------------------------------


class Client(_Outputs, _Transport):
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

def _wait_timeout(job_id, timeout, last):
    if last is None:
        return WaitTimeout("job %s did not end within %gs" % (job_id, timeout))
    reason = last.state_reason.split("\n", 1)[0]
    if len(reason) > 200:
        reason = reason[:197] + "..."
    return WaitTimeout("job %s did not end within %gs: it is %s%s" % (
        job_id, timeout, last.state, " (%s)" % reason if reason else ""), job=last)



def _job_state(state):
    if isinstance(state, str):
        try:
            return job_pb2.JobState.Value("JOB_STATE_" + state.upper())
        except ValueError:
            raise _invalid("states: unknown state '%s'; one of pending, scheduled, running, restarting, succeeded, "
                           "failed, cancelled" % state) from None
    return state


