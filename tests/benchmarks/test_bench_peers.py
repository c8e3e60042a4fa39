"""benchmarks/cases/peers.py: every case runs both sides on tiny data and their scores agree (a wrong mapping to
pytorch-ood's arguments would make the ratio meaningless); no timing is asserted."""
import json

import pytest
from helpers.pytorch_ood import pytorch_ood_detector

from benchmarks import detectors as bench
from benchmarks.cases import peers
from benchmarks.cases.tools import cpu_model

pytestmark = pytest.mark.slow  # runs pytorch-ood and ours several times (about 15 s)


@pytest.fixture(scope="module")
def rows():
    pytorch_ood_detector()  # skips cleanly without pytorch-ood
    return peers.compare(sorted(peers.CASES), peers.make(300, 64, 8, seed=0), repeats=2)


def test_every_case_scores_what_pytorch_ood_scores(rows):
    assert [r["detector"] for r in rows] == sorted(peers.CASES)
    for r in rows:
        assert r["max_rel_diff"] < 1e-4, r["detector"]
        assert len(r["repeat_ratios"]) == 2 and r["ratio"] > 0


def test_peers_only_keeps_the_json_s_other_sections(tmp_path):
    pytorch_ood_detector()
    out = tmp_path / "detectors.json"
    out.write_text(json.dumps({"detectors": [{"detector": "knn"}]}))
    bench.main(["--peers-only", "--peers", "entropy", "--peer-size", "200:16:4", "--peer-repeats", "1",
                "--out", str(out)])
    written = json.loads(out.read_text())
    assert written["detectors"] == [{"detector": "knn"}]
    assert [r["detector"] for r in written["peers"]["rows"]] == ["entropy"]


def test_peers_only_replaces_the_rows_it_reruns_and_keeps_the_others(tmp_path):
    pytorch_ood_detector()
    out = tmp_path / "detectors.json"
    sizes = {"rows": 200, "dim": 16, "classes": 4}
    out.write_text(json.dumps({"peers": {"sizes": sizes, "repeats": 5, "load_avg_before": [9, 9, 9],
                                         "rows": [{"detector": "lts", "ratio": 1.1}, {"detector": "entropy"}]}}))
    bench.main(["--peers-only", "--peers", "entropy", "vra", "--peer-size", "200:16:4", "--peer-repeats", "1",
                "--out", str(out)])
    rows = json.loads(out.read_text())["peers"]["rows"]
    assert [r["detector"] for r in rows] == ["lts", "entropy", "vra"]
    assert rows[0]["ratio"] == 1.1 and rows[0]["run"] == {"repeats": 5, "load_avg_before": [9, 9, 9]}
    assert rows[1]["run"]["repeats"] == 1 and "ours_s" in rows[1]
    assert rows[1]["run"]["cpu"] == cpu_model() and rows[1]["run"]["cpus"] >= 1  # which machine measured it
    out.write_text(json.dumps({"peers": {"sizes": {**sizes, "dim": 32}, "rows": [{"detector": "lts"}]}}))
    bench.main(["--peers-only", "--peers", "vra", "--peer-size", "200:16:4", "--peer-repeats", "1", "--out", str(out)])
    assert [r["detector"] for r in json.loads(out.read_text())["peers"]["rows"]] == ["vra"]  # other sizes: replaced


def test_fast_detectors_loop_until_a_run_lasts_the_minimum():
    assert peers.loops_per_run(0.5) == 1
    assert peers.loops_per_run(0.004) == 25  # WEBO's 4 ms: 25 calls make a 0.1 s run
    assert peers.loops_per_run(0.0) == peers.MAX_LOOPS


def test_every_row_says_how_many_calls_each_timed_run_made(rows):
    assert all(1 <= r["loops_per_run"] <= peers.MAX_LOOPS for r in rows)


@pytest.mark.parametrize("again_s, warm_calls", [(10.0, 2), (0.0, 1)])
def test_a_fast_side_is_warmed_twice_and_its_second_call_sets_the_loops(again_s, warm_calls, monkeypatch):
    pytorch_ood_detector()
    calls = {"ours": 0, "theirs": 0}
    ours, theirs = peers.ours, peers.CASES["webo"]

    def count_ours(name, data):
        calls["ours"] += 1
        return ours(name, data)

    def count_theirs(pood, data):
        calls["theirs"] += 1
        return theirs(pood, data)

    monkeypatch.setattr(peers, "ours", count_ours)
    monkeypatch.setitem(peers.CASES, "webo", count_theirs)
    monkeypatch.setattr(peers, "WARM_AGAIN_S", again_s)
    monkeypatch.setattr(peers, "PAUSE_S", 0.0)
    monkeypatch.setattr(peers, "MAX_LOOPS", 3)
    [row] = peers.compare(["webo"], peers.make(50, 8, 4, seed=0), repeats=2)
    timed = 2 * row["loops_per_run"]
    assert calls == {"ours": warm_calls + timed, "theirs": warm_calls + timed}
