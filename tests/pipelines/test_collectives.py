"""One decision for every process (pipelines.collectives) and the file meeting of ranks (pipelines.rankfiles), in one
process: the helpers are the identity there; a lost peer is recognised and reported in one line."""
from __future__ import annotations

import json
import time

import pytest

from pipelines import rankfiles
from pipelines.collectives import (
    PeerLost,
    all_gather,
    alone,
    broadcast,
    gather_to_main,
    is_peer_lost,
    main_decides,
    peer_guard,
    peer_line,
    sharing,
)

GLOO_CLOSED = "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.1.2.3]:40215"


def test_one_process_is_the_identity():
    calls = []
    assert main_decides(lambda: calls.append(1) or [3, 1]) == [3, 1]
    assert calls == [1]  # decided once
    assert broadcast({"a": 1}) == {"a": 1}
    assert all_gather(5) == [5]
    assert gather_to_main("x") == ["x"]
    assert sharing() == 1
    with alone():
        assert sharing() == 1


def test_a_lost_peer_is_told_from_the_work_s_own_errors():
    assert is_peer_lost(RuntimeError(GLOO_CLOSED))
    assert is_peer_lost(RuntimeError("Connection reset by peer"))
    assert not is_peer_lost(RuntimeError("CUDA out of memory"))
    assert not is_peer_lost(ValueError("Connection closed by peer"))  # only the collective's own error type


def test_the_line_names_the_peer_and_how_to_resume():
    line = peer_line(RuntimeError(GLOO_CLOSED), "unit mds")
    assert "10.1.2.3:40215" in line and "unit mds" in line and "rerun the same command" in line
    assert "\n" not in line
    with pytest.raises(PeerLost, match="10.1.2.3:40215"):
        with peer_guard("a gather"):
            raise RuntimeError(GLOO_CLOSED)
    with pytest.raises(KeyError):  # any other error passes unchanged
        with peer_guard("a gather"):
            raise KeyError("x")


def test_ranks_meet_through_marks(tmp_path):
    rankfiles.mark_done(tmp_path, 1, {"units": ["b"]})
    rankfiles.mark_done(tmp_path, 0, {"units": ["a"]})
    marks = rankfiles.wait_for_ranks(tmp_path, 2, poll_s=0.01)
    assert [m["units"] for m in marks] == [["a"], ["b"]]
    rankfiles.clear(tmp_path)
    assert not list(tmp_path.glob("process-*.json"))


def test_a_silent_rank_is_a_lost_peer_naming_it(tmp_path, monkeypatch):
    monkeypatch.setenv("OODFORGE_HOST", "node-b")
    rankfiles.mark_done(tmp_path, 0, {})
    with rankfiles.Heartbeat(tmp_path, 1, beat_s=60):  # one beat written at the start, then silence
        pass
    beat = tmp_path / "process-001.alive.json"
    record = json.loads(beat.read_text())
    assert record["host"] == "node-b"
    beat.write_text(json.dumps({**record, "time": time.time() - 100}))
    with pytest.raises(PeerLost, match=r"process 1 on node-b \(pid \d+\) stopped before finishing its units"):
        rankfiles.wait_for_ranks(tmp_path, 2, what="its units", poll_s=0.01, stale_s=50)


def test_a_beating_rank_is_waited_for_until_the_time_out(tmp_path):
    rankfiles.mark_done(tmp_path, 0, {})
    with rankfiles.Heartbeat(tmp_path, 1, beat_s=0.01):
        with pytest.raises(TimeoutError, match="1 of 2 processes finished"):
            rankfiles.wait_for_ranks(tmp_path, 2, poll_s=0.01, stale_s=30, timeout_s=0.2)


def test_a_rank_never_seen_is_lost_after_the_stale_limit(tmp_path):
    with pytest.raises(PeerLost, match="process 0 \\(no heartbeat seen\\)"):
        rankfiles.wait_for_ranks(tmp_path, 1, poll_s=0.01, stale_s=0.1)


FAIL_TOGETHER = """
import json, sys
import torch.distributed as dist
from pipelines.collectives import PeerFailed, all_gather, broadcast, fail_together, gather_to_main, world

dist.init_process_group("gloo")
rank, _ = world()
seen = []
for helper in (all_gather, broadcast, gather_to_main):
    if rank == 1:
        fail_together("ValueError: rank 1's own part", "a unit")  # instead of the collective rank 0 is in
        seen.append(None)
    else:
        try:
            helper("mine", "a unit")
            seen.append("no error")
        except PeerFailed as err:
            seen.append([err.rank, err.text, str(err)])
seen.append(all_gather(rank, "after"))  # the ranks still meet in step
with open(sys.argv[1] + f"/rank{rank}.json", "w") as fh:
    json.dump(seen, fh)
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_a_rank_failing_is_met_at_the_collective_the_others_are_in(tmp_path):
    """Rank 1 says it failed (`fail_together`) while rank 0 is in an all-gather, a broadcast or a gather: rank 0
    raises `PeerFailed` naming rank 1 and its error there (no wait for a time-out), and the ranks stay in step."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "fail.py"
    script.write_text(FAIL_TOGETHER)
    root = Path(__file__).parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    done = subprocess.run([str(Path(sys.executable).with_name("torchrun")), "--standalone", "--nproc_per_node", "2",
                           str(script), str(tmp_path)], capture_output=True, text=True, timeout=120, cwd=root, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    said = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    met = [1, "ValueError: rank 1's own part", "rank 1: ValueError: rank 1's own part"]
    assert said[0] == [met, met, met, [0, 1]]
    assert said[1] == [None, None, None, [0, 1]]


def test_shares_cover_every_item_once_in_rank_order_and_a_rank_past_the_items_gets_none():
    from pipelines.collectives import share

    for processes in (1, 2, 3, 5):
        for n in range(0, 12):
            shares = [share(n, rank, processes) for rank in range(processes)]
            assert [i for part in shares for i in part] == list(range(n))  # each item once, contiguous, in order
            assert max(map(len, shares)) - min(map(len, shares)) <= 1  # as even as accelerate's
            assert all(len(part) == 0 for part in shares[n:])  # accelerate 1.7 would repeat item n - 1 there
    assert share(7) == range(7)  # outside a process group: everything
