"""Kill a command with SIGKILL in the middle of one of its atomic writes (the temp file written, not yet renamed)."""
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
