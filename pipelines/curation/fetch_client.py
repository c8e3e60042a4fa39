"""One image GET for fetch_images, on the standard library (`http.client`), with limits that hold against any server.

- Only `http` and `https` URLs, and redirects (301/302/303/307/308, at most `MAX_REDIRECTS`) only to them; a loop is
  refused.
- A wall-clock deadline per request (`timeout`, connect to last byte, redirects included): a `Watchdog` thread shuts
  the socket down when it passes, so a server dripping one byte a second is cut at the deadline, not at
  `timeout` per read.
- At most `max_bytes` read (a larger Content-Length is refused before the body is read); a body shorter than its
  Content-Length is a truncation, retried (`final=False`).
- 429 and 503 are `Throttled`, carrying the server's `Retry-After` (seconds or an HTTP date); other 5xx and 408 are
  transient, other statuses final.
- Keep-alive: each worker thread keeps one connection per host (TLS handshakes are not repeated per image);
  `http_proxy` / `https_proxy` / `no_proxy` are honoured as urllib honours them.
"""
from __future__ import annotations

import heapq
import http.client
import itertools
import re
import socket
import ssl
import threading
import time
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import quote, urljoin, urlsplit
from urllib.request import getproxies, proxy_bypass

SCHEMES = ("http", "https")
REDIRECTS = (301, 302, 303, 307, 308)
MAX_REDIRECTS = 5
_HOST_END = re.compile(r"[/?#]")
TARGET_SAFE = "/%?=&:@!$'()*+,;~[]"  # kept as they are in a request target; spaces and non-ASCII are percent-encoded
CHUNK = 1 << 18
DRAIN = 1 << 16  # an error or redirect body up to this size is read so that its connection can be reused


class FetchFailure(Exception):
    """One URL's failure: `reason` in words, `final` when a rerun should not retry it."""

    def __init__(self, reason: str, final: bool):
        super().__init__(reason)
        self.reason, self.final = reason, final


class Throttled(FetchFailure):
    """The host said slow down (429 or 503); `retry_after` is its Retry-After in seconds (None when absent)."""

    def __init__(self, reason: str, retry_after: float | None):
        super().__init__(reason, False)
        self.retry_after = retry_after


def check_url(url: Any) -> Any:
    """`urlsplit(url)` of an http(s) URL with a host; else a final FetchFailure saying why."""
    if not isinstance(url, str) or not url.strip():
        raise FetchFailure("bad URL: blank", True)
    try:
        parts = urlsplit(url.strip())
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as err:
        raise FetchFailure(f"bad URL: {err}", True) from None
    if parts.scheme.lower() not in SCHEMES:
        raise FetchFailure(f"refused URL scheme {parts.scheme or '(none)'!r}: only http and https", True)
    if not parts.hostname:
        raise FetchFailure("bad URL: no host", True)
    return parts


def host_of(url: str) -> str:
    """The host[:port] a URL's requests go to (the rate-limit key): urlsplit's netloc, lower-cased, found without
    parsing the rest (millions of URLs are counted by a dry run)."""
    rest = url.split("//", 1)[1] if "//" in url else ""
    return _HOST_END.split(rest, 1)[0].lower()


def parse_retry_after(value: str | None) -> float | None:
    """Retry-After as seconds from now: a number of seconds or an HTTP date; None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


class Watchdog:
    """Shuts a socket down (both directions, so a blocked read returns at once) when its deadline passes."""

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, socket.socket]] = []
        self.cancelled: set[int] = set()
        self.fired: set[int] = set()
        self.counter = itertools.count()
        self.cond = threading.Condition()
        self.thread: threading.Thread | None = None

    def watch(self, sock: socket.socket, deadline: float) -> int:
        with self.cond:
            token = next(self.counter)
            heapq.heappush(self.heap, (deadline, token, sock))
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="fetch-watchdog", daemon=True)
                self.thread.start()
            self.cond.notify()
            return token

    def cancel(self, token: int) -> bool:
        """Stop watching; True when the deadline had already fired."""
        with self.cond:
            if token in self.fired:
                self.fired.discard(token)
                return True
            self.cancelled.add(token)
            return False

    def _run(self) -> None:
        with self.cond:
            while True:
                while self.heap and self.heap[0][1] in self.cancelled:
                    self.cancelled.discard(heapq.heappop(self.heap)[1])
                if not self.heap:
                    self.cond.wait()
                    continue
                deadline, token, sock = self.heap[0]
                wait = deadline - time.monotonic()
                if wait > 0:
                    self.cond.wait(wait)
                    continue
                heapq.heappop(self.heap)
                self.fired.add(token)
                try:
                    socket.socket.shutdown(sock, socket.SHUT_RDWR)  # the plain socket's, also under TLS
                except OSError:
                    pass


WATCHDOG = Watchdog()


class Client:
    """GETs image bytes (see the module docstring); one instance is shared by the worker threads."""

    def __init__(self, user_agent: str, timeout: float, max_bytes: int):
        self.headers = {"User-Agent": user_agent, "Accept": "image/*, */*;q=0.5"}
        self.timeout, self.max_bytes = timeout, max_bytes
        self.local = threading.local()
        self.proxies = {k: v for k, v in getproxies().items() if k in SCHEMES}
        self.tls = ssl.create_default_context()  # one for every connection (loading the CA bundle is not free)

    def get(self, url: str) -> bytes:
        """The body of `url` after redirects; FetchFailure (or Throttled) otherwise."""
        deadline = time.monotonic() + self.timeout
        seen = set()
        for _ in range(MAX_REDIRECTS + 1):
            parts = check_url(url)
            if url in seen:
                raise FetchFailure("redirect loop", True)
            seen.add(url)
            status, headers, body = self._request(parts, deadline)
            if status == 200:
                return body
            if status in REDIRECTS:
                location = headers.get("Location")
                if not location:
                    raise FetchFailure(f"HTTP {status} without a Location", True)
                url = urljoin(url, location.strip())
                continue
            if status in (429, 503):
                raise Throttled(f"HTTP {status}", parse_retry_after(headers.get("Retry-After")))
            raise FetchFailure(f"HTTP {status}", not (status >= 500 or status == 408))
        raise FetchFailure(f"more than {MAX_REDIRECTS} redirects", True)

    def _connection(self, parts: Any) -> tuple[http.client.HTTPConnection, str]:
        """This thread's kept-alive connection for the URL's host (a new one when none), and the request target."""
        scheme, host, port = parts.scheme.lower(), parts.hostname, parts.port
        target = quote((parts.path or "/") + (f"?{parts.query}" if parts.query else ""), safe=TARGET_SAFE)
        proxy = self.proxies.get(scheme)
        if proxy and proxy_bypass(host):
            proxy = None
        key = (scheme, host, port, proxy)
        pool = self.local.__dict__.setdefault("pool", {})
        conn = pool.get(key)
        if conn is None:
            https = scheme == "https"
            if proxy:
                p = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
                conn = http.client.HTTPConnection(p.hostname, p.port or 80, timeout=self.timeout)
                if https:  # CONNECT tunnel through the proxy, TLS to the host
                    conn = http.client.HTTPSConnection(p.hostname, p.port or 80, timeout=self.timeout,
                                                       context=self.tls)
                    conn.set_tunnel(host, port or 443)
                else:
                    target = parts.geturl()
            elif https:
                conn = http.client.HTTPSConnection(host, port, timeout=self.timeout,
                                                   context=self.tls)
            else:
                conn = http.client.HTTPConnection(host, port, timeout=self.timeout)
            pool[key] = conn
        elif proxy and scheme == "http":
            target = parts.geturl()
        return conn, target

    def close_thread(self) -> None:
        """Close this thread's kept-alive connections (a worker's last call)."""
        for conn in self.local.__dict__.pop("pool", {}).values():
            conn.close()

    def _drop(self, conn: http.client.HTTPConnection) -> None:
        conn.close()
        pool = self.local.__dict__.get("pool", {})
        for key, value in list(pool.items()):
            if value is conn:
                del pool[key]

    def _request(self, parts: Any, deadline: float) -> tuple[int, Any, bytes]:
        """(status, headers, body) of one GET on a kept-alive connection, a stale one retried once on a new one."""
        for fresh in (False, True):
            conn, target = self._connection(parts)
            reused = conn.sock is not None
            try:
                return self._exchange(conn, target, deadline)
            except _Stale:
                self._drop(conn)
                if not reused or fresh:
                    raise FetchFailure("connection: closed by the server", False) from None
        raise AssertionError("unreachable")

    def _exchange(self, conn: http.client.HTTPConnection, target: str, deadline: float) -> tuple[int, Any, bytes]:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise FetchFailure("timeout", False)
        token: int | None = None
        keep = False
        try:
            conn.timeout = remaining
            if conn.sock is None:
                conn.connect()
            conn.sock.settimeout(remaining)
            token = WATCHDOG.watch(conn.sock, deadline)
            try:
                conn.request("GET", target, headers=self.headers)
                response = conn.getresponse()
            except (http.client.RemoteDisconnected, http.client.ImproperConnectionState, ConnectionResetError,
                    BrokenPipeError) as err:
                raise _Stale() from err
            status, headers = response.status, response.headers
            if status != 200:
                body = response.read(DRAIN + 1) if (response.length or 0) <= DRAIN else b""
                keep = not response.will_close and response.isclosed()
                response.close()
                return status, headers, body
            body = self._body(response)
            keep = not response.will_close
            response.close()  # read to its end: the connection is free for the next request
            return status, headers, body
        except Exception as err:  # noqa: BLE001 - every failure becomes a FetchFailure (or _Stale) below
            fired = token is not None and WATCHDOG.cancel(token)
            token = None
            raise _failure(err, fired) from None
        finally:
            if token is not None and WATCHDOG.cancel(token):
                keep = False
            if not keep:
                self._drop(conn)

    def _body(self, response: http.client.HTTPResponse) -> bytes:
        """The body, at most max_bytes (a larger Content-Length refused unread); short of its length: _Truncated."""
        length = response.length
        if length is not None and length > self.max_bytes:
            raise FetchFailure(f"larger than max_bytes={self.max_bytes} (Content-Length {length})", True)
        chunks, size = [], 0
        while True:
            try:
                chunk = response.read1(CHUNK)
            except http.client.IncompleteRead as err:
                raise _Truncated(size + len(err.partial), length) from None
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > self.max_bytes:
                raise FetchFailure(f"larger than max_bytes={self.max_bytes}", True)
        if length is not None and size < length:
            raise _Truncated(size, length)
        return b"".join(chunks)


def _failure(err: Exception, fired: bool) -> Exception:
    """The FetchFailure an exception of one exchange stands for (a fired deadline is a timeout, whatever broke)."""
    if fired:
        return FetchFailure("timeout", False)
    if isinstance(err, (FetchFailure, _Stale)):
        return err
    if isinstance(err, _Truncated):
        return FetchFailure(str(err), False)
    if isinstance(err, TimeoutError) or "timed out" in str(err):
        return FetchFailure("timeout", False)
    if isinstance(err, ssl.SSLCertVerificationError):
        return FetchFailure(f"TLS: certificate verify failed ({err.verify_message or err.reason})", True)
    if isinstance(err, (http.client.InvalidURL, UnicodeError)) or type(err) is ValueError:
        return FetchFailure(f"bad URL: {err}", True)
    if isinstance(err, (OSError, http.client.HTTPException)):
        return FetchFailure(f"connection: {getattr(err, 'strerror', None) or err or type(err).__name__}", False)
    return err


class _Stale(Exception):
    """A kept-alive connection the server had closed before answering."""


class _Truncated(Exception):
    def __init__(self, got: int, length: int | None):
        super().__init__(f"truncated ({got} of {length} bytes)" if length is not None else f"truncated ({got} bytes)")
