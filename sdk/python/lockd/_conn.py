"""Connections: transport security, bearer tokens and several addresses
(docs/contracts/C2.md #ct2-failover, #ct2-sdk rules 8 and 10).

A client of several addresses uses one at a time (one gRPC channel per
address, made when first used). An address whose call or stream got no
answer (UNAVAILABLE without a lockd reason: the replica died, its connection
broke), that drains (a ``draining`` answer, SHUTTING_DOWN) or whose stream
stalled is set aside for 30 s and the next one is used; when every address
is set aside the asides are forgotten. A retryable answer of a live replica
(CONTENTION, NOT_LEADER, UNAVAILABLE with its reason) keeps it. A stall does not set aside
the last address not aside (every replica slow must not make the client hop
between them); a drain does.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
import time

import grpc

from . import errors
from .v1 import lockd_pb2_grpc

ASIDE_FOR = 30.0

log = logging.getLogger("lockd")

# gRPC keepalive pings find a dead connection; the SDK retries by itself.
# No bandwidth-delay PING after each reply, as the Go SDK's static windows
# (client/client.go): replies are small. (The C core still sends a
# WINDOW_UPDATE after each reply; the chaos far link ignores those.)
_CHANNEL_OPTIONS = [
    ("grpc.keepalive_time_ms", 30000),
    ("grpc.enable_retries", 0),
    ("grpc.http2.bdp_probe", 0),
]


def loopback(addr: str) -> bool:
    """Whether host:port (or unix:...) is on loopback."""
    if addr.startswith("unix:") or addr.startswith("unix-abstract:"):
        return True
    host = addr
    if "://" in host:
        return False
    if host.startswith("["):
        host = host[1:host.find("]")] if "]" in host else host
    elif host.count(":") == 1:
        host = host.rsplit(":", 1)[0]
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class TLS:
    """TLS settings: a PEM CA bundle (None: the system roots), a client
    certificate and key for mutual TLS (both or neither), and the name to
    verify in the server's certificate (None: the address's host)."""

    def __init__(self, ca_file: str | None = None, cert_file: str | None = None, key_file: str | None = None,
                 server_name: str | None = None):
        if bool(cert_file) != bool(key_file):
            raise errors.InvalidArgument("tls: give both cert_file and key_file, or neither", field="tls")
        self.ca_file, self.cert_file, self.key_file, self.server_name = ca_file, cert_file, key_file, server_name

    def credentials(self) -> grpc.ChannelCredentials:
        """The gRPC channel credentials of these settings; the files are read now
        (InvalidArgument naming a file that cannot be read)."""
        def read(p):
            if not p:
                return None
            try:
                with open(p, "rb") as f:
                    return f.read()
            except OSError as e:
                raise errors.InvalidArgument(f"tls: cannot read {p}: {e.strerror}", field="tls") from None
        return grpc.ssl_channel_credentials(root_certificates=read(self.ca_file),
                                            private_key=read(self.key_file),
                                            certificate_chain=read(self.cert_file))


def read_token_file(path: str) -> str:
    """A bearer token file's content, whitespace trimmed; errors name the file, never its content."""
    try:
        with open(path, encoding="utf-8") as f:
            tok = f.read().strip()
    except (OSError, UnicodeDecodeError) as e:
        raise errors.InvalidArgument(f"bearer token file {path}: {e}", field="token_file") from None
    if not tok:
        raise errors.InvalidArgument(f"bearer token file {path} is empty", field="token_file")
    if "\n" in tok or "\r" in tok:
        raise errors.InvalidArgument(f"bearer token file {path} holds more than one line", field="token_file")
    return tok


class Conn:
    """The channels of a client and which address is in use."""

    def __init__(self, addresses: list[str], tls: TLS | None, insecure: bool, token: str | None, now=time.monotonic,
                 stub_factory=None, backoff: tuple[float, float] = (0.05, 2.0)):
        if not addresses:
            raise errors.InvalidArgument("no address", field="target")
        for a in addresses:
            if not a or "," in a or "://" in a:
                raise errors.InvalidArgument(f"address {a!r}: want host:port", field="target")
        remote = [a for a in addresses if not loopback(a)]
        if tls is not None and insecure:
            raise errors.InvalidArgument("give tls or insecure, not both", field="tls")
        if tls is None and remote and not insecure:
            raise errors.InvalidArgument(
                f"plaintext to {remote[0]}, which is not a loopback address: give tls=lockd.TLS(...), "
                "or insecure=True to send plaintext anyway", field="tls")
        if token is not None:
            if not token or "\n" in token or "\r" in token:
                raise errors.InvalidArgument("bearer token is empty or holds a line break", field="token")
            if tls is None and remote:
                raise errors.InvalidArgument(
                    f"a bearer token is sent only over TLS to {remote[0]}, which is not a loopback address",
                    field="token")
        self.addresses = list(addresses)
        self._tls, self._creds = tls, (tls.credentials() if tls is not None else None)
        self.metadata = (("authorization", "Bearer " + token),) if token else ()
        self._now = now
        self._mu = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}
        self._stubs: dict[str, lockd_pb2_grpc.LockServiceStub] = {}
        self._cur = 0
        self._aside: dict[str, float] = {}
        self._closed = False
        self._stub_factory = stub_factory  # tests: a fake LockService per address
        # The channel reconnects within the SDK's backoff bounds too, not
        # after gRPC's default (1 s growing to 120 s): C2 #ct2-sdk rule 11.
        # grpc.min_reconnect_backoff_ms too: the sync channel (gRPC's C core)
        # waits about that long between later attempts (its default, 20 s,
        # left a sync client attempts at 0, 1 and 5 s), and it is also the
        # time one attempt may take, so never under a second (a TLS handshake
        # on a loaded machine).
        self._reconnect = [("grpc.initial_reconnect_backoff_ms", max(1, int(backoff[0] * 1000))),
                           ("grpc.max_reconnect_backoff_ms", max(1, int(backoff[1] * 1000))),
                           ("grpc.min_reconnect_backoff_ms", max(1000, int(backoff[1] * 1000)))]

    def __repr__(self) -> str:  # never shows the token
        return f"Conn({','.join(self.addresses)})"

    @property
    def several(self) -> bool:
        return len(self.addresses) > 1

    def pick(self):
        """(address, stub) to use now."""
        with self._mu:
            if self._closed:
                raise errors.Closed("client closed")
            now = self._now()
            n = len(self.addresses)
            for i in range(n):
                a = self.addresses[(self._cur + i) % n]
                if self._aside.get(a, 0) <= now:
                    self._cur = (self._cur + i) % n
                    break
            else:
                self._aside.clear()
            a = self.addresses[self._cur]
            stub = self._stubs.get(a)
            if stub is None and self._stub_factory is not None:
                stub = self._stubs[a] = self._stub_factory(a)
            if stub is None:
                opts = list(_CHANNEL_OPTIONS) + self._reconnect
                if self._tls is not None and self._tls.server_name:
                    opts.append(("grpc.ssl_target_name_override", self._tls.server_name))
                ch = self._dial(a, opts)
                self._channels[a] = ch
                stub = self._stubs[a] = lockd_pb2_grpc.LockServiceStub(ch)
            return a, stub

    def _dial(self, addr: str, opts):
        """A channel to addr (lockd.aio's Conn makes grpc.aio channels)."""
        if self._creds is not None:
            return grpc.secure_channel(addr, self._creds, options=opts)
        return grpc.insecure_channel(addr, options=opts)

    def set_aside(self, addr: str, draining: bool = False) -> bool:
        """Avoids addr for a while; False when there is nowhere else to go (one
        address; or, unless draining, every other address already aside)."""
        with self._mu:
            if len(self.addresses) < 2:
                return False
            now = self._now()
            others = [a for a in self.addresses if a != addr and self._aside.get(a, 0) <= now]
            if not others:
                if not draining:
                    return False
                self._aside.clear()
            self._aside[addr] = now + ASIDE_FOR
            if self.addresses[self._cur] == addr:
                self._cur = (self._cur + 1) % len(self.addresses)
            log.debug("address %s set aside (draining: %s); next %s", addr, draining, self.addresses[self._cur])
            return True

    def after_error(self, addr: str, err: errors.LockdError) -> None:
        """Moves on after a retryable error of a call or stream to addr, as
        C2 #ct2-sdk rule 8 says: SHUTTING_DOWN sets addr aside as draining; an
        UNAVAILABLE without a lockd reason (no answer from the replica: it
        died, its connection broke, a watch stream went silent) fails it. A
        retryable answer of a live replica (CONTENTION, NOT_LEADER, UNAVAILABLE
        with its reason: its backend's trouble, which every replica shares)
        keeps it, as the Go and TypeScript SDKs do: setting it aside could
        leave every address aside and send the next call back to a dead one."""
        if isinstance(err, errors.ShuttingDown):
            self.set_aside(addr, draining=True)
        elif isinstance(err, errors.Unavailable) and not err.reason:
            self.failed(addr)

    def failed(self, addr: str) -> None:
        """A call or stream to addr failed with UNAVAILABLE (the replica died,
        or its connection broke): avoid it for a while and move on, if there
        is another address. When every address is aside, pick() forgets the
        asides and tries them again."""
        with self._mu:
            if len(self.addresses) < 2:
                return
            self._aside[addr] = self._now() + ASIDE_FOR
            if self.addresses[self._cur] == addr:
                self._cur = (self._cur + 1) % len(self.addresses)
            log.debug("address %s failed; next %s", addr, self.addresses[self._cur])

    def _take_channels(self) -> list:
        with self._mu:
            self._closed = True
            chans = list(self._channels.values())
            self._channels.clear()
            self._stubs.clear()
        return chans

    def close(self) -> None:
        for ch in self._take_channels():
            ch.close()
