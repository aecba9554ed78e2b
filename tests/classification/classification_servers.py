"""Local servers the classification corpus talks to (127.0.0.1 only, never the internet).

Every exception in the corpus is raised by a real client library making a real call, so the
corpus needs real peers that fail the way production peers fail:

* ``ScriptedHTTPServer``: answers ``/s/<scenario>/...`` with a scripted status, headers and
  body copied from the providers' documented error bodies, or misbehaves on the wire
  (connection reset, closed without a response, truncated chunked body, redirect loop).
* ``blackhole``: a listening socket that never accepts: connects succeed, reads time out.
* ``full_backlog``: a listening socket whose accept queue is full: connects time out.
* ``closed_port``: a bound, non-listening socket: connects are refused and nobody else can
  grab the port while the corpus is built.
* ``GrpcScenarioServer``: a real grpc server with generic method handlers on bytes that
  aborts with the status code named by the method.
* ``RespServer``: a tiny RESP (Redis protocol) server answering scripted error lines, so
  redis-py raises its own exception classes.  Written by hand because the point is to make
  a *real* redis-server's rare replies (LOADING, BUSY, NOAUTH, ...) happen on demand.
* ``PgServer``: a tiny PostgreSQL wire-protocol server that fails the startup or a query
  with a scripted SQLSTATE, so libpq/psycopg raise their own exception classes.  Written by
  hand for the same reason (no installed PostgreSQL, and the failures must be on demand).
"""

from __future__ import annotations

import json
import socket
import socketserver
import struct
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc

LOCALHOST = "127.0.0.1"


# --------------------------------------------------------------------------- HTTP


@dataclass(frozen=True)
class Scripted:
    """One scripted HTTP answer.

    ``behavior`` is ``"respond"`` (status/headers/body), ``"reset"`` (TCP RST after reading
    the request), ``"close"`` (close without a response), ``"truncated"`` (chunked body cut
    off mid-stream) or ``"redirect_loop"`` (302 to itself, forever).
    """

    status: int = 200
    body: Any = None  # dict/list -> JSON, str -> text, bytes -> raw
    headers: Mapping[str, str] = field(default_factory=dict)
    content_type: str | None = None
    behavior: str = "respond"

    def encoded(self) -> tuple[bytes, str]:
        if isinstance(self.body, bytes):
            return self.body, self.content_type or "application/octet-stream"
        if isinstance(self.body, str):
            return self.body.encode(), self.content_type or "text/plain; charset=utf-8"
        if self.body is None:
            return b"", self.content_type or "text/plain"
        return json.dumps(self.body).encode(), self.content_type or "application/json"


class _Handler(BaseHTTPRequestHandler):
    server: ScriptedHTTPServer
    protocol_version = "HTTP/1.0"

    def log_message(self, format: str, *args: Any) -> None:  # quiet test output
        pass

    def _scenario(self) -> Scripted:
        parts = self.path.split("?", 1)[0].split("/")
        # /s/<name>/...
        if len(parts) >= 3 and parts[1] == "s" and parts[2] in self.server.routes:
            return self.server.routes[parts[2]]
        return Scripted(404, {"error": f"no scenario for {self.path}"})

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        self.server.requests.append((self.command, self.path))
        s = self._scenario()
        if s.behavior == "reset":
            # SO_LINGER with zero timeout makes close() send RST instead of FIN.
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
            self.close_connection = True
            return
        if s.behavior == "close":
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
            return
        if s.behavior == "redirect_loop":
            self.send_response(302)
            self.send_header("Location", self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if s.behavior == "truncated":
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            chunk = b'{"data": [1, 2, 3'
            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk) + 40, chunk))  # promises more than it sends
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
            return
        body, ctype = s.encoded()
        self.send_response(s.status)
        self.send_header("Content-Type", ctype)
        for k, v in s.headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _handle


class ScriptedHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # clients that time out or cancel hang up on purpose; nothing to report

    def __init__(self, routes: Mapping[str, Scripted]) -> None:
        super().__init__((LOCALHOST, 0), _Handler)
        self.routes = dict(routes)
        self.requests: list[tuple[str, str]] = []

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def url(self, scenario: str, path: str = "") -> str:
        return f"http://{LOCALHOST}:{self.port}/s/{scenario}{path}"


# --------------------------------------------------------------------------- raw sockets


@contextmanager
def closed_port() -> Iterator[int]:
    """A port on which connects are refused (bound but not listening, so it stays ours)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((LOCALHOST, 0))
    try:
        yield int(s.getsockname()[1])
    finally:
        s.close()


@contextmanager
def blackhole() -> Iterator[int]:
    """A port that accepts TCP connections (kernel backlog) but never answers."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((LOCALHOST, 0))
    s.listen(512)
    try:
        yield int(s.getsockname()[1])
    finally:
        s.close()


@contextmanager
def full_backlog() -> Iterator[int]:
    """A port whose accept queue is full, so the kernel drops SYNs: connects time out."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((LOCALHOST, 0))
    s.listen(0)
    port = int(s.getsockname()[1])
    fillers: list[socket.socket] = []
    try:
        for _ in range(3):
            c = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            c.setblocking(False)
            c.connect_ex((LOCALHOST, port))
            fillers.append(c)
        time.sleep(0.05)
        yield port
    finally:
        for c in fillers:
            c.close()
        s.close()


# --------------------------------------------------------------------------- gRPC

GRPC_SERVICE = "corpus.Scenario"

# method name -> (status code, details) the server aborts with
GRPC_ABORTS: dict[str, tuple[grpc.StatusCode, str]] = {
    "Unavailable": (grpc.StatusCode.UNAVAILABLE, "The service is currently unavailable."),
    "ServerDeadline": (
        grpc.StatusCode.DEADLINE_EXCEEDED,
        "Deadline expired before operation could complete.",
    ),
    "RateExhausted": (
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "Quota exceeded for quota metric 'Read requests' and limit 'Read requests per minute per user'"
        " of service 'sheets.googleapis.com'. Rate limited, retry later.",
    ),
    "NotFound": (
        grpc.StatusCode.NOT_FOUND,
        "Document projects/p/databases/(default)/documents/c/d not found.",
    ),
    "InvalidArgument": (grpc.StatusCode.INVALID_ARGUMENT, "Request contains an invalid argument."),
    "PermissionDenied": (
        grpc.StatusCode.PERMISSION_DENIED,
        "The caller does not have permission to access the bucket.",
    ),
    "Unauthenticated": (
        grpc.StatusCode.UNAUTHENTICATED,
        "Request had invalid authentication credentials. Expected OAuth 2 access token.",
    ),
    "Internal": (grpc.StatusCode.INTERNAL, "Internal error encountered."),
    "Aborted": (grpc.StatusCode.ABORTED, "Transaction was aborted due to contention. Please retry."),
    "FailedPrecondition": (grpc.StatusCode.FAILED_PRECONDITION, "The index is not ready yet."),
    "AlreadyExists": (grpc.StatusCode.ALREADY_EXISTS, "Entity already exists: users/42"),
    "OutOfRange": (grpc.StatusCode.OUT_OF_RANGE, "Attempted to read past end of stream."),
    "Unimplemented": (grpc.StatusCode.UNIMPLEMENTED, "Method not implemented on this server."),
}


class GrpcScenarioServer:
    """Real grpc server; each method of ``corpus.Scenario`` fails in its own way."""

    def __init__(self) -> None:
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        handlers: dict[str, grpc.RpcMethodHandler] = {
            name: grpc.unary_unary_rpc_method_handler(self._aborter(code, details))
            for name, (code, details) in GRPC_ABORTS.items()
        }
        handlers["Slow"] = grpc.unary_unary_rpc_method_handler(self._slow)
        handlers["Big"] = grpc.unary_unary_rpc_method_handler(lambda req, ctx: b"x" * 4096)
        # No (de)serializers: requests and responses are raw bytes.
        self._server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(GRPC_SERVICE, handlers),))
        self.port = self._server.add_insecure_port(f"{LOCALHOST}:0")

    @staticmethod
    def _aborter(code: grpc.StatusCode, details: str) -> Callable[[bytes, grpc.ServicerContext], bytes]:
        def behaviour(request: bytes, context: grpc.ServicerContext) -> bytes:
            context.abort(code, details)
            raise AssertionError("unreachable")  # abort raises

        return behaviour

    @staticmethod
    def _slow(request: bytes, context: grpc.ServicerContext) -> bytes:
        deadline = time.monotonic() + 2.0
        while context.is_active() and time.monotonic() < deadline:
            time.sleep(0.01)
        return b"late"

    def start(self) -> None:
        self._server.start()

    def stop(self) -> None:
        self._server.stop(0).wait(2)

    def target(self) -> str:
        return f"{LOCALHOST}:{self.port}"


# --------------------------------------------------------------------------- RESP (redis)

# key (or command) -> raw RESP error line the fake redis answers with
RESP_ERRORS: dict[str, bytes] = {
    "wrongtype": b"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n",
    "noauth": b"-NOAUTH Authentication required.\r\n",
    "loading": b"-LOADING Redis is loading the dataset in memory\r\n",
    "busy": (b"-BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.\r\n"),
    "tryagain": b"-TRYAGAIN Multiple keys request during rehashing of slot\r\n",
    "maxclients": b"-ERR max number of clients reached\r\n",
    "noperm": (b"-NOPERM User app has no permissions to run the 'get' command\r\n"),
}


class _RespHandler(socketserver.StreamRequestHandler):
    def _read_command(self) -> list[bytes] | None:
        line = self.rfile.readline()
        if not line:
            return None
        if not line.startswith(b"*"):
            return line.strip().split()
        n = int(line[1:].strip())
        args: list[bytes] = []
        for _ in range(n):
            hdr = self.rfile.readline()
            size = int(hdr[1:].strip())
            args.append(self.rfile.read(size + 2)[:-2])
        return args

    def handle(self) -> None:
        server: RespServer = self.server  # type: ignore[assignment]
        while True:
            cmd = self._read_command()
            if cmd is None:
                return
            name = cmd[0].upper()
            server.commands.append([c.decode(errors="replace") for c in cmd])
            if name == b"HELLO":
                if b"AUTH" in [c.upper() for c in cmd]:
                    self.wfile.write(b"-WRONGPASS invalid username-password pair or user is disabled.\r\n")
                else:
                    self.wfile.write(b"%3\r\n+server\r\n+redis\r\n+version\r\n+7.2.4\r\n+proto\r\n:3\r\n")
            elif name == b"AUTH":
                self.wfile.write(b"-WRONGPASS invalid username-password pair or user is disabled.\r\n")
            elif name in (b"CLIENT", b"SELECT"):
                self.wfile.write(b"+OK\r\n")
            elif name == b"PING":
                self.wfile.write(b"+PONG\r\n")
            elif name == b"EVALSHA":
                self.wfile.write(b"-NOSCRIPT No matching script. Please use EVAL.\r\n")
            elif name in (b"GET", b"SET", b"LPUSH", b"INCR"):
                key = cmd[1].decode()
                if key == "close":
                    return  # drop the connection mid-request
                self.wfile.write(RESP_ERRORS.get(key, b"$-1\r\n"))
            else:
                args = " ".join(f"'{a.decode()}'" for a in cmd[1:3])
                line = f"-ERR unknown command '{cmd[0].decode()}', with args beginning with: {args} \r\n"
                self.wfile.write(line.encode())
            self.wfile.flush()


class RespServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # clients hang up on purpose (timeouts, dropped connections)

    def __init__(self) -> None:
        super().__init__((LOCALHOST, 0), _RespHandler)
        self.commands: list[list[str]] = []

    @property
    def port(self) -> int:
        return int(self.server_address[1])


# --------------------------------------------------------------------------- PostgreSQL wire

# database name -> startup failure (sqlstate, message); "ok" starts a session
PG_STARTUP_ERRORS: dict[str, tuple[str, str]] = {
    "authfail": ("28P01", 'password authentication failed for user "app"'),
    "toomany": ("53300", "sorry, too many clients already"),
    "startingup": ("57P03", "the database system is starting up"),
    "nodb": ("3D000", 'database "nodb" does not exist'),
}
# keyword in the query text -> (sqlstate, message)
PG_QUERY_ERRORS: dict[str, tuple[str, str]] = {
    "deadlock": ("40P01", "deadlock detected"),
    "serialization": ("40001", "could not serialize access due to concurrent update"),
    "statement_timeout": ("57014", "canceling statement due to statement timeout"),
    "unique": ("23505", 'duplicate key value violates unique constraint "users_email_key"'),
    "missing_table": ("42P01", 'relation "missing_table" does not exist'),
    "syntax": ("42601", 'syntax error at or near "SELEC"'),
    "admin_shutdown": ("57P01", "terminating connection due to administrator command"),
}


def _pg_msg(kind: bytes, payload: bytes) -> bytes:
    return kind + struct.pack("!I", len(payload) + 4) + payload


def _pg_error(sqlstate: str, message: str, severity: str = "ERROR") -> bytes:
    fields = b"".join(
        code + value.encode() + b"\0"
        for code, value in ((b"S", severity), (b"V", severity), (b"C", sqlstate), (b"M", message))
    )
    return _pg_msg(b"E", fields + b"\0")


class _PgHandler(socketserver.BaseRequestHandler):
    def _recv_exact(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.request.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("client went away")
            buf += chunk
        return buf

    def handle(self) -> None:
        try:
            self._session()
        except (ConnectionError, OSError, struct.error):
            pass

    def _session(self) -> None:
        sock = self.request
        while True:  # SSLRequest / GSSENCRequest -> 'N', then the real startup message
            (length,) = struct.unpack("!I", self._recv_exact(4))
            body = self._recv_exact(length - 4)
            (code,) = struct.unpack("!I", body[:4])
            if code in (80877103, 80877104):
                sock.sendall(b"N")
                continue
            break
        parts = body[4:].split(b"\0")
        params = dict(zip(parts[0::2], parts[1::2], strict=False))
        database = params.get(b"database", b"").decode()
        if database in PG_STARTUP_ERRORS:
            sqlstate, message = PG_STARTUP_ERRORS[database]
            if sqlstate == "28P01":  # ask for the password first, like a real server
                sock.sendall(_pg_msg(b"R", struct.pack("!I", 3)))
                kind = self._recv_exact(1)
                (length,) = struct.unpack("!I", self._recv_exact(4))
                self._recv_exact(length - 4)
                assert kind == b"p"
            sock.sendall(_pg_error(sqlstate, message, "FATAL"))
            return
        out = _pg_msg(b"R", struct.pack("!I", 0))
        for k, v in (
            ("server_version", "16.2"),
            ("server_encoding", "UTF8"),
            ("client_encoding", "UTF8"),
            ("DateStyle", "ISO, MDY"),
            ("TimeZone", "UTC"),
            ("integer_datetimes", "on"),
            ("standard_conforming_strings", "on"),
        ):
            out += _pg_msg(b"S", k.encode() + b"\0" + v.encode() + b"\0")
        out += _pg_msg(b"K", struct.pack("!II", 4242, 1234))
        out += _pg_msg(b"Z", b"I")
        sock.sendall(out)
        pending: bytes | None = None
        while True:
            kind = self._recv_exact(1)
            (length,) = struct.unpack("!I", self._recv_exact(4))
            payload = self._recv_exact(length - 4)
            if kind == b"X":
                return
            if kind in (b"P", b"Q"):
                query = (payload.split(b"\0", 2)[1] if kind == b"P" else payload).decode(errors="replace")
                verb = query.strip("\0 ;").upper()
                if kind == b"Q" and verb in ("BEGIN", "COMMIT", "ROLLBACK"):
                    status = b"T" if verb == "BEGIN" else b"I"
                    sock.sendall(_pg_msg(b"C", verb.encode() + b"\0") + _pg_msg(b"Z", status))
                    continue
                sqlstate, message = next(
                    (v for k, v in PG_QUERY_ERRORS.items() if k in query), ("XX000", "unexpected query")
                )
                fatal = sqlstate.startswith("57P")
                pending = _pg_error(sqlstate, message, "FATAL" if fatal else "ERROR")
                if kind == b"Q" or fatal:
                    sock.sendall(pending + (b"" if fatal else _pg_msg(b"Z", b"E")))
                    pending = None
                    if fatal:
                        return
            elif kind == b"S":
                sock.sendall((pending or b"") + _pg_msg(b"Z", b"E" if pending else b"I"))
                pending = None


class PgServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__((LOCALHOST, 0), _PgHandler)

    @property
    def port(self) -> int:
        return int(self.server_address[1])


# --------------------------------------------------------------------------- bundle


@dataclass
class Servers:
    http: ScriptedHTTPServer
    grpc: GrpcScenarioServer
    resp: RespServer
    pg: PgServer
    closed_port: int
    blackhole_port: int
    full_backlog_port: int


def _serve_in_thread(server: socketserver.BaseServer) -> threading.Thread:
    t = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    return t


@contextmanager
def running_servers(routes: Mapping[str, Scripted]) -> Iterator[Servers]:
    """Start every local peer, yield their addresses, stop them all afterwards."""
    http = ScriptedHTTPServer(routes)
    resp = RespServer()
    pg = PgServer()
    grpc_server = GrpcScenarioServer()
    threads = [_serve_in_thread(s) for s in (http, resp, pg)]
    grpc_server.start()
    try:
        with closed_port() as cp, blackhole() as bh, full_backlog() as fb:
            yield Servers(http, grpc_server, resp, pg, cp, bh, fb)
    finally:
        grpc_server.stop()
        for s in (http, resp, pg):
            s.shutdown()
            s.server_close()
        for t in threads:
            t.join(2)
