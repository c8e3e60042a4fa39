"""How the pending work is shared between processes and how they finish: a batch holds the same items whatever the
process count, each process marks its shard finished with a file, and the main process polls for the marks (no
collective barrier at the end, whose timeout would abort shards that finish hours apart)."""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from pipelines.io import atomic_write_json

from gen.config import JOB_FOLDER

log = logging.getLogger(__name__)

FINISHED_FOLDER = "finished"
WAIT_POLL_S = 2.0
WAIT_LOG_S = 600.0


def pending_batches(pending: list[Any], batch_size: int) -> list[list[Any]]:
    """The pending items in plan order, cut into batches; every process cuts the same batches and
    `split_between_processes` deals them out, so a batch holds the same items whatever the process count."""
    return [pending[i:i + batch_size] for i in range(0, len(pending), batch_size)]


def mark_finished(out: Path, rank: int, counts: dict[str, Any]) -> None:
    """This process's shard is done (a file, so the main process can wait for hours without a collective timeout)."""
    atomic_write_json(out / JOB_FOLDER / FINISHED_FOLDER / f"process-{rank:03d}.json", counts)


def wait_for_shards(out: Path, processes: int, poll_s: float = WAIT_POLL_S, timeout_s: float | None = None,
                    log_every_s: float = WAIT_LOG_S) -> list[dict[str, Any]]:
    """Main process: wait until every process marked its shard finished; returns their counts.

    Polls files instead of a collective barrier, whose default timeout (10 minutes under NCCL) would abort shards that
    finish far apart. No timeout by default: a crashed process ends the whole launch (torchrun / accelerate)."""
    folder = out / JOB_FOLDER / FINISHED_FOLDER
    started = last_log = time.monotonic()
    while True:
        marks = sorted(folder.glob("process-*.json")) if folder.is_dir() else []
        if len(marks) >= processes:
            return [json.loads(p.read_text(encoding="utf-8")) for p in marks]
        now = time.monotonic()
        if timeout_s is not None and now - started > timeout_s:
            raise TimeoutError(f"{len(marks)} of {processes} processes finished their shard after {timeout_s:.0f} s")
        if now - last_log >= log_every_s:
            done = {p.stem for p in marks}
            missing = [r for r in range(processes) if f"process-{r:03d}" not in done]
            log.info("[generate] waiting for process(es) %s to finish (%.1f h so far)", missing, (now - started) / 3600)
            last_log = now
        time.sleep(poll_s)


