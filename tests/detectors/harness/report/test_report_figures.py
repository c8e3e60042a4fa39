"""Each report figure opened on its Figure object before saving (the expected axes, series that differ without colour,
the papers' colours, nothing hidden, robust axes for heavy tails, display names, no overlapping ticks, finite data)
and read back as a PNG (decodes, not blank); made in worker processes and on one reused canvas. KDE and thumbnails
against direct computations."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_hex
from PIL import Image

from detectors.harness import report
from detectors.harness.report import figures, plots
from detectors.harness.report.aux_study import NUDGE, study_figure
from detectors.harness.report.names import SHIFTED_BRONZES
from detectors.harness.report.shiftedbronzes import layout_of
from detectors.harness.report.tables import Layout, method_summary, per_set_table, read_results
from tests.detectors.harness.report.report_checks import assert_usable_figure, assert_usable_png

PERCENT = (-5, 105)


def _results(n_methods: int = 18) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    families = ["posthoc"] * 13 + ["clip"] * 3 + ["generative"] * 2
    sets = {"sketch_rubbing": "hard", "container": "hard", "texture": "easy", "species": "easy"}
    methods = list(report.METHOD_LABELS)[:n_methods]
    return pd.DataFrame([{"method": m, "family": families[i % 18], "ood_set": s, "group": g,
                          "auroc": rng.uniform(40, 99), "fpr95": rng.uniform(5, 100), "aupr_in": 50.0,
                          "aupr_out": 50.0, "n_id": 10, "n_ood": 10, "seconds": 1.0}
                         for i, m in enumerate(methods) for s, g in sets.items()])


def _save(figure, path) -> np.ndarray:
    return assert_usable_png(figures.save_figure(figure, path))


def test_styles_never_repeat_and_differ_without_colour():
    many = figures.styles(60)
    assert len({(s.color, s.linestyle) for s in many}) == 60
    few = figures.styles(18)
    assert len({s.color for s in few}) == 18 and len({s.marker for s in few}) == 12


def test_roc_panels_share_one_legend_with_display_names(tmp_path):
    rng = np.random.default_rng(1)
    methods = list(SHIFTED_BRONZES.order)  # the paper's 18 methods (the registry's first 18 change as methods join)
    panels = [(s, [(m, rng.normal(1, 1, 300), rng.normal(0, 1, 200), 70.0 + i) for i, m in enumerate(methods)])
              for s in ("container", "texture")]
    figure = plots.roc_figure(panels, paper=SHIFTED_BRONZES)
    assert_usable_figure(figure, 2, y_range=(0, 1.05))
    lines = figure.axes[0].lines[:18]
    assert len({line.get_color() for line in lines}) == 18
    assert len({(line.get_marker(), line.get_linestyle()) for line in lines}) >= 12
    legend = " ".join(t.get_text() for t in figure.legends[0].get_texts())
    assert "KL-Matching (74.0, 74.0)" in legend  # each method's AUROC per panel, once
    assert [a.get_title() for a in figure.axes] == ["container", "Texture"]  # the sets' display names
    _save(figure, tmp_path / "roc.png")
    path = figures.save_figure(plots.roc_figure(panels), tmp_path / "roc2.png", ("png", "pdf"))
    assert path.is_file() and (tmp_path / "roc2.pdf").read_bytes()[:4] == b"%PDF"


def test_roc_points_are_thinned_but_keep_the_ends():
    rng = np.random.default_rng(2)
    fpr, tpr = plots.roc_points(rng.normal(1, 1, 20000), rng.normal(0, 1, 20000))
    assert len(fpr) <= plots.ROC_POINTS and (fpr[0], tpr[0]) == (0.0, 0.0) and (fpr[-1], tpr[-1]) == (1.0, 1.0)
    assert np.all(np.diff(fpr) >= 0) and np.all(np.diff(tpr) >= 0)


def test_figure5_paper_colours_offsets_and_names(tmp_path):
    """ShiftedBronzes Figure 5: hard green, easy red (the paper's), all black; each method's three markers side by
    side (a point's x is its method's plus a fixed offset), so that equal values do not hide each other."""
    results, _ = read_results(_results())
    layout = layout_of(results)
    figure = plots.fpr95_figure(method_summary(results, layout), layout, SHIFTED_BRONZES)
    assert_usable_figure(figure, 1, PERCENT)
    axes = figure.axes[0]
    points = {line.get_label(): line for line in axes.lines if line.get_linestyle() == "None"}
    assert {to_hex(points["Hard sets"].get_color()), to_hex(points["Easy sets"].get_color())} == {"#2ca02c", "#d62728"}
    assert to_hex(points["Hard sets"].get_color()) == "#2ca02c" and to_hex(points["All sets"].get_color()) == "#000000"
    xs = [np.asarray(points[k].get_xdata()) for k in ("All sets", "Hard sets", "Easy sets")]
    assert np.allclose(xs[1] - xs[0], plots.GROUP_OFFSET) and np.allclose(xs[2] - xs[1], plots.GROUP_OFFSET)
    assert all(0 <= y <= 100 for p in points.values() for y in p.get_ydata())
    labels = [t.get_text() for t in axes.get_xticklabels()]
    assert labels[:4] == [SHIFTED_BRONZES.label(m) for m in layout.methods[:4]] and "KL-Matching" in labels
    assert "offset" in axes.get_title()
    _save(figure, tmp_path / "f5.png")


@pytest.mark.slow
def test_heatmaps_side_by_side_display_names_and_png(tmp_path):
    results, _ = read_results(_results())
    layout = layout_of(results)
    figure = plots.heatmap_figure(per_set_table(results, averages=False, layout=layout), layout, paper=SHIFTED_BRONZES)
    assert_usable_figure(figure, 2)  # two maps (the group names on top are their secondary axes), no colour bar
    maps = [a for a in figure.axes if a.images]
    assert [a.get_title() for a in maps] == ["AUROC (%)", "FPR@95 (%)"]
    assert any(t.get_text() == "VLM-based" for t in maps[1].texts) and not any(t.get_text() == "VLM-based"
                                                                               for t in maps[0].texts)
    assert [t.get_text() for t in maps[0].get_yticklabels()][:2] == ["DICE", "EBO"]
    assert not any(t.get_visible() for t in maps[1].get_yticklabels())
    assert "sketch & rubbing" in [t.get_text() for t in maps[0].get_xticklabels()]
    assert sum(t.get_text().endswith("†") for t in maps[0].texts) == int((results["auroc"] < 50).sum())
    pixels = _save(figure, tmp_path / "heatmaps.png")
    assert pixels.shape[1] > 600


def _gram_like(rng, n=300):
    ids, ood = -np.abs(rng.normal(0, 3, n)), -rng.uniform(500, 1e8, n // 2)  # GRAM: -deviation, OOD out to 1e8
    return ids, ood


def test_score_densities_one_figure_robust_axes(tmp_path):
    """A row per method, a column per set; a heavy-tailed method (GRAM-like) gets the log-distance axis, named."""
    rng = np.random.default_rng(3)
    rows = []
    for method in ("msp", "gram"):
        ids, ood = (rng.normal(1, 1, 300), rng.normal(0, 1, 200)) if method == "msp" else _gram_like(rng)
        frame = pd.DataFrame({"role": ["id"] * len(ids) + ["ood"] * len(ood), "score": np.r_[ids, ood]})
        panels = [(s, ids, ood, ("ID test", "OOD"), 75.0) for s in ("local", "non_target")]
        rows.append((method, panels, plots.ScoreAxis.of(frame)))
    figure = plots.densities_figure(rows, report.OPEN_INSECTS)
    assert_usable_figure(figure, 2)
    assert [a.get_title() for a in figure.axes] == ["local", "non-moth"]
    axes = [a for _, _, a in rows]
    ends = [f"[{plots._tick(a.lo, a.hi - a.lo)}, {plots._tick(a.hi, a.hi - a.lo)}]" for a in axes]
    # each row names its score axis: the scores at its 0.5 and 99.5 percentiles
    assert [t.get_text() for t in figure.axes[0].get_yticklabels()] == [f"MSP  {ends[0]}", f"Gram (log)  {ends[1]}"]
    assert axes[0].lo == pytest.approx(plots.robust_limits(np.r_[rows[0][1][0][1], rows[0][1][0][2]])[0])
    label = figure.get_supxlabel()
    assert "percentile" in label and "log distance" in label and "((" not in label
    outlines = figure.axes[0].collections  # ID and OOD outlines, one collection each
    assert len(outlines) == 2 and all(len(c.get_segments()) == 2 for c in outlines)
    assert all(np.isfinite(seg).all() and (0 <= seg[:, 0]).all() and (seg[:, 0] <= 1).all()
               for c in outlines for seg in c.get_segments())
    _save(figure, tmp_path / "densities.png")


def test_kde_matches_scipy():
    from scipy.stats import gaussian_kde

    rng = np.random.default_rng(4)
    values = rng.normal(0, 1, 3000)
    grid = np.linspace(-4, 4, 801)
    expected = gaussian_kde(values, bw_method="scott")(grid)
    assert np.max(np.abs(plots.kde(values, grid) - expected)) < 0.01
    assert np.trapezoid(plots.kde(values, grid), grid) == pytest.approx(1.0, abs=0.01)


def test_figure6_heavy_tail_is_readable(tmp_path):
    """GRAM-like scores (OOD out to 1e8): the axis spans the log distance from the ID median, named on the axis; the
    ID peak is inside the axes (not clipped) and spread over many grid points."""
    rng = np.random.default_rng(5)
    ids, ood = _gram_like(rng)
    gram = pd.DataFrame({"role": ["id"] * len(ids) + ["ood"] * len(ood), "score": np.r_[ids, ood]})
    axis = plots.ScoreAxis.of(gram)
    assert axis.scale > 0 and np.allclose(axis.inverse(axis.forward(axis.edges(10))), axis.edges(10))
    panels = [("Gram", {"ID": ids, "hard OOD": ood[:75], "easy OOD": ood[75:]}, axis),
              ("ViM", {"ID": rng.normal(1, 1, 200), "hard OOD": rng.normal(0, 1, 150)},
               plots.ScoreAxis.of(pd.DataFrame({"role": ["id"] * 200, "score": rng.normal(1, 1, 200)})))]
    figure = plots.best_densities_figure(panels)
    assert_usable_figure(figure, 2)
    left = figure.axes[0]
    assert "log distance from the ID median" in left.get_xlabel() and "percentiles" in left.get_xlabel()
    assert "log distance" not in figure.axes[1].get_xlabel()
    colours = {line.get_label().split(" (")[0]: to_hex(line.get_color()) for line in left.lines}
    assert colours == {"ID": "#000000", "hard OOD": plots.HARD, "easy OOD": plots.EASY}
    id_line = left.lines[0]
    peak = np.max(id_line.get_ydata())
    assert 0 < peak <= left.get_ylim()[1] and (id_line.get_ydata() > peak / 4).sum() > 20
    _save(figure, tmp_path / "f6.png")


def test_figure7_a_legend_on_every_panel(tmp_path):
    frame = pd.DataFrame([{"method": m, "shots": k, "seed": s, "ood_set": o, "group": g, "id_acc": 40 + k,
                           "auroc": 90 + 4 * s, "fpr95": 99.0 - s * 0.5, "n_id": 5}
                          for m in ("idlike", "locoop") for k in (1, 2, 4, 8, 16) for s in (0, 2)
                          for o, g in (("a", "hard"), ("b", "easy"))])
    figure = plots.fewshot_figure(frame, paper=SHIFTED_BRONZES)
    assert_usable_figure(figure, 5, PERCENT)  # ID acc., AUROC hard / easy, FPR hard / easy: no empty column
    for axes in figure.axes:
        assert [t.get_text() for t in axes.get_legend().get_texts()] == ["ID-like", "LoCoOp"]
        for container in axes.containers:
            segments = container.lines[2][0].get_segments()
            assert all(0 <= y <= 100 for seg in segments for _, y in seg)  # error bars within [0, 100]
        xs = [tuple(container.lines[0].get_xdata()) for container in axes.containers]
        assert len(xs) == 2 and len(set(xs)) == 2  # nudged apart: no line hidden under another
    assert figure.axes[1].get_title() == "AUROC (%), Hard"
    _save(figure, tmp_path / "f7.png")


def test_figure2c_panels_side_by_side(tmp_path):
    rng = np.random.default_rng(7)
    points = pd.DataFrame({"set": ["ID"] * 20 + ["transferred_bronze"] * 20 + ["sketch_rubbing"] * 20,
                           "x": rng.normal(size=60), "y": rng.normal(size=60)})
    figure = plots.feature_maps_figure([("ResNet-50 (classifier)", points), ("CLIP ViT-B/16", points)])
    assert_usable_figure(figure, 2)
    first, second = (a.get_position() for a in figure.axes)
    assert second.x0 > first.x1 and abs(second.y0 - first.y0) < 1e-9  # side by side
    assert [a.get_title() for a in figure.axes] == ["ResNet-50 (classifier)", "CLIP ViT-B/16"]
    assert [t.get_text() for t in figure.legends[0].get_texts()] == ["ID (n=20)", "transferred bronze (n=20)",
                                                                      "sketch & rubbing (n=20)"]
    assert plots.model_label("openai_clip-vit-base-patch16") == "CLIP ViT-B/16"
    assert plots.model_label("resnet-50") == "ResNet-50"
    _save(figure, tmp_path / "f2c.png")


def test_figure1_drops_auroc_below_50(tmp_path):
    rng = np.random.default_rng(6)
    frame = pd.DataFrame([{"region": r, "ood_set": s, "method": f"m{i}", "auroc": rng.uniform(55, 100)}
                          for r in ("NE-America", "W-Europe", "C-America") for s in ("local (L)", "non-local (NL)")
                          for i in range(6)])
    frame.loc[[0, 7], "auroc"] = [20.0, 45.0]
    figure = plots.auroc_distribution_figure(frame)
    assert_usable_figure(figure, 1, (40, 105))
    points = [line for line in figure.axes[0].lines if line.get_linestyle() == "None" and len(line.get_xdata())]
    assert sum(len(p.get_ydata()) for p in points) == len(frame) - 2
    assert min(y for p in points for y in p.get_ydata()) >= 50 and "2 below 50 not shown" in figure.axes[0].get_title()
    assert [t.get_text() for t in figure.axes[0].get_xticklabels()] == ["local (L)", "non-local (NL)"]
    _save(figure, tmp_path / "f1.png")


def test_figure4_log_x_nudged_display_names(tmp_path):
    table = pd.DataFrame([{"species": n, "images": 800, "ood_set": s, "method": "novel_branch", "auroc": 100.0}
                          for n in (10, 100, 1000) for s in ("local", "non_local", "non_target")])
    figure = study_figure(table, "NovelBranch: AUROC vs auxiliary species (800 images)")
    assert_usable_figure(figure, 1, PERCENT)
    axes = figure.axes[0]
    assert axes.get_xscale() == "log"
    lines = [line for line in axes.lines if len(line.get_xdata())]
    xs = np.array([line.get_xdata() for line in lines], dtype=float)
    assert np.allclose(xs[1] / xs[0], NUDGE) and np.allclose(xs[2] / xs[1], NUDGE)  # three lines at 100, all visible
    assert len({line.get_marker() for line in lines}) == 3
    assert [t.get_text() for t in axes.get_legend().get_texts()] == ["local (L)", "non-local (NL)", "non-moth (NM)"]
    _save(figure, tmp_path / "f4.png")


def test_sheets_decode_once_at_reduced_size(tmp_path):
    big = tmp_path / "big.jpg"
    Image.new("RGB", (2048, 1536), (200, 30, 30)).save(big, quality=80)
    pixels = plots.thumbnail(big)
    assert pixels.shape == (96, 128, 3) and abs(int(pixels[..., 0].mean()) - 200) < 6
    assert plots.thumbnail(tmp_path / "missing.jpg") is None
    rows = pd.DataFrame({"method": ["msp", "msp", "vim"], "rank": [1, 2, 1], "score": [0.9, 0.8, 0.7],
                         "id_share": [99.0, 90.0, 80.0], "species": ["Actias luna", "Catocala", None],
                         "file_name": ["a/luna_1.jpg", "b/c.jpg", "d.jpg"], "path": [str(big), str(big), "nope.jpg"]})
    sheet = plots.id_looking_sheet(rows, "local", report.OPEN_INSECTS)
    texts = " ".join(sheet.captions)
    assert "Actias luna" in texts and "luna_1.jpg" in texts and "unreadable" in texts
    assert sheet.labels == ["MSP", "VIM"] and "local" in sheet.title
    shot = assert_usable_png(figures.save_figure(sheet, tmp_path / "sheet.png", ("png", "pdf")))
    assert (shot[..., 0] > 180).any() and (tmp_path / "sheet.pdf").read_bytes()[:4] == b"%PDF"
    photo = assert_usable_png(figures.save_figure(sheet, tmp_path / "sheet.jpg", ("jpg",)), kind="JPEG")
    assert np.abs(photo.astype(int) - shot.astype(int)).mean() < 4  # the page's JPEG: the same sheet
    field = pd.DataFrame({"species": ["a", "a", "b"], "path": [str(big)] * 3, "file_name": ["1.jpg", "2.jpg", "3.jpg"],
                          "score": [0.1, 0.9, 0.2], "flagged": [True, False, True]})
    sheet = plots.field_sheet(field, "bci")
    assert sum("flagged" in t for t in sheet.captions) == 2 and sum("missed" in t for t in sheet.captions) == 1


def test_render_in_worker_processes_on_one_canvas(tmp_path):
    results, _ = read_results(_results(6))
    layout = Layout.of(results)
    table = per_set_table(results, averages=False)
    jobs = [figures.Job(plots.fpr95_figure, tmp_path / "a.png", {"summary": method_summary(results), "layout": layout}),
            figures.Job(plots.heatmap_figure, tmp_path / "b.png", {"table": table, "layout": layout,
                                                                   "metrics": ("fpr95",)}),
            figures.Job(plots.heatmap_figure, tmp_path / "c.png", {"table": None, "layout": layout}),
            figures.Job(plots.heatmap_figure, tmp_path / "d.png", {"table": table, "layout": layout})]
    lines = []
    made = figures.render(jobs, ("png",), workers=2, log=lines.append)
    assert [p.name for p in made] == ["a.png", "b.png", "d.png"] and len(lines) == 1 and "c.png failed" in lines[0]
    for path in made:
        assert_usable_png(path)
    with Image.open(tmp_path / "a.png") as image:
        assert image.info["dpi"][0] == pytest.approx(figures.DPI, abs=1)
    serial = figures.render(jobs[:2], ("png",), workers=1)  # below PARALLEL_JOBS: one process, one canvas
    assert [p.name for p in serial] == ["a.png", "b.png"]
    with figures.reuse_canvas():
        first = figures.new_figure(3, 2)
        first.add_subplot()
        again = figures.new_figure(4, 3)
    assert again is first and not again.axes and tuple(again.get_size_inches()) == (4, 3)
    assert figures.new_figure(3, 2) is not first  # outside render: a new figure each time
