"""A process that holds an output folder's lock until told to let go: the second writer of the two-writer tests, with
no timing window (it says it holds the lock before the test goes on)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

HOLD = textwrap.dedent("""
    import sys
    from pipelines.locks import folder_lock
    with folder_lock(sys.argv[1], sys.argv[2]):
        print("held", flush=True)
        sys.stdin.read()  # until the test closes stdin (or kills us)
""")
ROOT = Path(__file__).resolve().parents[2]


def start_holder(folder: str | os.PathLike, command: str = "holder") -> subprocess.Popen:
    """A subprocess holding `folder`'s lock as `command`; it holds it once this returns."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder), command], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout.readline().strip() == "held"
    return proc


@contextmanager
def held(folder: str | os.PathLike, command: str = "holder") -> Iterator[subprocess.Popen]:
    """Hold `folder`'s lock in another process for the block; released (the holder exits) at its end."""
    proc = start_holder(folder, command)
    try:
        yield proc
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)
