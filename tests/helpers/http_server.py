"""A misbehaving HTTP server on 127.0.0.1 for fetch tests: every path's first part names a behaviour.

    with HostileServer() as server:
        url = server.base + "/drip/1.jpg"

Images: `/img/N.png` (200 x 150 PNG seeded by the path; any unknown kind too), `/jpeg/N.jpg?w=&h=&exif=` (a smooth
JPEG, EXIF orientation optional), `/rgba/N.png` (half transparent), `/dup/N.png` (the bytes of /img/0.png),
`/tiny/N.png` (16 x 16), `/thumb/N.jpg`.
Failures: `/fail/N` (500), `/missing/N` (404), `/flaky/N.png` (500 on the first request), `/status/N?code=&retry=`
(that status, with Retry-After when given), `/throttle/N.png?retry=&times=` (429 with Retry-After the first `times`
requests, default 1), `/short/N` (10 bytes), `/html/N.jpg` (HTML served as image/jpeg), `/gzip/N.png` (a PNG gzipped,
Content-Encoding gzip), `/bomb/N.png?side=` (a PNG header of side x side px, default 12000), `/big/N.jpg`
(Content-Length 10 GB), `/endless/N.jpg` (chunked, never ends).
Time: `/drip/N.jpg` (a Content-Length of 1000, then one byte every 0.2 s), `/drip-head/N` (the status line dripped),
`/hang/N` (never answers; released at shutdown), `/gate/N.png` (answers at once for N < `gate_from`, else blocks
until `release` is set; `wait_blocked(k)` waits until k requests are blocked).
Lies: `/truncate/N.png?times=` (Content-Length above what is sent, then the connection closed, the first `times`
requests, default all).
Redirects: `/redirect/N.png` (302 to /img/N.png), `/loop/N` (302 to itself), `/to/N?url=` (302 to any URL),
`/chain/N?hops=` (a chain of `hops` redirects ending at an image).
`HostileServer(tls=(cert, key))` serves the same over https. `counts` holds requests per path (query included), `times`
their arrival (time.monotonic) in order.
"""
from __future__ import annotations

import functools
import gzip
import io
import ssl
import struct
import threading
import time
import zlib
from collections import Counter, defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import numpy as np
from PIL import Image


def seed(path: str) -> int:
    return zlib.crc32(path.encode())


@functools.lru_cache(maxsize=512)
def png(seed: int, size: tuple[int, int] = (200, 150), mode: str = "RGB") -> bytes:
    """A noisy PNG (random pixels seeded by `seed`)."""
    channels = {"RGB": 3, "RGBA": 4}[mode]
    pixels = np.random.default_rng(seed).integers(0, 255, (size[1], size[0], channels), dtype=np.uint8)
    if mode == "RGBA":
        pixels[:, : size[0] // 2, 3] = 0
    buffer = io.BytesIO()
    Image.fromarray(pixels, mode).save(buffer, format="PNG")
    return buffer.getvalue()


@functools.lru_cache(maxsize=64)
def jpeg(seed: int, width: int, height: int, orientation: int = 1, quality: int = 90) -> bytes:
    """A smooth JPEG (an upsampled random field, photo-like) with an optional EXIF orientation."""
    rng = np.random.default_rng(seed)
    small = Image.fromarray(rng.integers(0, 255, (9, 12, 3), dtype=np.uint8), "RGB")
    image = small.resize((width, height), Image.Resampling.BICUBIC)
    buffer = io.BytesIO()
    exif = Image.Exif()
    if orientation != 1:
        exif[0x0112] = orientation
    image.save(buffer, format="JPEG", quality=quality, exif=exif.tobytes())
    return buffer.getvalue()


def png_header(width: int, height: int, pad: int = 4096) -> bytes:
    """A PNG claiming `width` x `height` grey pixels whose data is a small zlib stream of zeros (a bomb's header)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * pad * 256)) + \
        chunk(b"IEND", b"")


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:  # a client that hung up (a timeout cut it) is no news
        pass


class HostileServer:
    """The server (see the module docstring); a context manager that starts and stops it."""

    def __init__(self, gate_from: int = 0, tls: tuple[str, str] | None = None):
        self.counts: Counter = Counter()
        self.times: list[tuple[str, float]] = []
        self.gate_from = gate_from
        self.release = threading.Event()
        self.stopping = threading.Event()
        self.cond = threading.Condition()
        self.blocked = 0
        self.per_path: dict[str, int] = defaultdict(int)
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):
                with server.cond:
                    server.counts[self.path] += 1
                    server.times.append((self.path, time.monotonic()))
                    nth = server.counts[self.path]
                try:
                    server.respond(self, nth)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.httpd = _QuietServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        if tls is not None:  # (certificate file, key file): https
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.base = f"{'https' if tls else 'http'}://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> HostileServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def wait_blocked(self, count: int, timeout: float = 60.0) -> bool:
        """Wait until `count` /gate/ requests are blocked."""
        with self.cond:
            return self.cond.wait_for(lambda: self.blocked >= count, timeout)

    # -- behaviours ----------------------------------------------------------------------------------------------

    def respond(self, h: BaseHTTPRequestHandler, nth: int) -> None:
        parts = urlsplit(h.path)
        kind, _, name = parts.path.strip("/").partition("/")
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        number = int("".join(c for c in name.split(".")[0] if c.isdigit()) or 0)
        n = seed(parts.path)
        if kind == "hang":
            self.stopping.wait()
            return None
        if kind == "gate" and number >= self.gate_from and not self.release.is_set():
            with self.cond:
                self.blocked += 1
                self.cond.notify_all()
            self.release.wait()
        if self.status_reply(h, kind, query, nth, parts.path, n, number):
            return None
        if kind in ("drip-head", "drip", "big", "endless"):
            return self.stream_reply(h, kind)
        return self.image_reply(h, kind, query, nth, n)

    def status_reply(self, h: BaseHTTPRequestHandler, kind: str, query: dict[str, str], nth: int, path: str, n: int,
                     number: int) -> bool:
        """The error, throttle and redirect behaviours; False when `kind` (or this attempt) is none of them."""
        if kind == "fail" or (kind == "flaky" and nth == 1):
            self.send(h, 500, b"error")
        elif kind == "missing":
            self.send(h, 404, b"not found")
        elif kind == "status":
            extra = {"Retry-After": query["retry"]} if "retry" in query else {}
            self.send(h, int(query.get("code", 500)), b"status", extra)
        elif kind == "throttle" and nth <= int(query.get("times", 1)):
            self.send(h, 429, b"slow down", {"Retry-After": query.get("retry", "1")})
        elif kind in ("redirect", "loop", "to", "chain"):
            hops = int(query.get("hops", 1))
            target = {"redirect": f"/img/{n}.png", "loop": path, "to": query.get("url", "/"),
                      "chain": f"/chain/{number}?hops={hops - 1}" if hops > 1 else f"/img/{number}.png"}[kind]
            self.send(h, 302, b"", {"Location": target})
        else:
            return False
        return True

    def stream_reply(self, h: BaseHTTPRequestHandler, kind: str) -> None:
        """The slow and oversized bodies: a status line dripped a byte at a time, a body dripped likewise, a declared
        10 GB body cut short, an endless chunked body (each stops when the server does)."""
        if kind == "drip-head":
            for byte in b"HTTP/1.1 200 OK\r\n":
                if self.stopping.wait(0.2):
                    return None
                h.wfile.write(bytes([byte]))
                h.wfile.flush()
            return None
        if kind == "drip":
            h.send_response(200)
            h.send_header("Content-Length", "1000")
            h.end_headers()
            for _ in range(1000):
                if self.stopping.wait(0.2):
                    return None
                h.wfile.write(b"\xff")
                h.wfile.flush()
            return None
        if kind == "big":
            h.send_response(200)
            h.send_header("Content-Length", str(10**10))
            h.end_headers()
            h.wfile.write(b"\xff" * 1024)
            h.close_connection = True
            return None
        h.send_response(200)  # endless
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        block = b"\xff" * 65536
        while not self.stopping.is_set():
            h.wfile.write(b"%x\r\n%s\r\n" % (len(block), block))
        return None

    def image_reply(self, h: BaseHTTPRequestHandler, kind: str, query: dict[str, str], nth: int, n: int) -> None:
        """A 200 with the body of `kind` (a PNG by default), or (`truncate`, the first `times` attempts) half of it."""
        body = {"dup": lambda: png(seed("/img/0.png")), "tiny": lambda: png(n, (16, 16)),
                "short": lambda: b"0123456789", "rgba": lambda: png(n, (800, 600), "RGBA"),
                "html": lambda: b"<html><body>" + b"not an image " * 200 + b"</body></html>",
                "bomb": lambda: png_header(int(query.get("side", 12000)), int(query.get("side", 12000))),
                "gzip": lambda: gzip.compress(png(n)),
                "jpeg": lambda: jpeg(n, int(query.get("w", 1200)), int(query.get("h", 900)),
                                     int(query.get("exif", 1)))}.get(kind, lambda: png(n))()
        headers = {"Content-Type": "image/jpeg" if kind in ("html", "jpeg") else "image/png"}
        if kind == "gzip":
            headers["Content-Encoding"] = "gzip"
        if kind == "truncate" and nth <= int(query.get("times", 10**9)):
            h.send_response(200)
            h.send_header("Content-Length", str(len(body)))
            h.end_headers()
            h.wfile.write(body[: len(body) // 2])
            h.close_connection = True
            return None
        return self.send(h, 200, body, headers)

    @staticmethod
    def send(h: BaseHTTPRequestHandler, code: int, body: bytes, headers: dict | None = None) -> None:
        h.send_response(code)
        for key, value in (headers or {}).items():
            h.send_header(key, value)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)
