"""Processes that finish far apart meet through files, not a collective: each rank writes a done mark when its share
is finished and a heartbeat while it works; the main process waits for the marks.

A collective barrier would time out (30 minutes under gloo and accelerate's default, 10 under NCCL) when one rank's
share takes hours longer; a file wait does not. It still ends, in one line naming the rank and its host: when a rank
that has not finished stopped beating for `stale_s` seconds (killed, out of memory, its machine gone; `PeerLost`), or
after `timeout_s` when one is given (`TimeoutError`). The folder must be one every process sees (`out`).
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from pipelines.collectives import PeerLost, all_gather, host, main_decides, world
from pipelines.errors import UserInputError
from pipelines.io import atomic_write_json, atomic_write_text

log = logging.getLogger(__name__)

BEAT_S = 10.0  # seconds between a working rank's heartbeats
STALE_S = 300.0  # a rank silent this long, not finished, is gone
POLL_S = 1.0
LOG_S = 600.0
SHARED_WAIT_S = 30.0  # how long a process looks for the main process's probe file (NFS caches directory entries)


def _mark(folder: Path, rank: int) -> Path:
    return folder / f"process-{rank:03d}.json"


def _beat(folder: Path, rank: int) -> Path:
    return folder / f"process-{rank:03d}.alive.json"


def mark_done(folder: str | os.PathLike, rank: int, payload: dict[str, Any]) -> None:
    """This rank's share is finished; `payload` is what the main process reads back."""
    atomic_write_json(_mark(Path(folder), rank), {**payload, "host": host(), "pid": os.getpid()})


def clear(folder: str | os.PathLike) -> None:
    """Remove the marks and heartbeats of an earlier run (main process, before any rank starts its share)."""
    folder = Path(folder)
    if folder.is_dir():
        for path in folder.glob("process-*.json"):
            path.unlink(missing_ok=True)


class Heartbeat:
    """A context manager: while active, a thread rewrites this rank's heartbeat file every `beat_s` seconds."""

    def __init__(self, folder: str | os.PathLike, rank: int, beat_s: float = BEAT_S):
        self.path, self.beat_s = _beat(Path(folder), rank), beat_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="oodforge-heartbeat", daemon=True)

    def _write(self) -> None:
        try:
            atomic_write_json(self.path, {"host": host(), "pid": os.getpid(), "time": time.time()})
        except OSError as err:  # a full disk is reported by the work itself; the beat only informs the wait
            log.debug("heartbeat %s: %s", self.path, err)

    def _loop(self) -> None:
        while not self._stop.wait(self.beat_s):
            self._write()

    def __enter__(self) -> Heartbeat:
        self._write()
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


def wait_for_ranks(folder: str | os.PathLike, processes: int, *, what: str = "its share",
                   poll_s: float = POLL_S, stale_s: float = STALE_S, timeout_s: float | None = None,
                   log_every_s: float = LOG_S) -> list[dict[str, Any]]:
    """Main process: every rank's done mark (rank order) once all are written. Raises `PeerLost` when a rank without
    a mark has a heartbeat older than `stale_s` (or none `stale_s` after the wait began), `TimeoutError` after
    `timeout_s` (None: no limit while every rank beats)."""
    folder = Path(folder)
    started = last_log = time.monotonic()
    while True:
        missing = [r for r in range(processes) if not _mark(folder, r).is_file()]
        if not missing:
            return [json.loads(_mark(folder, r).read_text(encoding="utf-8")) for r in range(processes)]
        now, wall = time.monotonic(), time.time()
        for rank in missing:
            beat = _read(_beat(folder, rank))
            silent = wall - beat["time"] if beat else now - started
            if silent > stale_s:
                where = f"on {beat['host']} (pid {beat['pid']})" if beat else "(no heartbeat seen)"
                raise PeerLost(f"process {rank} {where} stopped before finishing {what}: silent for {silent:.0f} s; "
                               "finished work is kept: rerun the same command to resume")
        if timeout_s is not None and now - started > timeout_s:
            raise TimeoutError(f"{processes - len(missing)} of {processes} processes finished {what} after "
                               f"{timeout_s:.0f} s (waiting for {missing})")
        if now - last_log >= log_every_s:
            log.info("waiting for process(es) %s to finish %s (%.1f h so far)", missing, what, (now - started) / 3600)
            last_log = now
        time.sleep(poll_s)


def _read(path: Path) -> dict[str, Any] | None:
    try:
        beat = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return beat if isinstance(beat, dict) and isinstance(beat.get("time"), (int, float)) else None



def check_shared(folders: dict[str, str | os.PathLike], wait_s: float = SHARED_WAIT_S) -> None:
    """At the start of a multi-process run: every process sees the files the main process writes in each of
    `folders` (config key -> folder), else every process stops with one line naming the key, the folder and the
    processes (and hosts) that do not see it (`UserInputError`: exit 2, on every rank together, never a hang)."""
    rank, size = world()
    if size == 1:
        return
    token = main_decides(lambda: f"{os.getpid()}-{time.time_ns()}", "the shared folders' check")
    probes = {key: Path(folder) / f".oodforge-shared-{token}" for key, folder in folders.items()}
    if rank == 0:
        for probe in probes.values():
            probe.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(probe, token)
    all_gather(None, "the shared folders' check")  # the probes are written
    deadline = time.monotonic() + wait_s
    missing = [key for key, probe in probes.items() if not _sees(probe, token, deadline)]
    said = all_gather((host(), missing), "the shared folders' check")
    if rank == 0:
        for probe in probes.values():
            probe.unlink(missing_ok=True)
    for key in folders:
        blind = [f"{r} on {where}" for r, (where, keys) in enumerate(said) if key in keys]
        if blind:
            raise UserInputError(f"{key}: {folders[key]} is not one folder for every process: process(es) "
                                 f"{', '.join(blind)} do not see what the main process on {said[0][0]} writes there; "
                                 "with several machines it must be on a shared file system")


def _sees(probe: Path, token: str, deadline: float) -> bool:
    while True:
        try:
            if probe.read_text(encoding="utf-8") == token:
                return True
        except OSError:
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.5)
