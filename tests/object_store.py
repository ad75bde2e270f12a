"""A real S3-compatible object store for the tests, and a proxy in front of it that injects faults.

``S3Server`` runs moto's standalone S3 server in a thread of this process, bound to 127.0.0.1 on a free port; tests
read and write it through ``s3fs``/``fsspec`` exactly as a user's ``s3://`` URL would::

    fs, path = fsspec.core.url_to_fs(server.url("shards/part-0.parquet"), **server.storage_options)

``FaultProxy`` is an HTTP proxy on 127.0.0.1 that forwards each request to the server and, following a programmable,
bounded plan, answers with an error, answers slowly, or cuts the connection in the middle of a body. Its
``storage_options`` point s3fs at the proxy; the ``s3://bucket/key`` URLs stay the same.

What the ``storage_options`` choose (for s3fs 2026.9 / aiobotocore 3 / botocore 1.43):

* ``key``/``secret`` "testing" and ``client_kwargs={"endpoint_url": ..., "region_name": "us-east-1"}``.
* ``use_listings_cache=False``: s3fs answers no listing (``ls``/``exists``/``info`` of a folder) from a stale cache
  after a test adds or deletes objects.
* ``config_kwargs={"retries": {"total_max_attempts": 1, "mode": "standard"}, ...}``: botocore makes each request once
  and never retries by itself, so every request the proxy logs comes from s3fs or from the code above it. (Not
  ``"max_attempts": 1``: botocore reads that as one *retry*, two attempts, and retries 500/502/503/504 and
  connection errors.)
  ``"s3": {"addressing_style": "path"}`` keeps URLs as ``/bucket/key`` (what ``match=`` sees), and a unique
  ``user_agent_extra`` makes the options of each server/proxy differ, so fsspec's instance cache never hands a test
  an ``S3FileSystem`` (with its pooled connections) left over from an earlier server on a reused port.

s3fs itself still retries: ``S3FileSystem.retries`` (class attribute, 5) is the number of *attempts* its
``_error_wrapper`` makes for network errors (``S3_RETRYABLE_ERRORS``: socket timeouts, botocore ``HTTPClientError``
such as ``ResponseStreamingError``/``ReadTimeoutError``, aiohttp ``ClientPayloadError``, ...) and for ClientErrors
whose text holds "SlowDown"/"reduce your request rate". It does not retry other ClientErrors (500 InternalError,
429, 404, a HEAD's bodiless 503). It is not a constructor argument (``retries=`` would reach aiobotocore's session
and fail); set it on the instance: ``fs.retries = 1`` means one attempt, no retry (``0`` breaks: s3fs then raises
``TypeError``). Use a fresh instance for that (``fsspec.filesystem("s3", skip_instance_cache=True, **options)``)
or the proxy's options, as fsspec caches instances by their options.

What reaches the caller of s3fs with these options (tests/test_object_store.py checks each), ``fs.retries = 1``:

* 503 SlowDown on a GET: ``OSError(errno.EBUSY, "Please reduce your request rate.")``, ``__cause__`` a botocore
  ``ClientError`` (Code "SlowDown"). With s3fs's default 5 attempts it is retried (backoff 0.1 s * 1.7**i).
* 500 InternalError: ``OSError(errno.EREMOTEIO)``; 429 TooManyRequests: ``OSError(errno.EIO)``; both with a
  ``ClientError`` cause, never retried by s3fs. A 503 on a HEAD (``open``/``info``/``size``): ``OSError(EBUSY,
  "Service Unavailable")``, not retried either (no body, so no "SlowDown" text).
* a connection cut mid-body: ``aiohttp.ClientPayloadError`` (not an OSError; s3fs retries it by default).
* no status line within ``read_timeout``: ``botocore.exceptions.ReadTimeoutError`` (an OSError); a stall mid-body
  past ``read_timeout``: ``fsspec.exceptions.FSTimeoutError`` (a TimeoutError), ``__cause__``
  ``aiobotocore.response.AioReadTimeoutError``. s3fs retries both by default. ``read_timeout`` (default 15 s) is
  set with ``config_kwargs={"read_timeout": ...}``; a delay below it just makes the read slow.

``s3fs.core.S3_RETRYABLE_ERRORS`` lists the network errors s3fs retries; a reader counting attempts itself can
catch ``(OSError, aiohttp.ClientError, botocore.exceptions.BotoCoreError)``.

Environment: while a server runs, the AWS variables of the host (profiles, tokens, endpoint overrides, config
files) and HTTP proxies are hidden and ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` are "testing"; ``stop()``
restores them exactly.
"""

from __future__ import annotations

import contextlib
import http.client
import http.server
import logging
import os
import socket
import threading
import urllib.parse
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

REGION = "us-east-1"
CREDENTIALS = {"key": "testing", "secret": "testing"}

# variables of the host that would reach botocore or aiohttp; hidden while a server runs
_HIDDEN_ENV = (
    "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_ROLE_ARN",
    "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_CA_BUNDLE", "AWS_MAX_ATTEMPTS",
    "AWS_RETRY_MODE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy",
)
_SET_ENV = {
    "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": REGION,
    "AWS_REGION": REGION, "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
}


class _ScopedEnv:
    """Set and hide environment variables; ``restore()`` puts back exactly what was there."""

    def __init__(self):
        self._saved: dict[str, str | None] = {}

    def apply(self):
        for name in (*_HIDDEN_ENV, *_SET_ENV):
            self._saved.setdefault(name, os.environ.get(name))
        for name in _HIDDEN_ENV:
            os.environ.pop(name, None)
        os.environ.update(_SET_ENV)

    def restore(self):
        for name, value in self._saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self._saved.clear()


def s3_storage_options(endpoint_url: str) -> dict:
    """Options for ``fsspec.filesystem("s3", **options)`` that reach ``endpoint_url`` (see the module's text)."""
    return {
        **CREDENTIALS,
        "client_kwargs": {"endpoint_url": endpoint_url, "region_name": REGION},
        "config_kwargs": {
            "retries": {"total_max_attempts": 1, "mode": "standard"},
            "s3": {"addressing_style": "path"},
            "user_agent_extra": f"tests-object-store/{uuid.uuid4().hex}",
        },
        "use_listings_cache": False,
    }


_SESSION = None  # one aiobotocore session for s3_filesystem: each client then skips re-reading botocore's S3 model


def s3_filesystem(storage_options: dict, retries: int | None = None):
    """A fresh ``s3fs.S3FileSystem`` (never fsspec's cached instance) for ``storage_options``; ``retries`` sets
    s3fs's own attempts (1: no retry by s3fs). Its clients come from one shared aiobotocore session (cheaper;
    requests and errors are the same as with ``fsspec.filesystem("s3", **storage_options)``)."""
    global _SESSION
    import aiobotocore.session
    import fsspec

    if _SESSION is None:
        _SESSION = aiobotocore.session.AioSession()
    fs = fsspec.filesystem("s3", skip_instance_cache=True, session=_SESSION, **storage_options)
    if retries is not None:
        if retries < 1:
            raise ValueError(f"retries counts attempts and must be >= 1, got {retries}")
        fs.retries = retries
    return fs


class S3Bucket:
    """One bucket of an ``S3Server``: write, replace and delete its objects directly (never through a proxy)."""

    def __init__(self, server: S3Server, name: str):
        self.server, self.name = server, name

    @property
    def storage_options(self) -> dict:
        return self.server.storage_options

    def url(self, key: str) -> str:
        return f"s3://{self.name}/{key.lstrip('/')}"

    def put(self, key: str, data: bytes) -> str:
        """Write ``data`` under ``key``; returns the object's ETag."""
        return self.server.client.put_object(Bucket=self.name, Key=key.lstrip("/"), Body=bytes(data))["ETag"]

    def upload(self, local_path: str | os.PathLike, key: str) -> str:
        """Upload one local file; returns its ``s3://`` URL."""
        self.put(key, Path(local_path).read_bytes())
        return self.url(key)

    def upload_folder(self, folder: str | os.PathLike, prefix: str = "") -> list[str]:
        """Upload every file under ``folder`` (recursively) as ``prefix/relative/path``; returns the URLs, sorted."""
        folder, prefix = Path(folder), prefix.strip("/")
        urls = []
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            relative = path.relative_to(folder).as_posix()
            urls.append(self.upload(path, f"{prefix}/{relative}" if prefix else relative))
        return urls

    def replace(self, key: str, data: bytes) -> str:
        """Overwrite an existing object with different content; returns the new ETag (ValueError if unchanged)."""
        old = self.etag(key)
        new = self.put(key, data)
        if new == old:
            raise ValueError(f"replace({key!r}): the new content is the old one, the ETag {new} did not change")
        return new

    def delete(self, key: str) -> None:
        self.server.client.delete_object(Bucket=self.name, Key=key.lstrip("/"))

    def etag(self, key: str) -> str:
        return self.server.client.head_object(Bucket=self.name, Key=key.lstrip("/"))["ETag"]

    def drop(self) -> None:
        """Delete every object and the bucket."""
        for key in self.keys():
            self.delete(key)
        self.server.client.delete_bucket(Bucket=self.name)

    def keys(self, prefix: str = "") -> list[str]:
        pages = self.server.client.get_paginator("list_objects_v2").paginate(Bucket=self.name, Prefix=prefix)
        return sorted(obj["Key"] for page in pages for obj in page.get("Contents", []))


class S3Server:
    """moto's S3 server on 127.0.0.1 (a free port) with one bucket made at start; also a context manager.

    moto keeps its objects in process-wide memory: several servers in one process share them (hence the unique
    default bucket name), and ``moto.mock_aws`` in the same test would intercept these clients too. The object
    methods (``url``, ``upload``, ``upload_folder``, ``put``, ``replace``, ``delete``, ``etag``,
    ``keys``) act on the default bucket ``self.bucket``; ``new_bucket()`` makes another one.
    """

    def __init__(self, bucket: str | None = None):
        self.bucket_name = bucket or f"test-bucket-{uuid.uuid4().hex[:12]}"
        self._env = _ScopedEnv()
        self._server = None
        self._client = None
        self.endpoint_url: str | None = None
        self.storage_options: dict = {}
        self.bucket: S3Bucket | None = None

    def start(self) -> S3Server:
        from moto.server import ThreadedMotoServer

        self._env.apply()
        werkzeug = logging.getLogger("werkzeug")  # moto's server logs each request at INFO
        self._werkzeug_level = werkzeug.level
        werkzeug.setLevel(logging.WARNING)
        try:
            self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
            self._server.start()
            host, port = self._server.get_host_and_port()
            self.endpoint_url = f"http://{host}:{port}"
            self.storage_options = s3_storage_options(self.endpoint_url)
            self.bucket = self.new_bucket(self.bucket_name)
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def client(self):
        """A boto3 S3 client of the server (explicit test credentials, no retries)."""
        if self._client is None:
            import boto3
            from botocore.config import Config

            self._client = boto3.session.Session().client(
                "s3", endpoint_url=self.endpoint_url, region_name=REGION,
                aws_access_key_id="testing", aws_secret_access_key="testing",
                config=Config(retries={"total_max_attempts": 1, "mode": "standard"}, s3={"addressing_style": "path"}),
            )
        return self._client

    def new_bucket(self, name: str | None = None) -> S3Bucket:
        name = name or f"bucket-{uuid.uuid4().hex[:16]}"
        self.client.create_bucket(Bucket=name)
        return S3Bucket(self, name)

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None
        if self._client is not None:
            self._client.close()
            self._client = None
        if hasattr(self, "_werkzeug_level"):
            logging.getLogger("werkzeug").setLevel(self._werkzeug_level)
            del self._werkzeug_level
        self._env.restore()

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # the default bucket's objects
    def url(self, key: str) -> str:
        return self.bucket.url(key)

    def put(self, key: str, data: bytes) -> str:
        return self.bucket.put(key, data)

    def upload(self, local_path: str | os.PathLike, key: str) -> str:
        return self.bucket.upload(local_path, key)

    def upload_folder(self, folder: str | os.PathLike, prefix: str = "") -> list[str]:
        return self.bucket.upload_folder(folder, prefix)

    def replace(self, key: str, data: bytes) -> str:
        return self.bucket.replace(key, data)

    def delete(self, key: str) -> None:
        self.bucket.delete(key)

    def etag(self, key: str) -> str:
        return self.bucket.etag(key)

    def keys(self, prefix: str = "") -> list[str]:
        return self.bucket.keys(prefix)


class Request(NamedTuple):
    """One request the proxy saw: ``path`` is the URL-decoded path without the query (``/bucket/key``), ``range``
    the Range header or None, ``status`` the status the client got (for a cut connection: the status line sent
    before the cut)."""

    method: str
    path: str
    range: str | None
    status: int


class Fault(NamedTuple):
    """One injected fault: ``kind`` is "fail", "delay" or "cut"."""

    kind: str
    method: str
    path: str


ERROR_CODES = {
    400: "BadRequest", 403: "AccessDenied", 404: "NoSuchKey", 408: "RequestTimeout", 429: "TooManyRequests",
    500: "InternalError", 502: "BadGateway", 503: "SlowDown", 504: "GatewayTimeout",
}
_MESSAGES = {"SlowDown": "Please reduce your request rate.", "InternalError": "We encountered an internal error."}


@dataclass
class _Rule:
    kind: str
    remaining: int
    match: str | None
    method: str | None
    status: int = 503
    code: str | None = None
    seconds: float = 0.0
    after_bytes: int | None = None

    def matches(self, method: str, target: str) -> bool:
        return (self.remaining > 0 and (self.method is None or self.method.upper() == method)
                and (self.match is None or self.match in target))


_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade"}


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _ProxyServer

    def log_message(self, format, *args):  # quiet
        pass

    def setup(self):
        super().setup()
        with self.server.proxy._lock:
            self.server.proxy._connections.add(self.connection)

    def finish(self):
        with self.server.proxy._lock:
            self.server.proxy._connections.discard(self.connection)
        super().finish()

    def _any(self):
        self.server.proxy._handle(self)

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = do_PATCH = do_OPTIONS = _any


class _ProxyServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    proxy: FaultProxy


class FaultProxy:
    """An HTTP proxy on 127.0.0.1 in front of an S3 endpoint, with a programmable, thread-safe fault plan.

    Each fault rule applies to the next ``n`` requests that match it (``match``: a substring of the URL-decoded
    path and query, e.g. a key; ``method``: "GET", "HEAD", ... or None for any), then it is used up. Rules are
    checked in the order they were added; a request takes at most one fault. Also a context manager.
    """

    def __init__(self, endpoint_url: str, server: S3Server | None = None):
        self.server = server  # the S3Server behind the proxy, if given (to write objects directly)
        self.upstream = urllib.parse.urlsplit(endpoint_url).netloc
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._rules: list[_Rule] = []
        self._requests: list[Request] = []
        self._faults: list[Fault] = []
        self._connections: set[socket.socket] = set()  # open client connections, closed by stop()
        self._httpd: _ProxyServer | None = None
        self._thread: threading.Thread | None = None
        self.endpoint_url: str | None = None
        self.storage_options: dict = {}

    # life
    def start(self) -> FaultProxy:
        self._httpd = _ProxyServer(("127.0.0.1", 0), _Handler)
        self._httpd.proxy = self
        host, port = self._httpd.server_address[:2]
        self.endpoint_url = f"http://{host}:{port}"
        self.storage_options = s3_storage_options(self.endpoint_url)
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="fault-proxy", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()  # ends delays at once
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            with self._lock:
                connections, self._connections = list(self._connections), set()
            for connection in connections:  # idle keep-alive connections would hold their threads
                with contextlib.suppress(OSError):
                    connection.shutdown(socket.SHUT_RDWR)
            self._thread.join(timeout=10)
            self._httpd = None

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # the plan
    def fail_next(self, n: int = 1, status: int = 503, match: str | None = None, method: str | None = None,
                  code: str | None = None) -> None:
        """Answer the next ``n`` matching requests with ``status`` and an S3 XML error whose Code is ``code`` or
        the usual one for the status (503 SlowDown, 500 InternalError, 429 TooManyRequests, ...; see
        ``ERROR_CODES``); the request never reaches the server. A HEAD gets the status without a body."""
        self._add(_Rule("fail", n, match, method, status=status, code=code or ERROR_CODES.get(status, "Error")))

    def delay_next(self, n: int, seconds: float, match: str | None = None, method: str | None = None,
                   after_bytes: int | None = None) -> None:
        """Hold the next ``n`` matching responses ``seconds``: the request reaches the server at once, its answer
        waits before the status line (or, with ``after_bytes``, after the headers and that many body bytes, or at
        the end of a shorter body); then the response goes on complete unless the client gave up."""
        self._add(_Rule("delay", n, match, method, seconds=seconds, after_bytes=after_bytes))

    def cut_next(self, n: int, after_bytes: int = 0, match: str | None = None, method: str | None = None) -> None:
        """For the next ``n`` matching requests, send the server's status and headers (its full Content-Length)
        and ``after_bytes`` bytes of the body, then close the connection: a connection dropped mid-transfer."""
        self._add(_Rule("cut", n, match, method, after_bytes=after_bytes))

    def reset(self) -> None:
        """Drop all pending rules and both logs."""
        with self._lock:
            self._rules.clear()
            self._requests.clear()
            self._faults.clear()

    @property
    def requests(self) -> list[Request]:
        """A copy of the log of requests answered, in order."""
        with self._lock:
            return list(self._requests)

    @property
    def faults(self) -> list[Fault]:
        """A copy of the log of faults injected, in order."""
        with self._lock:
            return list(self._faults)

    @property
    def pending(self) -> int:
        """How many faults the plan still holds."""
        with self._lock:
            return sum(rule.remaining for rule in self._rules)

    def _add(self, rule: _Rule) -> None:
        if rule.remaining < 0:
            raise ValueError(f"n must be >= 0, got {rule.remaining}")
        with self._lock:
            self._rules.append(rule)

    def _take(self, method: str, target: str) -> _Rule | None:
        with self._lock:
            for rule in self._rules:
                if rule.matches(method, target):
                    rule.remaining -= 1
                    self._rules = [r for r in self._rules if r.remaining > 0]
                    return rule
        return None

    def _log(self, handler: _Handler, path: str, status: int, rule: _Rule | None) -> None:
        with self._lock:
            self._requests.append(Request(handler.command, path, handler.headers.get("Range"), status))
            if rule is not None:
                self._faults.append(Fault(rule.kind, handler.command, path))

    # forwarding
    def _handle(self, handler: _Handler) -> None:
        method = handler.command
        split = urllib.parse.urlsplit(handler.path)
        path = urllib.parse.unquote(split.path)
        target = urllib.parse.unquote(handler.path)
        body = self._read_request_body(handler)
        rule = self._take(method, target)

        if rule is not None and rule.kind == "fail":
            self._log(handler, path, rule.status, rule)  # before answering: the log is complete when the client
            self._send_error(handler, rule, path)  # sees the answer
            return

        headers = {k: v for k, v in handler.headers.items() if k.lower() not in _HOP_BY_HOP}
        if body is not None:
            headers["Content-Length"] = str(len(body))
        upstream = http.client.HTTPConnection(self.upstream, timeout=60)
        try:
            upstream.putrequest(method, handler.path, skip_host=True, skip_accept_encoding=True)
            for name, value in headers.items():
                upstream.putheader(name, value)
            upstream.endheaders(body)
            response = upstream.getresponse()
            self._relay(handler, method, response, rule, path)
        finally:
            upstream.close()

    @staticmethod
    def _read_request_body(handler: _Handler) -> bytes | None:
        if "chunked" in handler.headers.get("Transfer-Encoding", "").lower():
            parts = []
            while True:
                size = int(handler.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while handler.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(parts)
                parts.append(handler.rfile.read(size))
                handler.rfile.readline()
        length = int(handler.headers.get("Content-Length") or 0)
        return handler.rfile.read(length) if length else None

    def _send_error(self, handler: _Handler, rule: _Rule, path: str) -> None:
        request_id = uuid.uuid4().hex[:16].upper()
        message = _MESSAGES.get(rule.code, f"Injected fault {rule.status} {rule.code}.")
        xml = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{rule.code}</Code><Message>{message}</Message>'
               f"<Resource>{path}</Resource><RequestId>{request_id}</RequestId></Error>").encode()
        handler.send_response(rule.status)
        handler.send_header("x-amz-request-id", request_id)
        handler.send_header("Content-Type", "application/xml")
        if rule.status in (429, 503):
            handler.send_header("Retry-After", "0")
        if handler.command == "HEAD":
            handler.send_header("Content-Length", "0")
            handler.end_headers()
        else:
            handler.send_header("Content-Length", str(len(xml)))
            handler.end_headers()
            handler.wfile.write(xml)
        handler.wfile.flush()

    def _relay(self, handler: _Handler, method: str, response: http.client.HTTPResponse, rule: _Rule | None,
               path: str) -> None:
        has_body = method != "HEAD" and response.status not in (204, 304) and not 100 <= response.status < 200
        chunked = has_body and response.getheader("Content-Length") is None
        kind = rule.kind if rule is not None else None
        limit = rule.after_bytes if kind in ("cut", "delay") else None
        self._log(handler, path, response.status, rule)  # before answering: complete when the client sees anything
        try:
            if kind == "delay" and limit is None:
                self._stopping.wait(rule.seconds)
            handler.send_response_only(response.status, response.reason)
            for name, value in response.getheaders():
                if name.lower() not in _HOP_BY_HOP:
                    handler.send_header(name, value)
            if chunked:
                handler.send_header("Transfer-Encoding", "chunked")
            handler.end_headers()
            sent, held = 0, limit is None
            while has_body:
                chunk = response.read(64 * 1024)
                if not chunk:
                    break
                if not held and sent + len(chunk) >= limit:
                    head, chunk = chunk[: limit - sent], chunk[limit - sent:]
                    self._write(handler, head, chunked)
                    sent += len(head)
                    handler.wfile.flush()
                    if kind == "cut":
                        return self._cut(handler)
                    self._stopping.wait(rule.seconds)
                    held = True
                self._write(handler, chunk, chunked)
                sent += len(chunk)
            handler.wfile.flush()
            if not held:  # the body was shorter than after_bytes (or there was none)
                if kind == "cut":
                    return self._cut(handler)
                self._stopping.wait(rule.seconds)
            if chunked:
                handler.wfile.write(b"0\r\n\r\n")
            handler.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (a timeout)
            handler.close_connection = True

    @staticmethod
    def _write(handler: _Handler, data: bytes, chunked: bool) -> None:
        if not data:
            return
        if chunked:
            handler.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        else:
            handler.wfile.write(data)

    @staticmethod
    def _cut(handler: _Handler) -> None:
        handler.close_connection = True
        with contextlib.suppress(OSError):
            handler.connection.shutdown(socket.SHUT_RDWR)

