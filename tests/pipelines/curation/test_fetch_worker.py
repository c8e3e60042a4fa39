"""A fetch worker credits each answer to the host of the item it fetched (the per-host allowance the scheduler
measures), whenever the `answered` callback runs: it is bound to the job's host, not to the worker's loop variable."""
from __future__ import annotations

from collections import Counter

from pipelines.curation.fetch import FetchConfig, Fetcher
from pipelines.curation.fetch_client import host_of
from pipelines.curation.fetch_gate import Item, Scheduler


class Bar:
    def update(self, n: int) -> None:
        pass


def test_answered_callbacks_credit_the_host_of_their_own_item_even_when_called_late(tmp_path):
    todo = [Item(f"http://{host}/{i}.jpg", f"images/{host}-{i}.jpg") for host in ("a.org", "b.org", "c.org")
            for i in range(2)]
    scheduler = Scheduler(todo, host_of, workers=1)
    credited: list[str] = []
    scheduler.answered = credited.append
    fetcher = Fetcher(FetchConfig(occurrences="unused", out=str(tmp_path)))
    kept: list[tuple[str, object]] = []
    fetcher._fetch = lambda item, answered: kept.append((host_of(item.url), answered))

    fetcher._work(scheduler, Bar())

    assert fetcher.error is None and Counter(h for h, _ in kept) == {"a.org": 2, "b.org": 2, "c.org": 2}
    for _, answered in kept:  # after the worker has taken every other job
        answered()
    assert credited == [host for host, _ in kept]
