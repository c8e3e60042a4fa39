"""Each report figure opened on its Figure object before saving: the expected number of axes and artists, series that
differ without colour, FPR within [0, 100], no empty panel, no overlapping tick labels; then saved once (PNG and PDF),
and made in worker processes. KDE and thumbnails against direct computations."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from detectors import report
from detectors.report import figures, plots
from detectors.report.tables import Layout, method_summary, per_set_table, read_results


def _check(figure, n_axes: int) -> None:
    assert len(figure.axes) == n_axes
    assert figures.overlapping_ticks(figure) == []
    for axes in figure.axes:  # no empty panel
        assert axes.lines or axes.images or axes.patches or axes.collections, axes.get_title()


def _results(n_methods: int = 18) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    families = ["posthoc"] * 13 + ["clip"] * 3 + ["generative"] * 2
    sets = {"sketch_rubbing": "hard", "container": "hard", "texture": "easy", "species": "easy"}
    methods = list(report.METHOD_LABELS)[:n_methods]
    return pd.DataFrame([{"method": m, "family": families[i % 18], "ood_set": s, "group": g,
                          "auroc": rng.uniform(40, 99), "fpr95": rng.uniform(5, 100), "aupr_in": 50.0,
                          "aupr_out": 50.0, "n_id": 10, "n_ood": 10, "seconds": 1.0}
                         for i, m in enumerate(methods) for s, g in sets.items()])


def test_styles_never_repeat_and_differ_without_colour():
    many = figures.styles(60)
    assert len({(s.color, s.linestyle) for s in many}) == 60
    few = figures.styles(18)
    assert len({s.color for s in few}) == 18 and len({s.marker for s in few}) == 12


def test_roc_with_18_methods_has_18_distinct_styles(tmp_path):
    rng = np.random.default_rng(1)
    curves = [(m, rng.normal(1, 1, 300), rng.normal(0, 1, 200), 70.0 + i) for i, m in enumerate(list(report.METHOD_LABELS)[:18])]
    figure = plots.roc_figure(curves, "container")
    _check(figure, 1)
    lines = figure.axes[0].lines[:18]
    assert len({line.get_color() for line in lines}) == 18
    assert len({(line.get_marker(), line.get_linestyle()) for line in lines}) >= 12
    assert "KL-Matching (" in " ".join(t.get_text() for t in figure.axes[0].get_legend().get_texts())
    path = figures.save_figure(figure, tmp_path / "roc.png", ("png", "pdf"))
    assert path.is_file() and (tmp_path / "roc.pdf").read_bytes()[:4] == b"%PDF"


def test_roc_points_are_thinned_but_keep_the_ends():
    rng = np.random.default_rng(2)
    fpr, tpr = plots.roc_points(rng.normal(1, 1, 20000), rng.normal(0, 1, 20000))
    assert len(fpr) <= plots.ROC_POINTS and (fpr[0], tpr[0]) == (0.0, 0.0) and (fpr[-1], tpr[-1]) == (1.0, 1.0)
    assert np.all(np.diff(fpr) >= 0) and np.all(np.diff(tpr) >= 0)


def test_figure5_marks_groups_by_marker_and_line_style():
    results, _ = read_results(_results())
    figure = plots.fpr95_figure(method_summary(results), Layout.of(results))
    _check(figure, 1)
    axes = figure.axes[0]
    points = [line for line in axes.lines if line.get_linestyle() == "None"]
    means = [line for line in axes.lines if line.get_linestyle() != "None" and len(line.get_xdata()) == 2
             and line.get_xdata()[0] == 0]
    assert len(points) == 3 and len({p.get_marker() for p in points}) == 3  # all, hard, easy
    assert len({m.get_linestyle() for m in means}) == 3
    assert all(0 <= y <= 100 for p in points for y in p.get_ydata())
    labels = [t.get_text() for t in axes.get_xticklabels()]
    assert "KL-Matching" in labels or "ViM" in labels


def test_heatmap_and_family_labels():
    results, _ = read_results(_results())
    layout = Layout.of(results)
    figure = plots.heatmap_figure(per_set_table(results, averages=False), layout, "auroc")
    _check(figure, 2)  # the map and its colour bar (the group names on top are the map's secondary axis)
    assert any(t.get_text() == "VLM-based" for t in figure.axes[0].texts)


def test_density_panels_and_no_empty_panel():
    rng = np.random.default_rng(3)
    panels = [(f"set{i}", rng.normal(1, 1, 100), rng.normal(0, 1, 80), ("ID test", "OOD"), 75.0) for i in range(4)]
    rows = pd.DataFrame({"role": ["id"] * 100 + ["ood"] * 80, "score": np.r_[panels[0][1], panels[0][2]]})
    figure = plots.density_figure("msp", panels, plots.ScoreAxis.of(rows))
    _check(figure, 4)  # 2 x 3 grid: the two spare panels are removed
    for axes in figure.axes:
        assert len(axes.patches) == 2
        assert {p.get_linestyle() for p in axes.patches} == {"-", "--"}
        heights = axes.patches[0].get_data().values
        assert heights.sum() <= 1.0 + 1e-12


def test_kde_matches_scipy():
    from scipy.stats import gaussian_kde

    rng = np.random.default_rng(4)
    values = rng.normal(0, 1, 3000)
    grid = np.linspace(-4, 4, 801)
    expected = gaussian_kde(values, bw_method="scott")(grid)
    assert np.max(np.abs(plots.kde(values, grid) - expected)) < 0.01
    assert np.trapezoid(plots.kde(values, grid), grid) == pytest.approx(1.0, abs=0.01)


def test_figure6_and_figure7():
    rng = np.random.default_rng(5)
    panels = [(m, {"ID": rng.normal(1, 1, 200), "hard OOD": rng.normal(0.5, 1, 150), "easy OOD": rng.normal(-1, 1, 150)})
              for m in ("vim", "locoop")]
    figure = plots.best_densities_figure(panels)
    _check(figure, 2)
    assert all(len(a.lines) == 3 and len({line.get_linestyle() for line in a.lines}) == 3 for a in figure.axes)
    frame = pd.DataFrame([{"method": m, "shots": k, "seed": s, "ood_set": o, "group": g, "id_acc": 40 + k,
                           "auroc": 90 + 4 * s, "fpr95": 99.0 - s * 0.5, "n_id": 5}
                          for m in ("idlike", "locoop") for k in (1, 2, 4, 8, 16) for s in (0, 2)
                          for o, g in (("a", "hard"), ("b", "easy"))])
    figure = plots.fewshot_figure(frame)
    _check(figure, 5)  # ID acc., AUROC hard / easy, FPR hard / easy: no empty column
    for axes in figure.axes:
        for container in axes.containers:
            segments = container.lines[2][0].get_segments()
            assert all(0 <= y <= 100 for seg in segments for _, y in seg)  # error bars within [0, 100]
        xs = [tuple(container.lines[0].get_xdata()) for container in axes.containers]
        assert len(xs) == 2 and len(set(xs)) == 2  # nudged apart: no line hidden under another


def test_figure1_boxes_per_region():
    rng = np.random.default_rng(6)
    frame = pd.DataFrame([{"region": r, "ood_set": s, "method": f"m{i}", "auroc": rng.uniform(50, 100)}
                          for r in ("ne-america", "w-europe", "c-america") for s in ("local", "non_local", "non_moth")
                          for i in range(6)])
    figure = plots.auroc_distribution_figure(frame)
    _check(figure, 1)
    points = [line for line in figure.axes[0].lines if line.get_linestyle() == "None" and len(line.get_xdata()) == 6]
    assert len(points) == 9 and len({p.get_marker() for p in points}) == 3


def test_sheets_decode_once_at_reduced_size(tmp_path):
    big = tmp_path / "big.jpg"
    Image.new("RGB", (2048, 1536), (200, 30, 30)).save(big, quality=80)
    pixels = plots.thumbnail(big)
    assert pixels.shape == (96, 128, 3) and abs(int(pixels[..., 0].mean()) - 200) < 6
    assert plots.thumbnail(tmp_path / "missing.jpg") is None
    rows = pd.DataFrame({"method": ["msp", "msp", "vim"], "rank": [1, 2, 1], "score": [0.9, 0.8, 0.7],
                         "id_share": [99.0, 90.0, 80.0], "species": ["Actias luna", "Catocala", None],
                         "file_name": ["a/luna_1.jpg", "b/c.jpg", "d.jpg"], "path": [str(big), str(big), "nope.jpg"]})
    figure = plots.id_looking_sheet(rows, "local")
    _check(figure, 1)
    texts = " ".join(t.get_text() for t in figure.axes[0].texts)
    assert "Actias luna" in texts and "luna_1.jpg" in texts and "unreadable" in texts
    assert [t.get_text() for t in figure.axes[0].get_yticklabels()] == ["MSP", "ViM"]
    field = pd.DataFrame({"species": ["a", "a", "b"], "path": [str(big)] * 3, "file_name": ["1.jpg", "2.jpg", "3.jpg"],
                          "score": [0.1, 0.9, 0.2], "flagged": [True, False, True]})
    figure = plots.field_sheet(field, "bci")
    texts = [t.get_text() for t in figure.axes[0].texts]
    assert sum("flagged" in t for t in texts) == 2 and sum("missed" in t for t in texts) == 1  # not by colour alone


def test_render_in_worker_processes(tmp_path):
    results, _ = read_results(_results(6))
    layout = Layout.of(results)
    jobs = [figures.Job(plots.fpr95_figure, tmp_path / "a.png", {"summary": method_summary(results), "layout": layout}),
            figures.Job(plots.heatmap_figure, tmp_path / "b.png",
                        {"table": per_set_table(results, averages=False), "layout": layout, "metric": "fpr95"}),
            figures.Job(plots.heatmap_figure, tmp_path / "c.png", {"table": None, "layout": layout, "metric": "x"})]
    lines = []
    made = figures.render(jobs, ("png",), workers=2, log=lines.append)
    assert [p.name for p in made] == ["a.png", "b.png"] and len(lines) == 1 and "c.png failed" in lines[0]
    with Image.open(tmp_path / "a.png") as image:
        assert image.info["dpi"][0] == pytest.approx(figures.DPI, abs=1)
