"""A real S3 server on 127.0.0.1 for the storage tests, behind a proxy that injects faults.

::

    client (pyarrow, boto3, tnrec)
        |  http://127.0.0.1:<proxy port>      <- S3Server.endpoint
        v
    FaultProxy   rules: 503 SlowDown / dropped connection / slow response
        |  http://127.0.0.1:<moto port>       <- S3Server.moto_endpoint
        v
    moto's standalone server (ThreadedMotoServer): buckets and objects in memory

The proxy speaks HTTP/1.1 with keep-alive towards the client: it reads each request's
head and its body (``Content-Length`` or chunked) so it can treat requests one by one,
forwards the bytes unchanged on a fresh connection to moto, and forwards the response
the same way. It rewrites only hop-by-hop headers: ``Connection`` (``close`` towards
moto, keep-alive towards the client when the response is self-delimiting) and
``Expect: 100-continue``, which the proxy answers itself so a client never waits
for an interim response that moto would otherwise have to send.

Only the standard library runs the proxy; boto3 and moto come with ``moto[server]``.
"""

from __future__ import annotations

import collections
import dataclasses
import io
import logging
import socket
import socketserver
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

SLOWDOWN = "503"  # 503 with an S3 <Error><Code>SlowDown</Code> body
DROP = "drop"  # read the whole request, then close the socket without a response
SLOW = "slow"  # forward normally, but wait ``delay_ms`` before the response reaches the client
FAULT_KINDS = (SLOWDOWN, DROP, SLOW)

ACCESS_KEY = "testing"
SECRET_KEY = "testing"
REGION = "us-east-1"

_IO_TIMEOUT_S = 60.0  # an idle client connection or a stuck upstream ends, never hangs a test
_PIECE_BYTES = 1 << 16
_MAX_HEAD_BYTES = 1 << 16
_HOP_BY_HOP = {b"connection", b"keep-alive", b"proxy-connection", b"expect"}


@dataclasses.dataclass
class _Rule:
    kind: str
    remaining: int | None  # None: every matching request, for as long as the rule stands
    method: str | None
    path_contains: str | None
    delay_ms: int

    def matches(self, method: str, target: str) -> bool:
        if self.method is not None and method != self.method:
            return False
        return self.path_contains is None or self.path_contains in target


@dataclasses.dataclass(frozen=True)
class Seen:
    """One request the proxy received: ``target`` is the raw path and query string."""

    method: str
    target: str
    fault: str | None


class FaultProxy:
    """An HTTP proxy on 127.0.0.1 that forwards to ``upstream`` and injects faults by rule.

    Rules are tried in the order they were added; the first that matches a request
    decides its fault, and a ``fail_next`` rule is used up after ``count`` requests.
    ``method`` matches the HTTP method exactly (``"GET"``, ``"PUT"``, ``"HEAD"``, ...),
    ``path_contains`` is a substring of the raw request target (URL-encoded path and
    query), e.g. a key name or ``"uploadId="``.

    Example:
        >>> proxy = FaultProxy(("127.0.0.1", moto_port)).start()  # doctest: +SKIP
        >>> proxy.fail_next(SLOWDOWN, 1, method="GET", path_contains="part-0")  # doctest: +SKIP
        >>> proxy.injected_by_kind[SLOWDOWN]  # doctest: +SKIP
        1
    """

    def __init__(self, upstream: tuple[str, int], keep_alive: bool = True) -> None:
        self.upstream = upstream
        self.keep_alive = keep_alive
        self._lock = threading.Lock()
        self._rules: list[_Rule] = []
        self._injected: collections.Counter[str] = collections.Counter()
        self._requests: collections.Counter[str] = collections.Counter()
        self._log: list[Seen] = []
        self._connections = 0
        self._server: _ProxyServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> FaultProxy:
        """Listen on a free port of 127.0.0.1 and serve in a daemon thread."""
        server = _ProxyServer(("127.0.0.1", 0), _ProxyHandler)
        server.proxy = self
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, name="s3-fault-proxy", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening and close every open client connection."""
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        self._server.close_connections()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._server = None

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("internal error: FaultProxy.port read before start()")
        return int(self._server.server_address[1])

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:PORT``: what a client uses as its S3 endpoint."""
        return f"http://127.0.0.1:{self.port}"

    # -- rules -----------------------------------------------------------------------------

    def fail_next(
        self,
        kind: str,
        count: int = 1,
        method: str | None = None,
        path_contains: str | None = None,
        delay_ms: int = 300,
    ) -> None:
        """Inject ``kind`` into the next ``count`` requests that match."""
        if count < 1:
            raise ValueError(f"`count` must be a positive int. Received: count={count}")
        self._add(_Rule(_checked(kind), count, method, path_contains, delay_ms))

    def fail_always(
        self,
        kind: str,
        method: str | None = None,
        path_contains: str | None = None,
        delay_ms: int = 300,
    ) -> None:
        """Inject ``kind`` into every matching request until ``clear()``."""
        self._add(_Rule(_checked(kind), None, method, path_contains, delay_ms))

    def clear(self) -> None:
        """Remove every rule and reset the counters and the log."""
        with self._lock:
            self._rules.clear()
        self.reset_counters()

    def reset_counters(self) -> None:
        """Reset the counters and the log; the rules stay."""
        with self._lock:
            self._injected.clear()
            self._requests.clear()
            self._log.clear()
            self._connections = 0

    def _add(self, rule: _Rule) -> None:
        with self._lock:
            self._rules.append(rule)

    def _take(self, method: str, target: str) -> _Rule | None:
        """Count the request, and use up the first rule that matches it (if any)."""
        with self._lock:
            self._requests[method] += 1
            rule = next((r for r in self._rules if r.matches(method, target)), None)
            if rule is not None:
                self._injected[rule.kind] += 1
                if rule.remaining is not None:
                    rule.remaining -= 1
                    if rule.remaining == 0:
                        self._rules.remove(rule)
            self._log.append(Seen(method, target, rule.kind if rule else None))
            return rule

    # -- counters (copies, safe to keep) ---------------------------------------------------

    @property
    def injected(self) -> int:
        """Faults injected so far, all kinds together."""
        with self._lock:
            return sum(self._injected.values())

    @property
    def injected_by_kind(self) -> collections.Counter[str]:
        """Faults injected so far, by kind (``"503"``, ``"drop"``, ``"slow"``)."""
        with self._lock:
            return collections.Counter(self._injected)

    @property
    def requests(self) -> collections.Counter[str]:
        """Requests received so far (faulted ones included), by HTTP method."""
        with self._lock:
            return collections.Counter(self._requests)

    @property
    def log(self) -> list[Seen]:
        """Every request received so far, in order, with the fault it got."""
        with self._lock:
            return list(self._log)

    @property
    def connections(self) -> int:
        """Client connections accepted so far (keep-alive serves many requests on one)."""
        with self._lock:
            return self._connections

    def _connected(self) -> None:
        with self._lock:
            self._connections += 1

    @property
    def pending(self) -> int:
        """How many rules still stand (a used-up ``fail_next`` rule is gone)."""
        with self._lock:
            return len(self._rules)


def _checked(kind: str) -> str:
    if kind not in FAULT_KINDS:
        raise ValueError(f"`kind` must be one of {FAULT_KINDS}. Received: kind={kind!r}")
    return kind


# -- HTTP plumbing ---------------------------------------------------------------------------


class _ProxyServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    block_on_close = False
    proxy: FaultProxy

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()

    def track(self, sock: socket.socket, is_open: bool) -> None:
        with self._open_lock:
            (self._open.add if is_open else self._open.discard)(sock)

    def close_connections(self) -> None:
        with self._open_lock:
            for sock in self._open:
                _shutdown(sock)
            self._open.clear()


@dataclasses.dataclass
class _Head:
    start: bytes  # request line or status line, without CRLF
    headers: list[tuple[bytes, bytes]]  # names and values as received

    def get(self, name: bytes) -> bytes | None:
        return next((v for k, v in self.headers if k.lower() == name), None)

    def encode(self, connection: bytes) -> bytes:
        kept = [(k, v) for k, v in self.headers if k.lower() not in _HOP_BY_HOP]
        lines = [self.start] + [k + b": " + v for k, v in kept] + [b"Connection: " + connection]
        return b"\r\n".join(lines) + b"\r\n\r\n"


def _read_head(rfile: io.BufferedIOBase) -> _Head | None:
    """Read a request or response head; None at a clean end of the connection."""
    start = rfile.readline(_MAX_HEAD_BYTES)
    while start in (b"\r\n", b"\n"):  # tolerated between messages (RFC 9112 2.2)
        start = rfile.readline(_MAX_HEAD_BYTES)
    if not start:
        return None
    headers: list[tuple[bytes, bytes]] = []
    while True:
        line = rfile.readline(_MAX_HEAD_BYTES)
        if not line:
            raise ConnectionError("connection closed inside an HTTP head")
        if line in (b"\r\n", b"\n"):
            return _Head(start.rstrip(b"\r\n"), headers)
        name, _, value = line.partition(b":")
        headers.append((name.strip(), value.strip()))


def _body(rfile: io.BufferedIOBase, head: _Head, has_body: bool = True) -> Iterator[bytes]:
    """Yield the raw bytes of the message body that follows ``head``, framing included."""
    if not has_body:
        return
    encoding = (head.get(b"transfer-encoding") or b"").lower()
    if b"chunked" in encoding:
        yield from _chunked(rfile)
    elif head.get(b"content-length") is not None:
        yield from _exactly(rfile, int(head.get(b"content-length") or b"0"))
    elif head.start.startswith(b"HTTP/"):  # a response without framing runs to EOF
        while piece := rfile.read1(_PIECE_BYTES):
            yield piece


def _exactly(rfile: io.BufferedIOBase, size: int) -> Iterator[bytes]:
    while size > 0:
        piece = rfile.read(min(size, _PIECE_BYTES))
        if not piece:
            raise ConnectionError("connection closed inside an HTTP body")
        size -= len(piece)
        yield piece


def _chunked(rfile: io.BufferedIOBase) -> Iterator[bytes]:
    while True:
        line = rfile.readline(_MAX_HEAD_BYTES)
        if not line:
            raise ConnectionError("connection closed inside a chunked body")
        yield line
        size = int(line.split(b";")[0].strip(), 16)
        if size == 0:
            break
        yield from _exactly(rfile, size + 2)  # the chunk and its CRLF
    while True:  # trailers, then the empty line
        line = rfile.readline(_MAX_HEAD_BYTES)
        if not line:
            raise ConnectionError("connection closed inside chunked trailers")
        yield line
        if line in (b"\r\n", b"\n"):
            return


def _wants_keep_alive(head: _Head) -> bool:
    connection = (head.get(b"connection") or b"").lower()
    if head.start.endswith(b"HTTP/1.0"):
        return b"keep-alive" in connection
    return b"close" not in connection


def _response_has_body(method: str, status: int) -> bool:
    return method != "HEAD" and status not in (204, 304) and not 100 <= status < 200


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed by the peer
    sock.close()


def slowdown_response(method: str, target: str, keep_alive: bool) -> bytes:
    """A 503 SlowDown as S3 sends it (no body for a HEAD, as HTTP requires)."""
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        "<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message>"
        f"<Resource>{target.split('?')[0]}</Resource>"
        f"<RequestId>{uuid.uuid4().hex[:16].upper()}</RequestId></Error>"
    ).encode()
    head = (
        "HTTP/1.1 503 Slow Down\r\n"
        "Content-Type: application/xml\r\n"
        f"Content-Length: {len(body)}\r\n"
        f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n"
    ).encode()
    return head if method == "HEAD" else head + body


class _ProxyHandler(socketserver.StreamRequestHandler):
    server: _ProxyServer

    def setup(self) -> None:
        self.request.settimeout(_IO_TIMEOUT_S)
        # a head and a small body go out as two writes: without this, Nagle's algorithm
        # holds the second until the client's delayed ACK (40 ms per request)
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.track(self.request, True)
        self.server.proxy._connected()
        super().setup()

    def finish(self) -> None:
        try:
            super().finish()
        except OSError:
            pass  # the client went away; nothing to flush to
        self.server.track(self.request, False)

    def handle(self) -> None:
        try:
            while (head := _read_head(self.rfile)) is not None:
                if not self._one_request(head):
                    return
        except (OSError, ValueError):
            return  # a client that hangs up mid-request, or a dropped upstream: end quietly

    def _one_request(self, head: _Head) -> bool:
        """Serve one request; return whether the client connection stays open."""
        method, target = head.start.decode("latin-1").split(" ")[:2]
        proxy = self.server.proxy
        rule = proxy._take(method, target)
        keep_alive = proxy.keep_alive and _wants_keep_alive(head)
        if (head.get(b"expect") or b"").lower() == b"100-continue":
            self.wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        if rule is not None and rule.kind in (SLOWDOWN, DROP):
            for _ in _body(self.rfile, head):
                pass  # read (and drop) the whole request, as a server that fails it would
            if rule.kind == DROP:
                return False
            self.wfile.write(slowdown_response(method, target, keep_alive))
            return keep_alive
        delay_s = rule.delay_ms / 1000 if rule is not None else 0.0
        return self._forward(method, head, keep_alive, delay_s)

    def _forward(self, method: str, head: _Head, keep_alive: bool, delay_s: float) -> bool:
        upstream = socket.create_connection(self.server.proxy.upstream, timeout=_IO_TIMEOUT_S)
        upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            upstream.sendall(head.encode(b"close"))
            for piece in _body(self.rfile, head):
                upstream.sendall(piece)
            with upstream.makefile("rb") as urfile:
                response = _read_head(urfile)
                if response is None:
                    raise ConnectionError("the S3 server closed without a response")
                status = int(response.start.split(b" ")[1])
                framed = not _response_has_body(method, status) or (
                    response.get(b"content-length") is not None
                    or b"chunked" in (response.get(b"transfer-encoding") or b"").lower()
                )
                keep_alive = keep_alive and framed
                time.sleep(delay_s)
                self.wfile.write(response.encode(b"keep-alive" if keep_alive else b"close"))
                for piece in _body(urfile, response, _response_has_body(method, status)):
                    self.wfile.write(piece)
        finally:
            upstream.close()
        return keep_alive


# -- moto + proxy ----------------------------------------------------------------------------


def unique_bucket_name(prefix: str = "tnrec-test") -> str:
    """A valid S3 bucket name no other test uses: lower case, under 63 characters."""
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


class S3Server:
    """moto's standalone S3 server on 127.0.0.1 with a ``FaultProxy`` in front of it.

    Example:
        >>> server = S3Server().start()  # doctest: +SKIP
        >>> server.create_bucket("b")  # doctest: +SKIP
        >>> fs = pyarrow_s3(server.endpoint)  # doctest: +SKIP
        >>> server.stop()  # doctest: +SKIP
    """

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        self.moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.proxy: FaultProxy | None = None

    def start(self) -> S3Server:
        # werkzeug logs every request moto serves at INFO, to stderr
        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        self.moto.start()
        self.proxy = FaultProxy(self.moto.get_host_and_port()).start()
        return self

    def stop(self) -> None:
        if self.proxy is not None:
            self.proxy.stop()
        self.moto.stop()
        # ThreadedMotoServer.stop() shuts the server down but leaves its socket open
        inner = getattr(self.moto, "_server", None)
        if inner is not None:
            inner.server_close()

    @property
    def moto_endpoint(self) -> str:
        host, port = self.moto.get_host_and_port()
        return f"http://{host}:{port}"

    @property
    def endpoint(self) -> str:
        """The proxy's URL: what the code under test talks to."""
        if self.proxy is None:
            raise RuntimeError("internal error: S3Server.endpoint read before start()")
        return self.proxy.endpoint

    def client(self, via_proxy: bool = False) -> Any:
        """A boto3 S3 client, straight to moto unless ``via_proxy``."""
        return boto3_s3(self.endpoint if via_proxy else self.moto_endpoint)

    def create_bucket(self, name: str) -> None:
        self.client().create_bucket(Bucket=name)

    def delete_bucket(self, name: str) -> None:
        """Delete ``name`` with every object and unfinished multipart upload in it."""
        client = self.client()
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=name):
            for item in page.get("Contents", []):
                client.delete_object(Bucket=name, Key=item["Key"])
        for upload in client.list_multipart_uploads(Bucket=name).get("Uploads", []):
            client.abort_multipart_upload(
                Bucket=name, Key=upload["Key"], UploadId=upload["UploadId"]
            )
        client.delete_bucket(Bucket=name)


def pyarrow_s3(endpoint: str, max_attempts: int = 3, **kwargs: Any) -> Any:
    """A ``pyarrow.fs.S3FileSystem`` on ``endpoint`` (``http://host:port``) with test keys.

    ``max_attempts`` counts the first try: 1 disables pyarrow's own retries.
    """
    from pyarrow import fs

    scheme, _, host = endpoint.partition("://")
    return fs.S3FileSystem(
        endpoint_override=host,
        scheme=scheme,
        region=REGION,
        access_key=ACCESS_KEY,
        secret_key=SECRET_KEY,
        retry_strategy=fs.AwsStandardS3RetryStrategy(max_attempts=max_attempts),
        **kwargs,
    )


def boto3_s3(endpoint: str, max_attempts: int = 1) -> Any:
    """A boto3 S3 client on ``endpoint`` with test keys; ``max_attempts`` counts the first try."""
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        region_name=REGION,
        config=Config(retries={"total_max_attempts": max_attempts, "mode": "standard"}),
    )
