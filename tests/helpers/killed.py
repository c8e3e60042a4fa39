"""Kill a command with SIGKILL in the middle of one of its atomic writes (the temp file written, not yet renamed), or
right after its n-th finished write of a file: deterministic kill points, no timing window."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

LAUNCHER = """
import contextlib, fnmatch, pathlib, runpy, sys, time
import pipelines.io as io
real, pattern, marker = io.atomic_path, sys.argv[1], pathlib.Path(sys.argv[2])

@contextlib.contextmanager
def slow(path):
    with real(path) as tmp:
        yield tmp
        if fnmatch.fnmatch(pathlib.Path(path).name, pattern):  # written, not yet renamed: killed here
            marker.write_text(str(tmp))
            time.sleep(600)

io.atomic_path = slow
sys.argv = ["oodforge", *sys.argv[3:]]  # `python -m oodforge <command> ...`
runpy.run_module("oodforge", run_name="__main__")
"""


def kill_during_write(command: str, args: list[str], pattern: str, env: dict[str, str], folder: Path,
                      timeout: float = 300) -> Path:
    """Run `oodforge command args` until it writes a file whose name matches `pattern` (fnmatch), SIGKILL it there and
    return the temp file it left."""
    folder.mkdir(parents=True, exist_ok=True)
    launcher, marker = folder / "kill_during_write.py", folder / "kill_during_write.marker"
    launcher.write_text(LAUNCHER)
    proc = subprocess.Popen([sys.executable, str(launcher), pattern, str(marker), command, *map(str, args)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None and not marker.exists():
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert marker.exists(), f"oodforge {command} never wrote a file matching {pattern!r}"
    temp = Path(marker.read_text())
    assert temp.is_file(), "the killed write left no temp file"
    return temp


AFTER_LAUNCHER = """
import contextlib, fnmatch, os, pathlib, runpy, signal, sys
import pipelines.io as io
real, pattern, count, marker = io.atomic_path, sys.argv[1], int(sys.argv[2]), pathlib.Path(sys.argv[3])
done = [0]

@contextlib.contextmanager
def counted(path):
    with real(path) as tmp:
        yield tmp
    if fnmatch.fnmatch(pathlib.Path(path).name, pattern):  # renamed into place: finished
        done[0] += 1
        if done[0] == count:
            marker.write_text(str(path))
            os.kill(os.getpid(), signal.SIGKILL)

io.atomic_path = counted
sys.argv = ["oodforge", *sys.argv[4:]]
runpy.run_module("oodforge", run_name="__main__")
"""


def kill_after_writes(command: str, args: list[str], pattern: str, count: int, env: dict[str, str], folder: Path,
                      timeout: float = 300) -> Path:
    """Run `oodforge command args` and SIGKILL it right after its `count`-th finished write of a file whose name
    matches `pattern` (fnmatch); return that file's path."""
    folder.mkdir(parents=True, exist_ok=True)
    launcher, marker = folder / "kill_after_writes.py", folder / "kill_after_writes.marker"
    launcher.write_text(AFTER_LAUNCHER)
    proc = subprocess.run([sys.executable, str(launcher), pattern, str(count), str(marker), command, *map(str, args)],
                          env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=timeout)
    assert proc.returncode == -signal.SIGKILL, \
        f"oodforge {command} ended before its write {count}: {proc.stderr[-2000:]}"
    return Path(marker.read_text())
