"""The trainctl Python client's transport (internal): channels to the
coordinators of an address list, the failover rule of a unary call, server
streams resumed after a break, and TrainctlError. trainctl/client.py's
docstring says what a caller sees; Client inherits the methods here.
"""

import ipaddress
import random
import re
import threading
import time

import grpc

from trainctl.v1 import job_service_pb2_grpc

# Largest message either side sends: a Job with many attempts, a log chunk.
_MAX_MESSAGE_BYTES = 16 << 20
# Keepalive as the CLI's channel (common/grpc_keepalive.h kClientKeepalive):
# a watch or log stream can sit idle for minutes behind NATs and proxies.
_CHANNEL_OPTIONS = [
    ("grpc.keepalive_time_ms", 30000),
    ("grpc.keepalive_timeout_ms", 10000),
    ("grpc.keepalive_permit_without_calls", 0),
    ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
]
# The standby contract (common/coordinator_failover.h): the metadata key that
# names the active coordinator, and how a standby's message starts.
ACTIVE_COORDINATOR_KEY = "trainctl-active-coordinator"
_STANDBY_PREFIX = "standby coordinator"
# HOST:PORT (DNS name, IPv4, or [IPv6]); port 1..65535 checked apart.
_HOST_PORT = re.compile(r"^(?:\[[0-9A-Fa-f:.%]+\]|[A-Za-z0-9._-]+):([0-9]+)$")
_SCHEMES = ("unix:", "unix-abstract:", "dns:", "ipv4:", "ipv6:", "vsock:")
# The last active coordinator per list, for this process.
_remembered = {}
_remembered_lock = threading.Lock()


def _is_host_port(entry):
    m = _HOST_PORT.match(entry)
    return bool(m) and 1 <= int(m.group(1)) <= 65535


def parse_coordinator_list(text, what="address"):
    """"a:7070, b:7070" -> ["a:7070", "b:7070"] (common/coordinator_failover.h's
    ParseCoordinatorList): HOST:PORT entries, or gRPC targets with a scheme.
    INVALID_ARGUMENT naming ``what`` and the entry otherwise."""
    if not text or not text.strip():
        raise _invalid("%s: empty (expected HOST:PORT[,HOST:PORT...])" % what)
    out = []
    for n, raw in enumerate(text.split(","), 1):
        entry = raw.strip()
        if not entry:
            raise _invalid("%s: entry %d of '%s' is empty (expected HOST:PORT[,HOST:PORT...])" % (what, n, text))
        if not (entry.startswith(_SCHEMES) or "://" in entry) and not _is_host_port(entry):
            raise _invalid("%s: '%s': expected HOST:PORT (port 1..65535; an IPv6 address in [brackets])"
                           % (what, entry))
        if entry in out:
            raise _invalid("%s: '%s' is listed twice" % (what, entry))
        out.append(entry)
    return out


def _active_hint(rpc_error):
    """The HOST:PORT a standby's UNAVAILABLE names, or None."""
    if rpc_error.code() != grpc.StatusCode.UNAVAILABLE:
        return None
    trailing = rpc_error.trailing_metadata() if hasattr(rpc_error, "trailing_metadata") else None
    for key, value in trailing or ():
        if key == ACTIVE_COORDINATOR_KEY:
            value = value.decode() if isinstance(value, bytes) else value
            return value if _is_host_port(value) else None
    return None


def _is_standby_answer(rpc_error):
    return rpc_error.code() == grpc.StatusCode.UNAVAILABLE and (rpc_error.details() or "").startswith(_STANDBY_PREFIX)


class TrainctlError(Exception):
    """A failed call: ``code`` is a grpc.StatusCode, ``message`` the reason."""

    def __init__(self, code, message):
        super().__init__(code, message)
        self.code = code
        self.message = message

    def __str__(self):
        return "%s: %s" % (self.code.name, self.message)


class _Breaks:
    """The breaks of one resumed stream (watch, logs(follow=True), fetch):
    when the current one began, and the pause before the next try (full
    jitter in [b/2, b], b doubling to 1 s: back within a second of the
    coordinator answering again)."""

    def __init__(self, reconnect_for):
        self._for, self._broke, self._backoff = reconnect_for, None, 0.1

    def next_pause(self, resumable, delivered):
        """The stream ended (not OK), having delivered something or not: the
        seconds to wait before opening it again, or None when its status is
        the answer (not ``resumable``, or broken for reconnect_for)."""
        now = time.monotonic()
        if delivered or self._broke is None:
            self._broke, self._backoff = now, 0.1
        if not resumable or now - self._broke >= self._for:
            return None
        pause = random.uniform(self._backoff / 2, self._backoff)
        self._backoff = min(self._backoff * 2, 1.0)
        return pause


class _WatchedChannel:
    """A channel and its connectivity, watched by one subscription for the
    channel's life (a subscription per call would leave gRPC's polling
    thread asking a channel closed meanwhile)."""

    def __init__(self, channel):
        self.channel = channel
        self._cond = threading.Condition()
        self._state = None
        self._was_ready = False
        self._subscribed = True
        channel.subscribe(self._on_state, try_to_connect=True)

    def _on_state(self, state):
        with self._cond:
            self._state = state
            self._was_ready |= state == grpc.ChannelConnectivity.READY
            self._cond.notify_all()

    def wait_ready(self, deadline):
        """"ready", "refused" (TRANSIENT_FAILURE: every address the name
        resolved to refused, so waiting longer only delays the error) or
        "silent" (nothing by ``deadline``, a monotonic time)."""
        with self._cond:
            while True:
                if self._state == grpc.ChannelConnectivity.READY:
                    return "ready"
                if self._state in (grpc.ChannelConnectivity.TRANSIENT_FAILURE, grpc.ChannelConnectivity.SHUTDOWN):
                    return "refused"
                if self._state == grpc.ChannelConnectivity.IDLE and self._was_ready:
                    # Idle after a quiet spell (it answered before): a call
                    # reconnects it.
                    return "ready"
                left = deadline - time.monotonic()
                if left <= 0:
                    return "silent"
                self._cond.wait(left)

    def close(self):
        if self._subscribed:
            self.channel.unsubscribe(self._on_state)
            self._subscribed = False
        self.channel.close()


def _error(rpc_error, address):
    """grpc.RpcError -> TrainctlError with the same code; connection problems name the address."""
    code, message = rpc_error.code(), rpc_error.details() or ""
    if code == grpc.StatusCode.UNAVAILABLE:
        message = "coordinator at %s unavailable: %s" % (address, message)
    elif code == grpc.StatusCode.DEADLINE_EXCEEDED:
        message = "coordinator at %s did not answer in time: %s" % (address, message)
    return TrainctlError(code, message)


def is_loopback_address(address):
    """Whether ``address`` reaches only this host: the rule of
    common/auth/secret.h's IsLoopbackAddress (which the coordinator and the
    C++ client use), kept the same: host localhost, an address in
    127.0.0.0/8 or ::1 (also "[::1]:P", ::ffff:127.x), or "unix:"; gRPC's
    "dns:///", "ipv4:", "ipv6:" prefixes looked through."""
    if address.startswith(("unix:", "unix-abstract:")):
        return True
    for prefix in ("dns:///", "ipv4:", "ipv6:"):
        if address.startswith(prefix):
            address = address[len(prefix):]
            break
    host = address
    if host.startswith("["):
        close = host.find("]")
        if close < 0:
            return False
        host = host[1:close]
    elif host.count(":") == 1:
        host = host.split(":", 1)[0]
    if host.lower() == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def _invalid(message):
    return TrainctlError(grpc.StatusCode.INVALID_ARGUMENT, message)


class _Transport:
    """Client's connection machinery. Uses the Client's fields: _lock,
    _channels, _addresses, _current, _next, _list_key, _has_token,
    _root_certs, _tls_server_name, _metadata, address, ca_file, timeout,
    watch_reconnect_for."""

    def _check_token_transport(self, address):
        # Also for an address a standby's hint leads to.
        if self._has_token and self._root_certs is None and not is_loopback_address(address):
            raise TrainctlError(grpc.StatusCode.FAILED_PRECONDITION, (
                "refusing to send the token in clear text to %s: it is not a loopback address and no CA is "
                "set; give the cluster CA (ca.crt) with ca=FILE, $TRAINCTL_CA or `ca:` in the config file "
                "(trainctl login --ca writes it) to use TLS") % address)

    def _make_channel(self, address):
        self._check_token_transport(address)
        # A subchannel of its own: a channel made after a failure dials at
        # once instead of inheriting gRPC's backoff from the broken one.
        options = list(_CHANNEL_OPTIONS) + [("grpc.use_local_subchannel_pool", 1)]
        if self._root_certs is None:
            return grpc.insecure_channel(address, options=options)
        # Without an override TLS verifies each address (a hinted one too)
        # for its own host name.
        if self._tls_server_name:
            options.append(("grpc.ssl_target_name_override", self._tls_server_name))
        creds = grpc.ssl_channel_credentials(root_certificates=self._root_certs)
        return grpc.secure_channel(address, creds, options=options)

    def _channel_for(self, address):
        with self._lock:
            entry = self._channels.get(address)
            if entry is None:
                entry = self._channels[address] = _WatchedChannel(self._make_channel(address))
            return entry

    def _forget(self, address):
        """The next call to ``address`` makes a channel afresh (this one may
        still carry another thread's call: it closes when unreferenced)."""
        with self._lock:
            self._channels.pop(address, None)

    def _answered(self, address):
        with self._lock:
            self._current = address
            if address in self._addresses:
                self._next = self._addresses.index(address)
        with _remembered_lock:
            _remembered[self._list_key] = address

    def _follow(self, hint):
        with self._lock:
            self._current = hint
            if hint in self._addresses:
                self._next = self._addresses.index(hint)

    def _unreachable(self, address):
        """``address`` could not serve: the next address of the list (after
        a hinted one, the entry after the one that named it)."""
        with self._lock:
            if self._current != address:
                return
            self._next = (self._next + 1) % len(self._addresses)
            self._current = self._addresses[self._next]

    @staticmethod
    def _wait_ready(entry, deadline):
        return entry.wait_ready(deadline)

    def _try_limit(self, deadline):
        """When to give up connecting to one address: with several, after
        3 s at most (a black hole must not use up the whole deadline)."""
        return deadline if len(self._addresses) == 1 else min(deadline, time.monotonic() + 3.0)

    def _connect(self):
        """Rounds over the list until ``timeout``: the first address that
        answers the connection will do; a round that finds none is followed
        by another after a short backoff, so a coordinator restarting or a
        standby taking over is waited for (as the C++ client's Connect)."""
        deadline = time.monotonic() + self.timeout
        backoff = 0.0
        while True:
            failures, tried = [], set()
            while len(tried) < len(self._addresses):
                address = self.active_address
                if address in self._addresses:
                    tried.add(address)
                started = time.monotonic()
                state = self._wait_ready(self._channel_for(address), self._try_limit(deadline))
                if state == "ready":
                    return
                failures.append("%s: %s" % (address, "connection failed" if state == "refused"
                                            else "no answer within %gs" % (time.monotonic() - started)))
                self._forget(address)
                self._unreachable(address)
                if time.monotonic() >= deadline:
                    break
            backoff = min(1.0, max(0.05, backoff * 2))
            if time.monotonic() + backoff >= deadline:
                break
            time.sleep(backoff)
        hint = ("is trainctl-coordinator running and listening there? a TLS coordinator also needs a CA"
                if not self.ca_file else
                "is trainctl-coordinator running there, and is its certificate signed by the CA in %s?" % self.ca_file)
        if len(self._addresses) == 1:
            if failures and "no answer" in failures[0]:
                message = "cannot reach the coordinator at %s: no answer within %gs" % (self.address, self.timeout)
            else:
                message = "cannot reach the coordinator at %s: connection failed (%s)" % (self.address, hint)
        else:
            message = "cannot reach any coordinator of %s: %s (%s)" % (self._list_key, "; ".join(failures), hint)
        raise TrainctlError(grpc.StatusCode.UNAVAILABLE, message)

    def _unary(self, name, request, idempotent=True, timeout=None):
        """JobService method ``name`` with the failover rule (module
        docstring), every try within ``timeout`` (default: the client's).
        A client-streaming method's ``request`` is a function that returns a
        fresh iterator of its messages for each try."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        backoff, last = 0.0, None
        while True:
            if last is not None:
                backoff = min(max(backoff * 2, 0.05), 1.0)
                if time.monotonic() + backoff >= deadline:
                    raise last
                time.sleep(backoff)
            address = self.active_address
            channel = self._channel_for(address)
            if self._wait_ready(channel, self._try_limit(deadline)) != "ready":
                # Never connected: nothing was sent, any call may go elsewhere.
                self._forget(address)
                self._unreachable(address)
                last = TrainctlError(grpc.StatusCode.UNAVAILABLE, "cannot reach the coordinator at %s" % address)
                continue
            method = getattr(job_service_pb2_grpc.JobServiceStub(channel.channel), name)
            try:
                result = method(request() if callable(request) else request,
                                timeout=max(0.0, deadline - time.monotonic()), metadata=self._metadata)
            except grpc.RpcError as e:
                last = _error(e, address)
                if e.code() != grpc.StatusCode.UNAVAILABLE:
                    if e.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                        self._answered(address)
                    raise last from None
                hint = _active_hint(e)
                if hint is not None:
                    self._follow(hint)  # a standby: the call did not run
                    continue
                if _is_standby_answer(e):
                    self._unreachable(address)  # a standby that knows no active one yet
                    continue
                if not idempotent:
                    raise last from None  # it may have run: never sent twice
                self._forget(address)
                self._unreachable(address)
                continue
            self._answered(address)
            return result

    def _resumed(self, open_call, resumable, deadline=None, what=""):
        """The items of a server stream that is opened again after a break
        (watch, logs, fetch): ``open_call(stub)`` opens it on the active
        coordinator, from where the caller's state says; a stream that broke
        is opened again while ``resumable()``, for up to watch_reconnect_for
        seconds after the break (_Breaks). A pause that would pass
        ``deadline`` ends it with DEADLINE_EXCEEDED, naming ``what``.
        Closing the generator cancels the stream."""
        breaks = _Breaks(self.watch_reconnect_for)
        while True:
            address = self.active_address
            call = open_call(job_service_pb2_grpc.JobServiceStub(self._channel_for(address).channel))
            delivered = False
            try:
                for item in call:
                    delivered = True
                    yield item
                return
            except grpc.RpcError as e:
                status = e
            finally:
                call.cancel()  # A no-op once the stream ended; stops it when the caller left the loop.
            broken = self._stream_ended(status, address, delivered)
            pause = breaks.next_pause(broken and resumable(), delivered)
            if pause is None:
                raise _error(status, address)
            if deadline is not None and time.monotonic() + pause >= deadline:
                raise TrainctlError(grpc.StatusCode.DEADLINE_EXCEEDED,
                                    "%s: %s" % (what, _error(status, address).message))
            time.sleep(pause)

    def _stream_ended(self, status, address, delivered):
        """A stream on ``address`` ended with ``status`` (after delivering or
        not): where the next one goes. True when it broke (not one the
        coordinator refused): UNAVAILABLE, or CANCELLED by a coordinator
        shutting down."""
        broken = status.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
        if delivered:
            self._answered(address)
        if broken:
            hint = _active_hint(status)
            if hint is not None:
                self._follow(hint)
            else:
                self._forget(address)  # a fresh channel dials at once
                self._unreachable(address)
        return broken
