"""How the pending work is shared between processes and how they finish: a batch holds the same items whatever the
process count, each process marks its shard finished with a file, and the main process polls for the marks (no
collective barrier at the end, whose timeout would abort shards that finish hours apart), each process beating a
heartbeat beside its mark while it works (`pipelines.rankfiles`)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from gen.config import JOB_FOLDER
from pipelines import rankfiles

FINISHED_FOLDER = "finished"
WAIT_POLL_S = 2.0
WAIT_LOG_S = 600.0


def pending_batches(pending: list[Any], batch_size: int) -> list[list[Any]]:
    """The pending items in plan order, cut into batches; every process cuts the same batches and
    `pipelines.collectives.share` deals them out, so a batch holds the same items whatever the process count."""
    return [pending[i:i + batch_size] for i in range(0, len(pending), batch_size)]


def mark_finished(out: Path, rank: int, counts: dict[str, Any]) -> None:
    """This process's shard is done (a file, so the main process can wait for hours without a collective timeout)."""
    rankfiles.mark_done(out / JOB_FOLDER / FINISHED_FOLDER, rank, counts)


def heartbeat(out: Path, rank: int) -> rankfiles.Heartbeat:
    """While active, this process's heartbeat beside the shard marks: the main process's wait tells a process that
    stopped (killed, its machine gone) from a slow one."""
    return rankfiles.Heartbeat(out / JOB_FOLDER / FINISHED_FOLDER, rank)


def wait_for_shards(out: Path, processes: int, poll_s: float = WAIT_POLL_S, timeout_s: float | None = None,
                    log_every_s: float = WAIT_LOG_S, stale_s: float = rankfiles.STALE_S) -> list[dict[str, Any]]:
    """Main process: wait until every process marked its shard finished; returns their counts (rank order).

    Polls files instead of a collective barrier, whose default timeout (10 minutes under NCCL) would abort shards that
    finish far apart. Ends in one line (`pipelines.collectives.PeerLost`) when a process without a mark has not beaten
    for `stale_s` seconds, or after `timeout_s` when given (`TimeoutError`)."""
    return rankfiles.wait_for_ranks(out / JOB_FOLDER / FINISHED_FOLDER, processes, what="its shard", poll_s=poll_s,
                                    stale_s=stale_s, timeout_s=timeout_s, log_every_s=log_every_s)
