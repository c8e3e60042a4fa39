"""Measurement helpers the benchmarks share: a loopback image host that can throttle, Debian's torchvision 0.14 in a
subprocess running the Open-Insect transforms on files, a process's peak resident memory per stage, the interleaved
best-of-N timer, and the CPU's model name for a result's row.

    with LoopbackHost(lambda i: blobs[i], rps=20) as host:     # GET host.base + "/img/7.jpg" serves blobs[7]
        ...
    with Torchvision() as tv:                                  # /usr/bin/python3, its own torch and Pillow
        seconds = tv.run("train", files)                       # tv.peak_rss_mib: that stage's peak in the child
"""
from __future__ import annotations

import json
import platform
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

SYSTEM_PYTHON = "/usr/bin/python3"
"""Debian's interpreter, where python3-torchvision (0.14) lives beside its own torch 1.13 and Pillow."""

TORCHVISION = r"""
import json, sys, time
from pathlib import Path
import numpy as np
import torch
import torchvision
import torchvision.transforms as T
from PIL import Image

torch.set_num_threads(1)
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def pil_loader(path):  # torchvision.datasets.folder.pil_loader
    with open(path, "rb") as f:
        img = Image.open(f)
        return img.convert("RGB")


class Files(torch.utils.data.Dataset):
    def __init__(self, files, transform):
        self.files, self.transform = files, transform

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        return self.transform(pil_loader(self.files[i])), 0


def transforms(size, pre):
    crop = T.Compose([T.Resize(pre, interpolation=T.InterpolationMode.BILINEAR), T.CenterCrop(size)])
    train = T.Compose([T.RandomResizedCrop(size, scale=(0.3, 1)), T.RandomHorizontalFlip(),
                       T.RandAugment(num_ops=2, magnitude=9), T.Resize((size, size)), T.ToTensor(),
                       T.Normalize(MEAN, STD)])
    return crop, train, T.Compose([crop, T.ToTensor(), T.Normalize(MEAN, STD)])


def peak_kib():
    return next(int(l.split()[1]) for l in Path("/proc/self/status").read_text().splitlines() if l.startswith("VmHWM:"))


print(json.dumps({"torchvision": torchvision.__version__, "torch": torch.__version__,
                  "pillow": Image.__version__}), flush=True)
for line in sys.stdin:
    job = json.loads(line)
    files, stage = job["files"], job["stage"]
    crop, train, tensor = transforms(job["image_size"], job["pre_size"])
    torch.manual_seed(0)
    Path("/proc/self/clear_refs").write_text("5")
    start, cpu = time.perf_counter(), time.process_time()
    if stage == "decode":
        for f in files:
            pil_loader(f)
    elif stage in ("eval", "train"):
        loader = torch.utils.data.DataLoader(Files(files, tensor if stage == "eval" else train),
                                             batch_size=job["batch"], shuffle=job.get("shuffle", False), num_workers=0)
        for x, _ in loader:
            pass
    elif stage == "pixels":
        np.savez(job["out"], *[np.asarray(crop(pil_loader(f))) for f in files])
    print(json.dumps({"seconds": time.perf_counter() - start, "cpu_seconds": time.process_time() - cpu,
                      "peak_rss_mib": peak_kib() / 1024}), flush=True)
"""
"""The child's program: one JSON job a line (stage decode / eval / train / pixels over `files`), one JSON answer."""


def torchvision_missing(python: str = SYSTEM_PYTHON) -> str | None:
    """Why `python` cannot run the torchvision child (None when it can)."""
    try:
        run = subprocess.run([python, "-c", "import torchvision"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"{python}: {err}"
    return None if run.returncode == 0 else f"{python}: {run.stderr.strip().splitlines()[-1:]}"


class Torchvision:
    """Debian's torchvision in a subprocess (one thread, no loader workers) that runs one stage per request and
    reports its own wall time (returned), CPU time (`cpu_seconds`) and peak RSS (`peak_rss_mib`, VmHWM reset before
    the stage) of each stage."""

    def __init__(self, python: str = SYSTEM_PYTHON, image_size: int = 126, pre_size: int = 128, batch: int = 32):
        self.sizes = {"image_size": image_size, "pre_size": pre_size, "batch": batch}
        self.proc = subprocess.Popen([python, "-c", TORCHVISION], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
        self.versions = json.loads(self.proc.stdout.readline())
        self.peak_rss_mib = self.cpu_seconds = 0.0

    def run(self, stage: str, files: Sequence[str | Path], **extra: Any) -> float:
        job = {"stage": stage, "files": [str(f) for f in files], **self.sizes, **extra}
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        answer = json.loads(self.proc.stdout.readline())
        self.peak_rss_mib, self.cpu_seconds = float(answer["peak_rss_mib"]), float(answer["cpu_seconds"])
        return float(answer["seconds"])

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)

    def __enter__(self) -> Torchvision:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class LoopbackHost:
    """An image host on 127.0.0.1: `GET /img/<i>.<ext>?...` answers `pool(i)` (a callable) or `pool[i % len(pool)]`
    (a list); `rps`: 429 with Retry-After: 1 past that many accepted requests in the last second; `delay`: seconds
    before each answer. Counts `requests`, `throttled` and the wall time of the `first` request."""

    def __init__(self, pool: Callable[[int], bytes] | Sequence[bytes], rps: float | None = None, delay: float = 0.0):
        self.pool, self.rps, self.delay = pool, rps, delay
        self.lock = threading.Lock()
        self.accepted: deque = deque()
        self.requests = self.throttled = 0
        self.first: float | None = None
        host = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                code, body = host.answer(self.path)
                self.send_response(code)
                if code == 429:
                    self.send_header("Retry-After", "1")
                self.send_header("Content-Type", "image/jpeg")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 256

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def answer(self, path: str) -> tuple[int, bytes]:
        with self.lock:
            self.requests += 1
            self.first = self.first or time.time()
            if self.rps is not None:
                now = time.monotonic()
                while self.accepted and self.accepted[0] <= now - 1.0:
                    self.accepted.popleft()
                if len(self.accepted) >= self.rps:
                    self.throttled += 1
                    return 429, b"slow down"
                self.accepted.append(now)
        if self.delay:
            time.sleep(self.delay)
        try:
            index = int(path.split("/")[2].split(".")[0])
        except (IndexError, ValueError):
            return 404, b"not found"
        return 200, self.pool(index) if callable(self.pool) else self.pool[index % len(self.pool)]

    def reset(self) -> None:
        with self.lock:
            self.accepted.clear()
            self.requests = self.throttled = 0
            self.first = None

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> LoopbackHost:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _status_kib(field: str) -> int | None:
    try:
        lines = Path("/proc/self/status").read_text().splitlines()
    except OSError:  # not Linux
        return None
    return next((int(line.split()[1]) for line in lines if line.startswith(field)), None)


def reset_peak_rss() -> None:
    """Start a new peak-RSS window for this process (Linux: /proc/self/clear_refs; elsewhere nothing)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def peak_rss_mib() -> float | None:
    """This process's peak RSS since the last `reset_peak_rss` (VmHWM), in MiB; None where /proc is missing."""
    kib = _status_kib("VmHWM:")
    return None if kib is None else kib / 1024


def best_of(rounds: int, runs: dict[str, Callable[[], float | None]]) -> dict[str, float]:
    """The fewest seconds of each run over `rounds` rounds, the runs interleaved within each round. A run returns its
    own seconds (a subprocess's, say), or None to be timed here from call to return."""
    best: dict[str, float] = {}
    for _ in range(rounds):
        for name, run in runs.items():
            start = time.perf_counter()
            seconds = run()
            seconds = time.perf_counter() - start if seconds is None else seconds
            best[name] = min(best.get(name, float("inf")), seconds)
    return best


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU's model name ("AMD EPYC", "Intel(R) Xeon(R) ..."): ratios against a peer move from one CPU to another,
    so a row says which it ran on. Else the platform's processor or machine string."""
    try:
        for line in Path(cpuinfo).read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
