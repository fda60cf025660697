"""What the Python client hands back about a job, with names instead of
numbers: the states and failure kinds of ``trainctl.v1`` (proto/trainctl/v1/
job.proto) as ``enum.IntEnum``s, and ``Job``, a read-only view of a
``trainctl.v1.Job`` message.

    job = client.get("mlp-2")
    if job.state is JobState.FAILED and job.failure_kind is FailureKind.HANG:
        print(job.id, "hung:", job.state_reason)

The enums mirror the proto's values one for one (same names without the
prefix, same numbers); python/client_test.py's EnumTest checks that against
the generated descriptors, so a value added to job.proto must be added here
too. Being IntEnums, they compare equal to the proto's ints
(``JobState.SUCCEEDED == job_pb2.JOB_STATE_SUCCEEDED``), and ``str()`` and
f-strings show the name ("SUCCEEDED").

No dependency: importing this module needs neither grpc nor protobuf.
"""

import datetime
import enum

__all__ = ["JobState", "AttemptState", "RankState", "FailureKind", "Job"]


class _Named(enum.IntEnum):
    """An IntEnum that prints as its name (Python 3.11's IntEnum prints the
    number) and reads a value a newer coordinator sends as a plain int."""

    def __str__(self):
        return self.name

    def __format__(self, spec):
        # "%d"-style specs still format the number.
        if spec and spec[-1] in "bcdoxXn":
            return format(int(self), spec)
        return format(self.name, spec)

    @classmethod
    def of(cls, value):
        """``cls(value)``, or the int itself when this client does not know it."""
        try:
            return cls(value)
        except ValueError:
            return value

    @classmethod
    def parse(cls, name):
        """A member from its name in any case ("succeeded", "SUCCEEDED"); ValueError naming the choices."""
        try:
            return cls[name.upper()]
        except KeyError:
            choices = ", ".join(m.name.lower() for m in cls if m.value != 0)
            raise ValueError("unknown %s '%s'; one of %s" % (cls.__name__, name, choices)) from None


class JobState(_Named):
    """trainctl.v1.JobState: where a job is in its life."""

    UNSPECIFIED = 0
    # Accepted and stored; waiting for enough free slots.
    PENDING = 1
    # Every rank placed; workers are starting rank processes and rendezvous.
    SCHEDULED = 2
    # Every rank of the current attempt reported ready; training.
    RUNNING = 3
    # An attempt failed with restarts left; the next attempt waits for slots.
    RESTARTING = 4
    # Terminal: every rank finished training.
    SUCCEEDED = 5
    # Terminal: a failure with no restarts left, or a configuration error.
    FAILED = 6
    # Terminal: cancelled by a user; no rank process is left.
    CANCELLED = 7
    # Terminal: ran past scheduling.max_runtime_s; stopped as a preemption is
    # (checkpoint first), so `trainctl resume` continues it.
    TIMEOUT = 8

    @property
    def terminal(self):
        """SUCCEEDED, FAILED, CANCELLED or TIMEOUT: the job will not change any more."""
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT)


class AttemptState(_Named):
    """trainctl.v1.AttemptState: one run of every rank of a job."""

    UNSPECIFIED = 0
    # Assignments sent; waiting for the rendezvous and every rank's ready.
    STARTING = 1
    # Every rank ready.
    RUNNING = 2
    # Terminal: every rank exited 0.
    SUCCEEDED = 3
    # Terminal: a rank failed or its worker was lost; the others were stopped.
    FAILED = 4
    # Terminal: stopped because the job was cancelled.
    CANCELLED = 5


class RankState(_Named):
    """trainctl.v1.RankState: one rank of one attempt."""

    UNSPECIFIED = 0
    # Placed on a worker; the worker has not confirmed yet.
    ASSIGNED = 1
    # The rank process was started and is joining the rendezvous.
    STARTING = 2
    # Communicator initialised; training.
    RUNNING = 3
    # Terminal: exited 0 after training.
    SUCCEEDED = 4
    # Terminal: exited non-zero, by a signal, or was lost with its worker.
    FAILED = 5
    # Terminal: stopped on the coordinator's request (cancel, peer failure).
    STOPPED = 6


class FailureKind(_Named):
    """trainctl.v1.FailureKind: why an attempt ended badly, which decides
    whether a restart can help (docs/failures.md)."""

    UNSPECIFIED = 0
    # Bad configuration: the job fails at once.
    CONFIG = 1
    # The rank process exited non-zero or raised while training.
    EXIT = 2
    # Killed by a signal the worker did not send (a crash).
    SIGNAL = 3
    # The rank's worker stopped heartbeating past its lease.
    WORKER_LOST = 4
    # The ranks stopped reporting progress (a hung collective).
    HANG = 5
    # A collective failed or timed out (a peer died).
    COLLECTIVE = 6
    # Rendezvous did not complete in time.
    RENDEZVOUS = 7
    # The rank process could not be started on its worker.
    LAUNCH = 8
    # A checkpoint write ran out of disk space.
    DISK_FULL = 9
    # A command job's program exited non-zero (or raised).
    USER_CODE = 10
    # A data file is unreadable or malformed: the job fails at once.
    DATA = 11
    # The rank ran out of memory: not restarted.
    OUT_OF_MEMORY = 12
    # NaN/Inf gradients or a collapsed loss scale (health.on_nan).
    NAN = 13
    # The job was cancelled; never restarted.
    CANCELLED = 14
    # A pre-flight check failed before any rank started.
    PREFLIGHT = 15
    # The checkpoint resumed from was missing or corrupt.
    RESUME = 16
    # The rank's cgroup refused a fork at resources.pids: not restarted.
    PROCESS_LIMIT = 17


def _time(ts):
    """A google.protobuf.Timestamp as an aware UTC datetime; None when unset."""
    if ts.seconds == 0 and ts.nanos == 0:
        return None
    return ts.ToDatetime(tzinfo=datetime.timezone.utc)


class Job:
    """A job as the coordinator recorded it when this was fetched: a
    read-only view of a ``trainctl.v1.Job`` message (``proto``) with names
    for its enums and datetimes for its times. A snapshot: ``client.get(job)``
    fetches a newer one.

    Every field of the message reads through (``job.spec``, ``job.progress``,
    ``job.checkpoints``, ``job.HasField(...)``), so code written for the
    message keeps working; the properties below add the friendly forms.
    """

    __slots__ = ("proto",)

    def __init__(self, proto):
        object.__setattr__(self, "proto", proto)

    # --- identity ---

    @property
    def id(self):
        """Assigned by the coordinator at submission, e.g. "train-7f3a2c"."""
        return self.proto.id

    @property
    def name(self):
        """The job's name (spec.name); several jobs may share one."""
        return self.proto.spec.name

    @property
    def owner(self):
        """The name of the token that submitted it ("" without tokens)."""
        return self.proto.owner

    @property
    def queue(self):
        return self.proto.spec.queue

    @property
    def world_size(self):
        return self.proto.spec.world_size

    # --- state ---

    @property
    def state(self):
        """A JobState (equal to the proto's int)."""
        return JobState.of(self.proto.state)

    @property
    def state_reason(self):
        """Why the job is in its state: what it waits for, or why it failed."""
        return self.proto.state_reason

    @property
    def done(self):
        """True once the job ended (SUCCEEDED, FAILED, CANCELLED or TIMEOUT)."""
        return self.state in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT)

    @property
    def succeeded(self):
        return self.state == JobState.SUCCEEDED

    @property
    def failure_kind(self):
        """Why the last attempt failed (a FailureKind), or None when it did
        not fail or there is none. Jobs from ``client.list()`` carry no
        attempts: ``client.get()`` one for this."""
        if not self.proto.attempts:
            return None
        kind = self.proto.attempts[-1].failure_kind
        return FailureKind.of(kind) if kind else None

    @property
    def attempts(self):
        """Every attempt (trainctl.v1.Attempt), oldest first; empty from list()."""
        return self.proto.attempts

    @property
    def restarts(self):
        """Restarts used so far (attempts - 1)."""
        return self.proto.restarts

    # --- times (aware UTC datetimes; None until they happen) ---

    @property
    def submitted(self):
        return _time(self.proto.submit_time)

    @property
    def started(self):
        return _time(self.proto.start_time)

    @property
    def finished(self):
        return _time(self.proto.end_time)

    # --- the rest of the message ---

    def __getattr__(self, name):
        if name == "proto":  # before __init__ (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self.proto, name)

    def __setattr__(self, name, value):
        raise AttributeError("Job is read-only; change the job through the client (cancel, resume)")

    def __dir__(self):
        return sorted(set(super().__dir__()) | {f.name for f in self.proto.DESCRIPTOR.fields})

    def __reduce__(self):
        return (Job, (self.proto,))

    def __eq__(self, other):
        if isinstance(other, Job):
            return self.proto == other.proto
        return NotImplemented

    __hash__ = None  # equal by content, which a newer snapshot changes

    def __repr__(self):
        text = "Job(id=%r, name=%r, state=%s" % (self.id, self.name, self.state)
        if self.failure_kind is not None:
            text += ", failure_kind=%s" % self.failure_kind
        return text + ")"
