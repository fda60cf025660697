"""What a job leaves behind, as the client reads it (internal): metrics,
log lines and artifacts (fetch), each over a stream resumed after a break.
Client inherits the methods here; Artifact is importable from
trainctl.client.
"""

import contextlib
import dataclasses
import errno
import os
import secrets
import zlib

import grpc

from trainctl._transport import TrainctlError, _invalid
from trainctl.v1 import job_pb2, job_service_pb2, metrics_pb2


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


class _Outputs:
    """Client's metrics, logs and fetch. Uses the Client's get, _job_id,
    _watch, _unary, _resumed and _metadata."""

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


def _exists(path):
    return TrainctlError(grpc.StatusCode.ALREADY_EXISTS, "%s exists; not overwritten (force=True to replace it)" % path)


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
