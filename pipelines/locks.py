"""One writer per output folder: a lock file naming its holder (host, pid, command, start time).

`folder_lock(folder, command)` creates `folder/.oodforge.lock` exclusively (`O_CREAT | O_EXCL`, umask kept) and removes
it on exit. A second process on the same folder waits up to `wait` seconds, then is refused in one line naming the
holder (`FolderBusy`, exit 2 through `pipelines.cli.run_main`). A lock whose holder is gone (same host, its pid has
exited or belongs to another process, told by the process's start time) is taken over, and a warning says so.
The liveness of another host's process cannot be checked, so the holder beats instead: while it holds the lock, a
thread refreshes the file's modification time every `LOCK_BEAT_S` seconds, and another host's lock is taken over once
it has not been refreshed for `LOCK_STALE_S` seconds (its run is gone: killed with its machine, or cut off from the
shared folder); until then the refusal names the host and how long ago it beat. Takeovers are serialised by an
`flock` on `folder/.oodforge.lock.guard`, so two late-comers never both take one stale lock. A folder the lock
created is removed again when the block leaves it empty (a failed run leaves no empty output folder behind).

`output_lock(folder, command, main)` is the lock of a multi-process run (accelerate, torchrun): only the main process
takes it, since only it writes the outputs; a refusal stops the main process, and the launcher stops the others.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

from pipelines.errors import UserInputError
from pipelines.io import _alive

LOCK_NAME = ".oodforge.lock"
LOCK_BEAT_S = 30.0  # a holder refreshes its lock file this often
LOCK_STALE_S = 600.0  # another host's lock not refreshed this long is taken over (clocks of hosts may differ a little)
log = logging.getLogger(__name__)


class FolderBusy(UserInputError):
    """Another live process holds the folder's lock."""


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (`/proc/<pid>/stat` field 22), None where unreadable."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _holder_text(holder: dict[str, Any]) -> str:
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("since", 0)))
    return f"pid {holder.get('pid')} on {holder.get('host')} ({holder.get('command')}, since {since})"


def _read(path: Path) -> dict[str, Any] | None:
    """The lock's holder, {} for an unreadable or half-written lock file, None when the file is gone."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError:
        return {}
    try:
        holder = json.loads(text)
    except json.JSONDecodeError:
        return {}
    return holder if isinstance(holder, dict) else {}


def _gone(holder: dict[str, Any], path: Path) -> bool:
    """True when the holder is a process of this host that has exited (or whose pid another process has taken).
    A lock file that holds no readable holder counts as gone once it is a minute old (a writer killed between the
    create and the write)."""
    if not holder:
        try:
            return time.time() - path.stat().st_mtime > 60
        except OSError:
            return True
    if holder.get("host") != socket.gethostname():
        return _age(path) > LOCK_STALE_S
    pid = int(holder.get("pid", -1))
    if pid <= 0 or not _alive(pid):
        return True
    started = holder.get("started")
    return started is not None and _start_time(pid) not in (None, started)


def _age(path: Path) -> float:
    """Seconds since the lock file was last refreshed (0 when it is gone)."""
    try:
        return time.time() - path.stat().st_mtime
    except OSError:
        return 0.0


class _Beat:
    """While active, refreshes the lock file's modification time every `LOCK_BEAT_S` seconds (it stays ours)."""

    def __init__(self, path: Path):
        self.path, self.stop = path, threading.Event()
        self.thread = threading.Thread(target=self._loop, name="oodforge-lock-beat", daemon=True)

    def _loop(self) -> None:
        while not self.stop.wait(LOCK_BEAT_S):
            holder = _read(self.path)
            if holder and holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
                with contextlib.suppress(OSError):
                    os.utime(self.path)

    def __enter__(self) -> _Beat:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        self.thread.join()


def _create(path: Path, command: str) -> bool:
    """Create the lock file exclusively with this process as holder; False when it exists."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except FileExistsError:
        return False
    me = {"host": socket.gethostname(), "pid": os.getpid(), "started": _start_time(os.getpid()), "command": command,
          "since": time.time()}
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(me) + "\n")
    return True


def _take_over_if_gone(path: Path) -> bool:
    """Remove a stale lock under the guard's flock (re-read there, so only one late-comer removes it). A live holder
    is told without the guard, so a refused writer leaves no file behind."""
    holder = _read(path)
    if holder is not None and not _gone(holder, path):
        return False
    guard = path.with_name(path.name + ".guard")
    with open(guard, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        holder = _read(path)
        if holder is None:
            return True
        if not _gone(holder, path):
            return False
        log.warning("%s: taking over the stale lock of %s, which no longer runs", path.parent,
                    _holder_text(holder) if holder else "an unknown writer")
        path.unlink(missing_ok=True)
        return True


@contextmanager
def folder_lock(folder: str | os.PathLike, command: str, wait: float = 0.0, poll: float = 0.2) -> Iterator[Path]:
    """Hold `folder`'s lock for the block (the folder is created if missing). Waits up to `wait` seconds for a live
    holder to finish, then raises FolderBusy naming it; a stale lock is taken over with a warning."""
    folder = Path(folder)
    created = _missing_parents(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    deadline = time.monotonic() + wait
    while not _create(path, command):
        if _take_over_if_gone(path):
            continue
        if time.monotonic() >= deadline:
            holder = _read(path) or {}
            where = "" if holder.get("host") in (None, socket.gethostname()) else \
                (f"; it is another host's lock, refreshed {_age(path):.0f} s ago: it is taken over once not refreshed "
                 f"for {LOCK_STALE_S:.0f} s")
            raise FolderBusy(f"{folder}: in use by {_holder_text(holder)}; wait for it to finish or pass another "
                             f"output folder{where}")
        time.sleep(poll)
    try:
        with _Beat(path):
            yield path
    finally:
        holder = _read(path)
        if holder and holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
            path.unlink(missing_ok=True)
        _remove_if_empty(created)


def _missing_parents(folder: Path) -> list[Path]:
    """`folder` and those of its parents that do not exist yet, deepest first."""
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return missing


def _remove_if_empty(created: list[Path]) -> None:
    """Remove the folders `folder_lock` created, deepest first, as long as they are empty."""
    for folder in created:
        try:
            folder.rmdir()  # refused (OSError) when anything is in it
        except OSError:
            return


def output_lock(folder: str | os.PathLike, command: str, main: bool = True, wait: float = 0.0) -> Any:
    """`folder_lock(folder, command, wait)` in the process that writes the outputs (`main`), nothing in the others."""
    return folder_lock(folder, command, wait) if main else nullcontext(Path(folder) / LOCK_NAME)
