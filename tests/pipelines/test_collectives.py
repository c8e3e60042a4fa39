"""One decision for every process (pipelines.collectives) and the file meeting of ranks (pipelines.rankfiles), in one
process: the helpers are the identity there; a lost peer is recognised and reported in one line."""
from __future__ import annotations

import json
import time

import pytest

from pipelines import rankfiles
from pipelines.collectives import (PeerLost, all_gather, alone, broadcast, gather_to_main, is_peer_lost, main_decides,
                                   peer_guard, peer_line, sharing)

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
