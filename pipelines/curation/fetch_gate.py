"""Which download starts next: per-host queues, an adaptive rate per host, and a fair share of the workers.

- **Fair share.** Of the hosts allowed to start a request now, the one with the fewest requests in flight goes first,
  so a slow host beside a fast one holds about half the workers, not all of them (processor sharing).
- **Adaptive rate** (`HostState`). A host starts unthrottled (or at `cap` requests a second when set). A 429 or 503
  starts a *throttle round*: the host is paused for its `Retry-After` (at most `retry_after_max`; without one,
  `backoff` doubling per round), and its rate drops to `DECREASE` x the requests it answered in the last second (its
  measured allowance, bodies received; half its rate, or half the workers, when it answered none). Answers to
  requests started before the round began do not cut it again. Successes raise the rate by `RECOVERY` a second, ten
  times slower between `PLATEAU` and `PROBE` times the last allowance (so the fetch runs long just under what the
  host allows and throttle rounds are rare), at the full pace again above it (a host that allows more is probed
  upwards).
- **Give up.** After `give_up_after` throttle rounds in a row with no success between them, the host's remaining
  items are handed back (`Scheduler.given_up`) to be recorded as transient failures: the run goes on with the other
  hosts, and a rerun tries them again.
- **Retries** of other transient failures wait `backoff * 2**(attempt-1)` on their own, without holding the host.

`clock` and `wait` are injectable, so tests drive time by hand.
"""
from __future__ import annotations

import heapq
import itertools
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

DECREASE = 0.9  # the rate after a throttle round, as a share of the host's measured allowance
RECOVERY = 0.01  # the rate's growth per second of successes (1 %/s: about 7 s from 0.9x to 0.97x the allowance)
PLATEAU, PROBE, NEAR_CEILING = 0.97, 1.05, 0.1  # between 0.97x and 1.05x the last allowance growth is 0.1 %/s
MIN_RATE = 0.05  # requests a second a host is never paced below
WINDOW = 1.0  # seconds over which a host's answered requests are counted


@dataclass
class Item:
    """One URL to fetch; `attempt` counts its transient failures (throttles excluded)."""

    url: str
    file_name: str
    attempt: int = 0
    extra: dict = field(default_factory=dict)


@dataclass
class HostState:
    """One host's queue and pacing."""

    name: str
    rate: float
    pending: deque = field(default_factory=deque)
    retry: list = field(default_factory=list)  # heap of (not_before, seq, Item)
    inflight: int = 0
    next_start: float = 0.0
    paused_until: float = 0.0
    round_began: float = -math.inf  # when the current throttle round began
    rounds: int = 0  # throttle rounds in a row with no success
    answered: deque = field(default_factory=deque)  # times of answers (bodies) in the last WINDOW seconds
    ceiling: float = math.inf  # the allowance measured at the last throttle round
    grown_at: float = 0.0
    gen: int = 0
    given_up: bool = False
    throttles: int = 0
    last_retry_after: float | None = None

    def has_items(self) -> bool:
        return bool(self.pending or self.retry)


class Scheduler:
    """Hands (host, item, started) to worker threads; they report back with `succeeded`, `throttled`, `retry` or
    `finished`. `take` returns None once nothing is left (every item finished or given up)."""

    def __init__(self, items: list[Item], host_of: Callable[[str], str], *, workers: int, cap: float | None = None,
                 backoff: float = 1.0, retry_after_max: float = 60.0, give_up_after: int = 10,
                 clock: Callable[[], float] = time.monotonic):
        self.host_of, self.workers, self.cap = host_of, workers, cap
        self.backoff, self.retry_after_max, self.give_up_after = backoff, retry_after_max, give_up_after
        self.clock = clock
        self.cond = threading.Condition()
        self.hosts: dict[str, HostState] = {}
        self.waiting: list[tuple[float, int, int, str]] = []  # (ready_at, seq, gen, host)
        self.ready: list[tuple[int, int, int, str]] = []  # (inflight, seq, gen, host)
        self.seq = itertools.count()
        self.outstanding = 0
        self.stopped = False
        self.given_up: list[tuple[str, Item]] = []  # (host, item) handed back after a host was given up
        for item in items:
            self._host(host_of(item.url)).pending.append(item)
            self.outstanding += 1
        with self.cond:
            now = clock()
            for host in self.hosts.values():
                self._schedule(host, now)

    # -- bookkeeping (under self.cond) ------------------------------------------------------------------------

    def _host(self, name: str) -> HostState:
        host = self.hosts.get(name)
        if host is None:
            host = self.hosts[name] = HostState(name, self.cap if self.cap is not None else math.inf)
        return host

    def _ready_at(self, host: HostState) -> float:
        item_ready = -math.inf if host.pending else host.retry[0][0]
        return max(host.next_start, host.paused_until, item_ready)

    def _schedule(self, host: HostState, now: float) -> None:
        """(Re)enter the host in the ready or waiting heap when it has an item and a free slot."""
        host.gen += 1
        if host.given_up or not host.has_items() or host.inflight >= self.workers:
            return
        ready_at = self._ready_at(host)
        if ready_at <= now:
            heapq.heappush(self.ready, (host.inflight, next(self.seq), host.gen, host.name))
        else:
            heapq.heappush(self.waiting, (ready_at, next(self.seq), host.gen, host.name))
        self.cond.notify()

    def _pick(self, now: float) -> tuple[HostState, Item] | float | None:
        """The next (host, item) to start now, else the time the next one will be ready (None: none known)."""
        while self.waiting and self.waiting[0][0] <= now:
            _, seq, gen, name = heapq.heappop(self.waiting)
            if gen == self.hosts[name].gen:
                heapq.heappush(self.ready, (self.hosts[name].inflight, seq, gen, name))
        while self.ready:
            _, _, gen, name = heapq.heappop(self.ready)
            host = self.hosts[name]
            if gen != host.gen:
                continue
            if host.retry and (host.retry[0][0] <= now or not host.pending):
                item = heapq.heappop(host.retry)[2]
            else:
                item = host.pending.popleft()
            host.inflight += 1
            interval = 1.0 / min(host.rate, self.cap or math.inf)
            host.next_start = max(now, host.next_start) + interval if interval > 0 else now
            self._schedule(host, now)
            return host, item
        while self.waiting and self.waiting[0][2] != self.hosts[self.waiting[0][3]].gen:
            heapq.heappop(self.waiting)
        return self.waiting[0][0] if self.waiting else None

    def _settle(self, host: HostState, now: float, outstanding: int = -1) -> None:
        host.inflight -= 1
        self.outstanding += outstanding
        self._schedule(host, now)
        self.cond.notify_all() if self.outstanding == 0 else self.cond.notify()

    # -- the workers' calls --------------------------------------------------------------------------------------

    def take(self) -> tuple[str, Item, float] | None:
        """Block until an item may start; (host, item, start time), or None when nothing is left."""
        with self.cond:
            while True:
                if self.outstanding <= 0 or self.stopped:
                    return None
                now = self.clock()
                picked = self._pick(now)
                if isinstance(picked, tuple):
                    return picked[0].name, picked[1], now
                self.cond.wait(None if picked is None else max(0.0, picked - now))

    def answered(self, host_name: str) -> None:
        """The host answered a request with its body (counted towards its measured allowance)."""
        with self.cond:
            now, host = self.clock(), self.hosts[host_name]
            host.answered.append(now)
            while host.answered and host.answered[0] < now - WINDOW:
                host.answered.popleft()

    def succeeded(self, host_name: str, started: float) -> None:
        """The item is done (fetched, or failed for a reason that is not the host's)."""
        with self.cond:
            now, host = self.clock(), self.hosts[host_name]
            host.rounds = 0
            if math.isfinite(host.rate):
                near = PLATEAU * host.ceiling <= host.rate <= PROBE * host.ceiling
                growth = RECOVERY * (NEAR_CEILING if near else 1.0)
                host.rate = min(self.cap or math.inf, host.rate * (1 + growth) ** max(0.0, now - host.grown_at))
            host.grown_at = max(now, host.grown_at)
            self._settle(host, now)

    finished = succeeded

    def retry(self, host_name: str, item: Item, delay: float) -> None:
        """Queue the item again after `delay` seconds (a transient failure of its own)."""
        with self.cond:
            now, host = self.clock(), self.hosts[host_name]
            heapq.heappush(host.retry, (now + delay, next(self.seq), item))
            self._settle(host, now, outstanding=0)

    def throttled(self, host_name: str, item: Item, started: float, retry_after: float | None) -> None:
        """The host answered 429 / 503: the item is queued again, the host paused and slowed (one cut per round);
        after `give_up_after` rounds in a row the host is given up (`given_up`)."""
        with self.cond:
            now, host = self.clock(), self.hosts[host_name]
            host.throttles += 1
            host.last_retry_after = retry_after
            if started > host.round_began:  # a new round: requests started before the last cut do not cut again
                host.rounds += 1
                host.round_began = now
                while host.answered and host.answered[0] < now - WINDOW:
                    host.answered.popleft()
                allowance = len(host.answered) / WINDOW
                base = allowance if allowance > 0 else (host.rate if math.isfinite(host.rate) else self.workers) / 2
                host.ceiling = base
                host.rate = max(MIN_RATE, DECREASE * base)
                pause = self.backoff * 2 ** (host.rounds - 1)
                host.paused_until = now + min(self.retry_after_max, max(retry_after or 0.0, pause))
                host.grown_at = host.paused_until  # the rate grows from the pause's end
            heapq.heappush(host.retry, (host.paused_until, next(self.seq), item))
            if host.rounds >= self.give_up_after and not host.given_up:
                host.given_up = True
                left = [entry[2] for entry in sorted(host.retry)] + list(host.pending)
                host.retry.clear()
                host.pending.clear()
                self.given_up += [(host.name, i) for i in left]
                self.outstanding -= len(left)
            elif host.given_up:  # an answer in flight when the host was given up
                host.retry.clear()
                self.given_up.append((host.name, item))
                self.outstanding -= 1
            self._settle(host, now, outstanding=0)

    def stop(self) -> None:
        """Let every waiting worker return (an error ends the run)."""
        with self.cond:
            self.stopped = True
            self.cond.notify_all()
