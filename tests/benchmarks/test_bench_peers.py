"""benchmarks/cases/peers.py: every case runs both sides on tiny data and their scores agree (a wrong mapping to
pytorch-ood's arguments would make the ratio meaningless); no timing is asserted."""
import json

import pytest

from benchmarks import detectors as bench
from benchmarks.cases import peers
from helpers.pytorch_ood import pytorch_ood_detector

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
