"""The per-host scheduler driven by a hand-set clock (no thread, no sleep): fair share between hosts, the fixed cap,
a throttle round's pause (Retry-After, its cap, the doubling backoff), one cut per round, recovery, give-up."""
from __future__ import annotations

import math

import pytest

from pipelines.curation.fetch_client import host_of, parse_retry_after
from pipelines.curation.fetch_gate import DECREASE, RECOVERY, Item, Scheduler


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def items(host: str, n: int) -> list[Item]:
    return [Item(f"http://{host}/{i}.jpg", f"images/{host}-{i}.jpg") for i in range(n)]


def scheduler(todo: list[Item], clock: Clock, **kw) -> Scheduler:
    kw = {"workers": 4, "backoff": 1.0, "retry_after_max": 60.0, "give_up_after": 3, **kw}
    return Scheduler(todo, host_of, clock=clock, **kw)


def ready_now(s: Scheduler) -> tuple | None:
    """The next job if one may start now (never blocks: the scheduler would wait otherwise)."""
    with s.cond:
        picked = s._pick(s.clock())
    return (picked[0].name, picked[1]) if isinstance(picked, tuple) else None


def test_a_slow_host_beside_a_fast_one_gets_a_fair_share_of_the_workers():
    clock = Clock()
    s = scheduler(items("slow", 10) + items("fast", 10), clock, workers=4)
    started = [ready_now(s)[0] for _ in range(4)]  # four workers take a job each
    assert sorted(started) == ["fast", "fast", "slow", "slow"]  # the fewest in flight goes first
    for _ in range(3):  # the fast host's answers come back and it takes the freed workers, the slow one keeps 2
        s.succeeded("fast", clock.now)
        assert ready_now(s)[0] == "fast"
    assert s.hosts["slow"].inflight == 2 and s.hosts["fast"].inflight == 2


def test_one_host_gets_every_worker_and_a_fixed_cap_spaces_request_starts():
    clock = Clock()
    s = scheduler(items("a", 10), clock, workers=4)
    assert [ready_now(s) is not None for _ in range(5)] == [True] * 4 + [False]  # at most `workers` in flight
    clock = Clock()
    s = scheduler(items("a", 10) + items("b", 10), clock, workers=8, cap=4.0)
    assert sorted(ready_now(s)[0] for _ in range(2)) == ["a", "b"]  # another host does not wait for a's slot
    assert ready_now(s) is None
    clock.now += 0.25
    assert sorted(ready_now(s)[0] for _ in range(2)) == ["a", "b"] and ready_now(s) is None


def test_a_throttle_round_pauses_the_host_for_retry_after_and_cuts_the_rate_once():
    clock = Clock()
    s = scheduler(items("a", 40), clock, workers=4)
    for _ in range(20):  # 20 answered within the last second
        s.answered(ready_now(s)[0])
        s.succeeded("a", clock.now)
        clock.now += 0.01
    jobs = [ready_now(s) for _ in range(3)]
    started = clock.now
    s.throttled("a", jobs[0][1], started, retry_after=3.0)
    host = s.hosts["a"]
    assert host.rate == pytest.approx(DECREASE * 20) and host.paused_until == pytest.approx(clock.now + 3.0)
    s.throttled("a", jobs[1][1], started, retry_after=3.0)  # in flight before the cut: no second cut
    assert host.rate == pytest.approx(DECREASE * 20) and host.rounds == 1
    clock.now += 2.9
    assert ready_now(s) is None  # still paused
    clock.now += 0.2
    job = ready_now(s)
    assert job is not None and job[1] is jobs[0][1]  # the throttled item goes first when the pause ends
    s.succeeded("a", clock.now)
    clock.now += 10.0
    s.succeeded("a", clock.now)
    pause_end = started + 3.0
    assert host.rate == pytest.approx(DECREASE * 20 * (1 + RECOVERY) ** (clock.now - pause_end), rel=1e-6)  # 1 %/s
    assert host.rounds == 0 and host.ceiling == 20
    before = host.rate
    assert 0.97 * 20 <= before <= 1.05 * 20
    clock.now += 100.0  # near the last allowance: 0.1 %/s
    s.succeeded("a", clock.now)
    assert host.rate == pytest.approx(before * 1.001 ** 100, rel=1e-6) and host.rate > 1.05 * 20
    before = host.rate
    clock.now += 10.0  # past 1.05x without a 429: the host allows more, probed at 1 %/s again
    s.succeeded("a", clock.now)
    assert host.rate == pytest.approx(before * 1.01 ** 10, rel=1e-6)


def test_retry_after_is_capped_and_without_it_the_pause_doubles_per_round():
    clock = Clock()
    s = scheduler(items("a", 10), clock, retry_after_max=5.0, give_up_after=10)
    host = s.hosts["a"]
    job = ready_now(s)
    s.throttled("a", job[1], clock.now, retry_after=3600.0)
    assert host.paused_until == pytest.approx(clock.now + 5.0)
    pauses = []
    for _ in range(3):
        clock.now = max(host.paused_until, host.next_start)
        job = ready_now(s)
        clock.now += 0.001
        s.throttled("a", job[1], clock.now, retry_after=None)
        pauses.append(round(host.paused_until - clock.now, 6))
    assert pauses == [2.0, 4.0, 5.0]  # backoff 1 s doubling per round (rounds 2, 3, 4), capped at 5


def test_a_host_that_only_throttles_is_given_up_and_its_items_handed_back():
    clock = Clock()
    s = scheduler(items("bad", 6) + items("good", 2), clock, workers=2, give_up_after=3)
    for _ in range(3):
        job = ready_now(s)
        while job[0] != "bad":
            s.succeeded(job[0], clock.now)
            job = ready_now(s)
        clock.now += 0.001
        s.throttled("bad", job[1], clock.now, retry_after=0.0)
        clock.now = max(s.hosts["bad"].paused_until, s.hosts["bad"].next_start)
    assert s.hosts["bad"].given_up and s.hosts["bad"].rounds == 3
    assert sorted(i.url for h, i in s.given_up) == sorted(i.url for i in items("bad", 6))  # every item, none twice
    while (job := ready_now(s)) is not None:  # the other host goes on
        assert job[0] == "good"
        s.succeeded("good", clock.now)
    assert s.outstanding == sum(h.inflight for h in s.hosts.values())


def test_retry_after_parsing():
    assert parse_retry_after("3") == 3.0 and parse_retry_after(" 0 ") == 0.0 and parse_retry_after(None) is None
    assert parse_retry_after("soon") is None and parse_retry_after("-5") == 0.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # a date in the past: at once
    assert math.isclose(parse_retry_after("Fri, 31 Dec 2100 23:59:59 GMT") / 86400 / 365, 74, abs_tol=1)
