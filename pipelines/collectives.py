"""One decision for every process: what a collective depends on is decided by the main process and broadcast.

Under `accelerate launch` / `torchrun`, each process reading the disk alone can see other files (a folder that is not
shared, NFS lag): one process would skip a collective the others enter, and the run would hang. So whatever decides
whether a collective runs (a cache reused, a unit finished, the pending items, the epoch a training resumes from) is
computed once on the main process (`main_decides`) and every process follows it. A peer process that dies makes the
next collective fail; `peer_guard` turns that failure into one line naming the peer (`PeerLost`), never into a
result of the work that was running. A process whose part of work run together raises says so once
(`fail_together`); every helper here is one tagged all-gather, so the others meet that word in whatever helper they are
in and raise `PeerFailed` there, at once, rather than wait for the process group's time-out. Outside a multi-process
run every helper is the identity.
"""
from __future__ import annotations

import contextlib
import re
import socket
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from pipelines.errors import UserInputError

T = TypeVar("T")

# what gloo / NCCL / the TCP store say when the other end of a collective is gone
_PEER_GONE = re.compile(r"connection (closed|reset) by peer|broken pipe|socket timeout|timed out|"
                        r"NCCL communicator was aborted|recvBytes|Connection refused|DistNetworkError|"
                        r"ProcessGroup.*(aborted|terminated)", re.IGNORECASE)
_PEER_ADDRESS = re.compile(r"\[?(\d{1,3}(?:\.\d{1,3}){3}|[0-9a-f:]+:[0-9a-f:]*)\]?:(\d+)", re.IGNORECASE)


_ALONE = False


@contextlib.contextmanager
def alone() -> Iterator[None]:
    """Work inside runs on this process by itself (a unit given to one rank): `sharing()` is 1, so nothing inside
    splits its rows across processes or enters a collective."""
    global _ALONE
    before, _ALONE = _ALONE, True
    try:
        yield
    finally:
        _ALONE = before


def sharing() -> int:
    """How many processes share the work now running: 1 inside `alone()`, else the number of processes."""
    return 1 if _ALONE else world()[1]


class PeerLost(UserInputError):
    """A process of the run stopped (killed, out of memory, its machine gone): not the user's input, but reported
    the same way, in one line; the finished work is kept and the same command resumes."""


def world() -> tuple[int, int]:
    """(rank, number of processes) of the torch.distributed group; (0, 1) outside one."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def share(n: int, rank: int | None = None, processes: int | None = None) -> range:
    """The contiguous share of n items that process `rank` of `processes` (default: `world()`) takes: the first
    n % processes ranks one item more, a rank past the items none. accelerate's `split_between_processes` deals the
    same shares except there: before 1.8 it hands such a rank the last item again, which would run (and gather) it
    twice."""
    if rank is None or processes is None:
        rank, processes = world()
    size, extra = divmod(n, processes)
    start = rank * size + min(rank, extra)
    return range(start, start + size + (rank < extra))


def host() -> str:
    """This machine's name as the run's messages give it (`OODFORGE_HOST` stands in for it in tests of several
    nodes on one machine)."""
    import os

    return os.environ.get("OODFORGE_HOST") or socket.gethostname()


def is_peer_lost(err: BaseException) -> bool:
    """True when `err` is a collective failing because another process is gone (not an error of the work itself)."""
    import torch.distributed as dist

    backend_error = getattr(dist, "DistBackendError", None)
    network_error = getattr(dist, "DistNetworkError", None)
    if any(kind is not None and isinstance(err, kind) for kind in (backend_error, network_error)):
        return True
    return isinstance(err, RuntimeError) and bool(_PEER_GONE.search(str(err)))


def peer_line(err: BaseException, what: str) -> str:
    """One line for a lost peer: what was running, the peer's address when the library names it, how to resume."""
    text = " ".join(str(err).split())
    found = _PEER_ADDRESS.search(text)
    peer = f"the peer process at {found.group(1)}:{found.group(2)}" if found else "a peer process"
    rank, size = world()
    return (f"{peer} stopped during {what} (this is rank {rank} of {size} on {host()}; {text[:160]}); finished work "
            "is kept: rerun the same command to resume")


@contextlib.contextmanager
def peer_guard(what: str) -> Iterator[None]:
    """Turn a collective's failure for a lost peer into `PeerLost` (one line); any other error passes unchanged."""
    try:
        yield
    except PeerLost:
        raise
    except Exception as err:  # noqa: BLE001 - only a lost peer is translated; the rest is re-raised as it was
        if is_peer_lost(err):
            raise PeerLost(peer_line(err, what)) from err
        raise


class PeerFailed(RuntimeError):
    """Another process raised in the work every process runs together: this one stops at the collective where it
    learnt it (the failing process said so there, `fail_together`), so no process waits for one that left."""

    def __init__(self, rank: int, text: str):
        super().__init__(f"rank {rank}: {text}")
        self.rank, self.text = rank, text


def _exchange(tagged: tuple[str | None, Any], what: str) -> list[tuple[str | None, Any]]:
    """Every process's (error or None, value) in rank order: the one collective every helper here goes through, so
    a failing process's `fail_together` meets whatever helper the others are in."""
    import torch.distributed as dist

    out: list[Any] = [None] * world()[1]
    with peer_guard(what):
        dist.all_gather_object(out, tagged)
    return out


def _values(said: list[tuple[str | None, Any]]) -> list[Any]:
    """The values of an exchange; `PeerFailed` when a process said it failed (the lowest rank named)."""
    for rank, (error, _) in enumerate(said):
        if error is not None:
            raise PeerFailed(rank, error)
    return [value for _, value in said]


def fail_together(text: str, what: str = "a failure") -> None:
    """Say to every process that this one's part of the work run together failed (`text`): each of the others meets
    it at the collective it is in (it raises `PeerFailed` there) or at the agreement after the work."""
    if world()[1] > 1:
        _exchange((text, None), what)


def broadcast(value: T, what: str = "a broadcast") -> T:
    """The main process's `value` on every process; `value` itself with one process. (An all-gather of the small
    objects this carries, so a failing process's `fail_together` meets it.)"""
    rank, size = world()
    if size == 1:
        return value
    return _values(_exchange((None, value if rank == 0 else None), what))[0]


def main_decides(decide: Callable[[], T], what: str = "a decision") -> T:
    """`decide()` computed on the main process only and broadcast: every process follows one decision, whatever
    files it sees itself."""
    rank, _ = world()
    return broadcast(decide() if rank == 0 else None, what)


def all_gather(value: Any, what: str = "a gather") -> list[Any]:
    """Every process's `value` in rank order, on every process (`[value]` with one process); `PeerFailed` when a
    process said instead that its part failed (`fail_together`)."""
    if world()[1] == 1:
        return [value]
    return _values(_exchange((None, value), what))


def gather_to_main(value: Any, what: str = "a gather") -> list[Any] | None:
    """Every process's `value` in rank order on the main process, None on the others (`[value]` with one process)."""
    said = all_gather(value, what)
    return said if world()[0] == 0 else None
