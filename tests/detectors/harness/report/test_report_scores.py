"""Report pieces checked against independent computations: bootstrap replicates against `detectors.metrics` on explicit
resamples, interval behaviour, family grouping of re-scored rows, robust plot limits and the Chromium page check."""
from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from detectors.harness import report
from detectors.metrics import evaluate

ROOT = Path(__file__).resolve().parents[4]


def test_resampled_metrics_match_explicit_resamples():
    rng = np.random.default_rng(1)
    id_scores = np.round(rng.normal(1.0, 1.0, 57), 1)  # rounded: many ties, within and across the two sides
    ood_scores = np.round(rng.normal(0.0, 1.0, 33), 1)
    id_idx = rng.integers(0, len(id_scores), size=(25, len(id_scores)))
    ood_idx = rng.integers(0, len(ood_scores), size=(25, len(ood_scores)))
    got = report.resampled_metrics(id_scores, ood_scores, id_idx, ood_idx)
    for b in range(25):
        expected = evaluate(id_scores[id_idx[b]], ood_scores[ood_idx[b]])
        assert got["auroc"][b] == pytest.approx(expected["auroc"], abs=1e-12)
        assert got["fpr95"][b] == pytest.approx(expected["fpr95"], abs=1e-12)


def test_bootstrap_interval_contains_the_point_and_shrinks_with_n():
    rng = np.random.default_rng(2)
    widths = []
    for n in (40, 400, 4000):
        id_scores, ood_scores = rng.normal(1.0, 1.0, n), rng.normal(0.0, 1.0, n)
        point = evaluate(id_scores, ood_scores)
        interval = report.bootstrap_interval(id_scores, ood_scores, 400, np.random.default_rng(0))
        for metric in ("auroc", "fpr95"):
            lo, hi = interval[metric]
            assert lo <= point[metric] <= hi
        widths.append(interval["auroc"][1] - interval["auroc"][0])
    assert widths[0] > 2 * widths[1] > 4 * widths[2]
    # the AUROC's standard error at n=4000 (binormal, d=1, AUROC 0.76), by the delta method
    # sqrt((Var Phi(X) + Var Phi(1 - Y)) / n) with X ~ N(1, 1), Y ~ N(0, 1), is 0.00528: a 95% width of 0.0207
    assert widths[2] == pytest.approx(0.0207, rel=0.15)


def _scores(methods: list[str]) -> pd.DataFrame:
    rng = np.random.default_rng(3)
    frames = []
    for m in methods:
        for role, ood_set, mean, n in (("id", "id", 1.0, 50), ("ood", "a", 0.0, 30), ("ood", "b", 0.5, 20)):
            frames.append(pd.DataFrame({"method": m, "family": "posthoc", "role": role, "ood_set": ood_set,
                                        "group": "x", "index": np.arange(n), "score": rng.normal(mean, 1.0, n)}))
    return pd.concat(frames, ignore_index=True)


def test_bootstrap_table_is_seeded_per_method_and_set():
    scores = _scores(["p", "q"])
    both = report.bootstrap_table(scores, 200, seed=7).set_index(["method", "ood_set"])
    alone = report.bootstrap_table(scores[scores["method"] == "q"], 200, seed=7).set_index(["method", "ood_set"])
    pd.testing.assert_frame_equal(both.loc[["q"]], alone)  # q's intervals do not depend on p being reported
    other = report.bootstrap_table(scores, 200, seed=8).set_index(["method", "ood_set"])
    assert not np.allclose(other["auroc_lo"], both["auroc_lo"])
    with pytest.raises(ValueError, match="replicates"):
        report.bootstrap_table(scores, 0)


def _family_rows() -> pd.DataFrame:
    """Two real post-hoc methods (AUROC 90, 94) and a trained model with its own score and two re-scoring rules,
    labelled `posthoc` as older runners did (AUROC 60, 62, 64)."""
    values = {("msp", "posthoc", "", ""): 90, ("knn", "posthoc", "", ""): 94, ("oe", "training", "oe", ""): 60,
              ("oe+msp", "posthoc", "oe", "msp"): 62, ("oe+knn", "posthoc", "oe", "knn"): 64}
    return pd.DataFrame([{"method": m, "family": f, "base": b, "rule": r, "ood_set": "s", "group": "hard", "auroc": a,
                          "fpr95": 100 - a, "aupr_in": 50.0, "aupr_out": 50.0, "n_id": 5, "n_ood": 5, "seconds": 1.0}
                         for (m, f, b, r), a in values.items()])


def test_rescored_rows_average_in_the_training_family(tmp_path):
    results, _ = report.read_results(_family_rows())
    families = report.family_table(results).set_index(["family", "group"])
    assert families.loc[("posthoc", "all"), "auroc"] == pytest.approx(92.0)  # the two real post-hoc methods only
    assert families.loc[("training", "all"), "auroc"] == pytest.approx(62.0)  # oe and its two rules
    wrong = _family_rows().groupby("family")["auroc"].mean()  # grouping by the stale labels
    assert wrong["posthoc"] == pytest.approx(77.5) and wrong["training"] == pytest.approx(60.0)
    report.write_report(_family_rows(), tmp_path)
    table4 = pd.read_csv(tmp_path / "sb_table4.csv").set_index("family")
    assert table4.loc["posthoc", "all/auroc"] == pytest.approx(92.0)
    assert list(pd.read_csv(tmp_path / "table3.csv")["family"]) == ["posthoc", "posthoc", *["training"] * 3]


def test_robust_limits_ignore_a_heavy_tail():
    rng = np.random.default_rng(4)
    values = np.r_[rng.normal(0.0, 1.0, 997), np.full(3, -1e6)]  # 0.3% of GRAM-like huge deviations
    lo, hi = report.robust_limits(values)
    assert -4 < lo < -2 and 2 < hi < 4  # the whole plot would otherwise span a million
    assert report.robust_limits(np.ones(5))[0] < 1 < report.robust_limits(np.ones(5))[1]


def _check_script():
    return importlib.import_module("scripts.check_report_html")


@pytest.mark.skipif(_check_script().find_chromium() is None,
                    reason="Chromium (Debian package `chromium`) not installed")
@pytest.mark.slow
def test_index_html_in_headless_chromium(tmp_path, capsys):
    report.write_report(_family_rows(), tmp_path / "report", scores=None)
    check = _check_script()
    index = tmp_path / "report" / "index.html"
    assert check.main([str(index), "--screenshot", str(tmp_path / "shot.png")]) == 0
    printed = capsys.readouterr().out
    assert "1 image(s), 0 broken" in printed and "ok:" in printed
    from PIL import Image

    with Image.open(tmp_path / "shot.png") as shot:
        assert shot.width == 1400 and shot.height > 500 and len(set(shot.convert("L").getdata())) > 10
    broken = tmp_path / "broken"
    shutil.copytree(tmp_path / "report", broken)
    (broken / "fpr95_by_method.png").write_bytes(b"not a png")
    assert check.main([str(broken / "index.html"), "--screenshot", str(tmp_path / "shot2.png")]) == 1
    printed = capsys.readouterr().out
    assert "not a readable PNG: fpr95_by_method.png" in printed
    assert "Chromium could not load image: fpr95_by_method.png" in printed
    (broken / "fpr95_by_method.png").unlink()
    assert "missing: fpr95_by_method.png" in check.check_files(broken / "index.html")


def test_density_axis_spreads_gram_like_scores():
    rng = np.random.default_rng(5)
    ids, ood = -np.abs(rng.normal(0, 3, 500)), -rng.uniform(500, 3000, 300)  # GRAM: -deviation, OOD far out
    rows = pd.DataFrame({"role": ["id"] * 500 + ["ood"] * 300, "score": np.r_[ids, ood]})
    axis = report.ScoreAxis.of(rows)
    edges = axis.edges(40)
    assert axis.scale > 0 and np.allclose(axis.inverse(axis.forward(edges)), edges)
    assert (np.histogram(ids, edges)[0] > 0).sum() >= 8  # a linear axis puts every ID score in one bin
    assert (np.histogram(ids, np.linspace(edges[0], edges[-1], 41))[0] > 0).sum() == 1
    msp = pd.DataFrame({"role": ["id"] * 500 + ["ood"] * 300, "score": np.r_[rng.beta(8, 1, 500), rng.beta(2, 2, 300)]})
    assert report.ScoreAxis.of(msp).scale == 0  # ordinary scores keep a linear axis


def test_tile_offsets_cover_the_page():
    check = _check_script()
    assert check.tile_offsets(34107, 8000) == [(0, 8000), (8000, 8000), (16000, 8000), (24000, 8000), (32000, 2107)]
    assert check.tile_offsets(500, 8000) == [(0, 500)]


@pytest.mark.skipif(_check_script().find_chromium() is None,
                    reason="Chromium (Debian package `chromium`) not installed")
@pytest.mark.slow
def test_a_tall_page_is_captured_whole_in_tiles(tmp_path, capsys):
    page = tmp_path / "index.html"
    page.write_text('<!DOCTYPE html><html><body style="margin:0"><table id="main-table"><tbody><tr><td '
                    'style="color:#fff">x</td></tr>'
                    '</tbody></table><div style="height:2280px;background:#fff"></div>'
                    '<div style="height:200px;background:#f00"></div></body></html>')
    check = _check_script()
    assert check.main([str(page), "--tile", "1000"]) == 0
    printed = capsys.readouterr().out
    assert "in 3 tile(s)" in printed
    from PIL import Image

    height = int(printed.split("page height ")[1].split(" px")[0])
    with Image.open(tmp_path / "index_screenshot_03.png") as last:  # the red block at the very bottom is captured
        assert last.height == height - 2000 and 500 <= last.height < 530
        red = np.asarray(last.convert("RGB"))[-190:-10, 10:100]
        assert (red[..., 0] > 200).all() and (red[..., 1] < 60).all()
    with Image.open(tmp_path / "index_screenshot_01.png") as first:
        assert first.height == 1000 and (np.asarray(first.convert("RGB"))[:900] > 240).all()
