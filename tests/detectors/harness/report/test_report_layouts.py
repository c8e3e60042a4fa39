"""`scripts/report.py --layout open-insects` (two regions) and `--layout shiftedbronzes` on run folders built here as
the runner writes them (results from `detectors.metrics.evaluate`, scores.parquet with file names and manifests,
rule_selection.csv, threshold_transfer.csv, a splits summary, a classifier's metrics.json, fewshot.csv, a feature map).
Every cell of the paper tables is recomputed here from scores.parquet with scikit-learn or by hand."""
from __future__ import annotations

import contextlib
import importlib.util
import io
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image
from sklearn.metrics import roc_auc_score, roc_curve

from detectors.harness.report.names import AUX_TRAINING, CATEGORIES, METHOD_LABELS, method_label
from detectors.harness.results import RESULT_COLUMNS
from detectors.metrics import evaluate, precision_recall_at, threshold_at_tpr
from pipelines.data import make_row, write_manifest
from tests.detectors.harness.report.report_checks import assert_usable_png

ROOT = Path(__file__).resolve().parents[4]
# method -> (family, base, rule, ID-score shift per region)
INSECT_METHODS = {"msp": ("posthoc", "", "", 2.0), "knn": ("posthoc", "", "", 1.0),
                  "logitnorm": ("training", "logitnorm", "", 1.5),
                  "oe": ("training", "oe", "", 0.5), "oe+msp": ("training", "oe", "msp", 2.5),
                  "oe+knn": ("training", "oe", "knn", 1.8)}
CHOSEN = {"oe": "msp", "logitnorm": ""}
NOVEL = [f"novel_{i}" for i in range(4)]


def _cli():
    module = importlib.import_module("oodforge.commands.report")
    return module


def _run_cli(*args: str) -> str:
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert _cli().main(list(args)) == 0
    return printed.getvalue()


def _images(folder: Path, rows: list[dict], hue: int) -> None:
    for i, row in enumerate(rows):
        (folder / row["file_name"]).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (40, 30), ((31 * i) % 255, hue, 90)).save(folder / row["file_name"])
    write_manifest(folder, rows)


def _insect_region(base: Path, region: str, seed: int) -> Path:
    """A region's run folder: results, scores (with file names), rule selection, threshold transfer."""
    data = base / "data" / region
    ids = [make_row(f"id_{i}.png", split="test", role="id", label=i % 3, species=f"sp{i % 3}", hop=0)
           for i in range(30)]
    sets = {"local": 24, "non_local": 18, "non_moth": 12}
    ood = [make_row(f"{s}_{i}.png", split="test", role="ood", ood_set=s, group=None, species=f"{s}_sp{i % 4}",
                    hop=1 + i % 3) for s, n in sets.items() for i in range(n)]
    field = [make_row(f"known_{i}.png", split="test", role="id", label=i % 3, species=f"sp{i % 3}") for i in range(8)]
    field += [make_row(f"new_{i}.png", split="test", role="ood", ood_set="bci", species=NOVEL[i % 4])
              for i in range(12)]
    for name, rows, hue in (("id", ids, 60), ("ood", ood, 160), ("field", field, 220)):
        _images(data / name, rows, hue)
    rng = np.random.default_rng(seed)
    frames = []
    for method, (family, *_, shift) in INSECT_METHODS.items():
        parts = [("id", "id", ids, shift)] + [("ood", s, [r for r in ood if r["ood_set"] == s], 0.0) for s in sets]
        parts += [("field_id", "bci", field[:8], shift), ("field_ood", "bci", field[8:], 0.0)]
        for role, ood_set, rows, mean in parts:
            folder = {"id": "id", "ood": "ood"}.get(role, "field")
            frames.append(pd.DataFrame({"method": method, "family": family, "role": role, "ood_set": ood_set,
                                        "group": None if role == "ood" else role, "index": np.arange(len(rows)),
                                        "score": np.round(rng.normal(mean * (1 + seed / 10), 1.0, len(rows)), 2),
                                        "file_name": [r["file_name"] for r in rows],
                                        "manifest": str(data / folder)}))
    scores = pd.concat(frames, ignore_index=True)
    run = base / region
    run.mkdir(parents=True)
    scores.to_parquet(run / "scores.parquet", index=False)
    rows, transfer = [], []
    for method, (family, b, rule, _) in INSECT_METHODS.items():
        own = scores[scores["method"] == method]
        id_scores = own.loc[own["role"] == "id", "score"]
        for s in sets:
            part = own[(own["role"] == "ood") & (own["ood_set"] == s)]
            rows.append({"method": method, "family": family, "mode": "full" if b else "", "base": b, "rule": rule,
                         "ood_set": s, "group": "", **evaluate(id_scores, part["score"]),
                         "id_acc": 0.7 + 0.01 * len(method) + 0.05 * seed, "n_id": len(id_scores),
                         "n_ood": len(part), "seconds": 1.0, "params": "{}"})
        t = threshold_at_tpr(own.loc[(own["role"] == "ood") & (own["ood_set"] == "local"), "score"], 0.95, "ood")
        transfer.append({"method": method, "source": "local", "target": "bci", "tpr": 0.95,
                         **precision_recall_at(t, own.loc[own["role"] == "field_id", "score"],
                                               own.loc[own["role"] == "field_ood", "score"])})
    pd.DataFrame(rows, columns=RESULT_COLUMNS).to_csv(run / "results.csv", index=False)
    pd.DataFrame(transfer).to_csv(run / "threshold_transfer.csv", index=False)
    pd.DataFrame([{"base": b, "rule": r, "metric": "auroc", "value": 0.5, "ood_val": "aux_val",
                   "chosen": r == CHOSEN[b]}
                  for b, rules in (("oe", ("", "msp", "knn")), ("logitnorm", ("",))) for r in rules]
                 ).to_csv(run / "rule_selection.csv", index=False)
    return run


def _splits(base: Path) -> Path:
    """A splits folder as make_splits writes it, its summary without per-hop counts (read from the manifests)."""
    folder = base / "splits"
    rows = [make_row(f"a{i}.png", split="train", role="id", label=i % 2, species=f"sp{i % 2}", hop=0) for i in range(6)]
    rows += [make_row(f"b{i}.png", split="test", role="ood", ood_set="local", species=f"l{i % 3}", hop=1 + i % 2)
             for i in range(6)]
    write_manifest(folder / "ne-america", rows)
    summary = {"sets": [{"region": "ne-america", "set": "id_train", "name": "id", "role": "id", "split": "train",
                         "species": 2, "images": 6},
                        {"region": "ne-america", "set": "local_test", "name": "local", "role": "ood", "split": "test",
                         "species": 3, "images": 6}],
               "dropped": {"blank species": 4},
               "shortfalls": [{"region": "ne-america", "what": "aux species", "requested": 8000, "found": 20}]}
    (folder / "summary.json").write_text(json.dumps(summary))
    return folder


@pytest.fixture(scope="module")
def insects(tmp_path_factory):
    base = tmp_path_factory.mktemp("insects")
    runs = {"ne-america": _insect_region(base, "ne-america", 0), "w-europe": _insect_region(base, "w-europe", 1)}
    printed = _run_cli("--layout", "open-insects", "--results", *(f"{r}={p / 'results.csv'}" for r, p in runs.items()),
                       "--splits", str(_splits(base)), "--out", str(base / "report"), "--workers", "2")
    return {"runs": runs, "out": base / "report", "printed": printed}


def _sk_auroc(id_scores, ood_scores) -> float:
    return 100 * roc_auc_score(np.r_[np.ones(len(id_scores)), np.zeros(len(ood_scores))], np.r_[id_scores, ood_scores])


def test_open_insects_table2_cell_by_cell(insects):
    table = pd.read_csv(insects["out"] / "table2.csv")
    assert list(dict.fromkeys(table["category"])) == list(CATEGORIES)
    assert list(table["row"]) == ["msp", "knn", "logitnorm", "oe"]  # one row per training method, its chosen rule
    for region, run in insects["runs"].items():
        scores = pd.read_parquet(run / "scores.parquet")
        for _, row in table.iterrows():
            method = (row["row"] if row["row"] not in CHOSEN or not CHOSEN[row["row"]]
                      else f"{row['row']}+{CHOSEN[row['row']]}")
            own = scores[scores["method"] == method]
            for s in ("local", "non_local", "non_moth"):
                expected = _sk_auroc(own.loc[own["role"] == "id", "score"], own.loc[own["ood_set"] == s, "score"])
                assert row[f"{region}/{s}"] == pytest.approx(expected, abs=1e-9)
            assert row[f"{region}/rule"] == (CHOSEN.get(row["row"], "") if isinstance(row[f"{region}/rule"], str)
                                             else "") or pd.isna(row[f"{region}/rule"])
    md = (insects["out"] / "table2.md").read_text()
    assert "NovelBranch" not in md and "OE" in md and "LogitNorm" in md and "MSP" in md  # the papers' names


def test_open_insects_table2_marks_best_per_category_and_overall(insects):
    table = pd.read_csv(insects["out"] / "table2.csv").set_index("row")
    md = (insects["out"] / "table2.md").read_text()
    column = "ne-america/local"
    best = table[column].round(2).idxmax()
    value = f"{table.loc[best, column]:.2f}"
    assert f"**_{value}_**" in md  # best overall is also best in its category: bold and underlined
    tex = (insects["out"] / "table2.tex").read_text()
    assert f"\\textbf{{\\underline{{{value}}}}}" in tex


def test_open_insects_table4_precision_recall(insects):
    """Table 4: per region and category the best Table 2 method (highest mean AUROC over L, NL, NM), its precision and
    recall at the transferred threshold recomputed here from the scores."""
    long = pd.read_csv(insects["out"] / "table4.csv")
    table2 = pd.read_csv(insects["out"] / "table2.csv")
    for region, run in insects["runs"].items():
        scores = pd.read_parquet(run / "scores.parquet")
        mine = long[long["region"] == region]
        for category, rows in table2.groupby("category", sort=False):
            means = rows.set_index("row")[[f"{region}/{s}" for s in ("local", "non_local", "non_moth")]].mean(axis=1)
            best = rows.set_index("row").loc[means.idxmax(), f"{region}/method"]
            picked = mine[mine["category"] == category]
            assert set(picked["method"]) == {best}
            own = scores[scores["method"] == best]
            local = np.sort(own.loc[own["ood_set"] == "local", "score"].to_numpy())
            t = local[int(np.ceil(0.95 * len(local))) - 1] + 1e-9  # flag OOD iff score < t: >= 95% of local flagged
            known, novel = own.loc[own["role"] == "field_id", "score"], own.loc[own["role"] == "field_ood", "score"]
            tp, fp = (novel < t).sum(), (known < t).sum()
            value = picked.set_index("metric")["value"]
            assert value["precision"] == pytest.approx(100 * tp / (tp + fp))
            assert value["recall"] == pytest.approx(100 * tp / len(novel))
    md = (insects["out"] / "table4.md").read_text()
    assert "| Pre-training | Region | Category | Method |" in md and "From scratch" in md and "OE + MSP" in md


def test_open_insects_tables_5_6_and_figures(insects):
    out = insects["out"]
    table5 = (out / "table5.md").read_text()
    assert "blank species: 4" in table5 and "NE-America: 8000 aux species requested, 20 found" in table5
    assert "[{" not in table5 and "'hop'" not in table5  # no raw Python lists
    hops = pd.read_csv(out / "table5.csv")
    local = hops[(hops["part"] == "hops") & (hops["set"] == "local")]
    assert dict(zip(local["hop"].astype(int), local["species"].astype(int))) == {1: 3, 2: 3}  # l0..l2 at both hops
    table6 = pd.read_csv(out / "table6.csv")
    assert set(table6["species"]) == set(NOVEL) and set(table6["region"]) == set(insects["runs"])
    assert (table6.groupby(["region", "method"])["images"].sum() == 12).all()
    assert_usable_png(out / "figure1.png")
    for name in ("figure3_ne-america_bci.jpg", "figure3_w-europe_bci.jpg"):  # thumbnail sheets: JPEG
        assert_usable_png(out / name, kind="JPEG")
    page = (out / "index.html").read_text()
    assert "Table 2: AUROC per OOD type" in page and "Figure 3" in page and "figure1.png" in page
    assert "the best Table 2 method (highest mean AUROC over L, NL, NM; ties: the paper&#x27;s order)" in page


def _sb_run(base: Path) -> Path:
    rng = np.random.default_rng(4)
    sets = {"sketch_rubbing": "hard", "container": "hard", "texture": "easy", "inaturalist": "easy"}
    methods = {"msp": ("posthoc", 1.0), "vim": ("posthoc", 1.6), "mcm": ("clip", 0.7), "locoop": ("clip", 2.2),
               "opengan": ("generative", 0.4)}
    frames, rows = [], []
    for method, (family, shift) in methods.items():
        id_scores = rng.normal(shift, 1.0, 60)
        frames.append(pd.DataFrame({"method": method, "family": family, "role": "id", "ood_set": "id", "group": "id",
                                    "index": np.arange(60), "score": id_scores}))
        for s, g in sets.items():
            ood = rng.normal(0.3 if g == "hard" else -0.5, 1.0, 40)
            frames.append(pd.DataFrame({"method": method, "family": family, "role": "ood", "ood_set": s, "group": g,
                                        "index": np.arange(40), "score": ood}))
            rows.append({"method": method, "family": family, "ood_set": s, "group": g, **evaluate(id_scores, ood),
                         "n_id": 60, "n_ood": 40, "seconds": 1.0})
    run = base / "bronze"
    run.mkdir()
    pd.concat(frames, ignore_index=True).to_parquet(run / "scores.parquet", index=False)
    pd.DataFrame(rows).to_csv(run / "results.csv", index=False)
    fewshot = [{"method": m, "family": "clip", "shots": k, "seed": seed, "ood_set": s, "group": g,
                "auroc": float(np.clip(60 + 3 * k + rng.normal(0, 8), 0, 100)),
                "fpr95": float(np.clip(97 - k + rng.normal(0, 6), 0, 100)), "id_acc": 50 + k}
               for m in ("idlike", "locoop") for k in (1, 2, 4, 8, 16) for seed in (1, 2) for s, g in sets.items()]
    pd.DataFrame(fewshot).to_csv(run / "fewshot.csv", index=False)
    clf = base / "akg"
    clf.mkdir()
    (clf / "metrics.json").write_text(json.dumps({"top1": {"val": {"label": 0.81, "era": 0.7},
                                                           "test": {"label": 0.8, "era": 0.66, "overall": 0.6}},
                                                  "label_field": "category", "heads": ["label", "era"]}))
    maps = base / "fmap"
    maps.mkdir()
    pd.DataFrame({"set": ["ID"] * 5 + ["container"] * 5, "file_name": [f"{i}.png" for i in range(10)],
                  "x": rng.normal(size=10), "y": rng.normal(size=10)}).to_csv(maps / "feature_map_classifier_akg.csv",
                                                                              index=False)
    return run


@pytest.fixture(scope="module")
def bronzes(tmp_path_factory):
    base = tmp_path_factory.mktemp("bronzes")
    run = _sb_run(base)
    _run_cli("--layout", "shiftedbronzes", "--results", str(run / "results.csv"), "--out", str(base / "report"),
             "--classifier", str(base / "akg"), "--feature-maps", str(base / "fmap"), "--figures", "pdf")
    return {"run": run, "out": base / "report"}


def _sk_fpr95(id_scores, ood_scores) -> float:
    """OpenOOD's FPR@95 with scikit-learn: OOD positive ranked by -score; ID share flagged where TPR first >= 0.95."""
    fpr, tpr, _ = roc_curve(np.r_[np.zeros(len(id_scores)), np.ones(len(ood_scores))], -np.r_[id_scores, ood_scores])
    return 100 * fpr[np.argmax(tpr >= 0.95)]


def test_shiftedbronzes_tables_cell_by_cell(bronzes):
    out, scores = bronzes["out"], pd.read_parquet(bronzes["run"] / "scores.parquet")
    table3 = pd.read_csv(out / "sb_table3.csv").set_index("method")
    table4 = pd.read_csv(out / "sb_table4.csv").set_index("family")
    assert list(table4.columns) == [f"{g}/{m}" for g in ("all", "hard", "easy") for m in ("fpr95", "auroc")]
    per_method = {}
    for method, own in scores.groupby("method", sort=False):
        ids = own.loc[own["role"] == "id", "score"]
        values = {s: (_sk_fpr95(ids, p["score"]), _sk_auroc(ids, p["score"]), p["group"].iloc[0])
                  for s, p in own[own["role"] == "ood"].groupby("ood_set", sort=False)}
        for s, (fpr, auc, _) in values.items():
            assert table3.loc[method, f"{s}/auroc"] == pytest.approx(auc, abs=1e-9)
            assert table3.loc[method, f"{s}/fpr95"] == pytest.approx(fpr, abs=1e-9)
        assert table3.loc[method, "Average/auroc"] == pytest.approx(np.mean([v[1] for v in values.values()]))
        per_method[method] = (own["family"].iloc[0], values)
    for family in ("posthoc", "clip", "generative"):
        members = [v for f, v in per_method.values() if f == family]
        for group in ("hard", "easy"):
            expected = np.mean([np.mean([v[1] for v in m.values() if v[2] == group]) for m in members])
            assert table4.loc[family, f"{group}/auroc"] == pytest.approx(expected)
    md4 = (out / "sb_table4.md").read_text()
    assert "Post-hoc" in md4 and "VLM-based" in md4 and "Generation-based" in md4
    md3 = (out / "sb_table3.md").read_text()
    assert "LoCoOp" in md3 and "ViM" in md3 and "| Average |" in md3
    assert "\\multicolumn{1}{c}{}" in (out / "sb_table3.tex").read_text()  # the Average column has its span
    table2 = pd.read_csv(out / "sb_table2.csv").set_index("model")
    assert table2.loc["akg", "category"] == pytest.approx(80.0) and table2.loc["akg", "overall"] == pytest.approx(60.0)
    assert table2.loc["akg", "era"] == pytest.approx(66.0)  # the test split's, per head


def test_shiftedbronzes_figures_and_page(bronzes):
    out = bronzes["out"]
    for stem in ("sb_figure5", "sb_figure6", "sb_figure7", "sb_figure2c"):
        assert_usable_png(out / f"{stem}.png")
        assert (out / f"{stem}.pdf").read_bytes()[:4] == b"%PDF", stem
    page = (out / "index.html").read_text()
    assert "sb_figure7.pdf" in page and "Table 2: dating accuracy" in page
    assert page.index("Table 3:") < page.index("Table 4:") < page.index("Table 2:")  # the paper's first table first
    assert "lowest mean FPR@95" in page  # Figure 6's criterion, stated
    assert not (out / "table4.csv").exists()  # ShiftedBronzes' family table is sb_table4: no clash with Open-Insects
    assert not list(out.glob("roc*.png")) and not list(out.glob("heatmap*.png"))  # only the paper's figures


def test_sections_without_inputs_are_left_out(tmp_path):
    run = _sb_run(tmp_path)
    (run / "fewshot.csv").unlink()
    _run_cli("--layout", "shiftedbronzes", "--results", str(run / "results.csv"), "--out", str(tmp_path / "r"),
             "--figures", "none")
    page = (tmp_path / "r" / "index.html").read_text()
    assert "Figure 7" not in page and "Table 2: dating" not in page and "Most ID-looking" not in page
    assert "<img" not in page and not list((tmp_path / "r").glob("*.png"))


def test_display_names_cover_the_registry_and_aux_categories():
    import detectors

    assert set(detectors.available()) <= set(METHOD_LABELS)
    for name in detectors.available(family="training"):
        uses_aux = bool(getattr(detectors.build(name).objective(), "uses_aux", False))
        assert (name in AUX_TRAINING) == uses_aux, name
    assert method_label("oe+msp") == "OE + MSP"


@pytest.mark.slow
def test_shiftedbronzes_diagnostics_add_the_generic_figures_collapsed(tmp_path):
    run = _sb_run(tmp_path)
    _run_cli("--layout", "shiftedbronzes", "--results", str(run / "results.csv"), "--out", str(tmp_path / "r"),
             "--diagnostics")
    out = tmp_path / "r"
    for name in ("heatmaps.png", "roc.png", "score_densities.png", "sb_figure5.png"):
        assert_usable_png(out / name)
    page = (out / "index.html").read_text()
    assert page.index("Table 3:") < page.index("heatmaps.png")  # the paper's first table still opens the page
    assert '<h2 id="roc-curves-and-score-densities">ROC curves and score densities</h2>\n<details>' in page


def test_best_method_ties_go_to_the_papers_order():
    """Tables 4 / 6 and Figure 3 pick by mean AUROC over L, NL, NM; a tie goes to the method the paper lists first
    (MSP before VIM before KNN), whatever the results' order."""
    from detectors.harness.report.open_insects import best_rows
    from detectors.harness.report.papers import Run
    from detectors.harness.report.tables import read_results

    rows = [{"method": m, "family": "posthoc", "ood_set": s, "group": "", "auroc": a, "fpr95": 0.5, "aupr_in": 0.5,
             "aupr_out": 0.5, "n_id": 4, "n_ood": 4, "seconds": 1.0}
            for m, a in (("knn", 0.9), ("vim", 0.9), ("msp", 0.9), ("ebo", 0.8)) for s in ("local", "non_local")]
    frame, scale = read_results(pd.DataFrame(rows))
    run = Run("r", Path("."), frame, scale)
    assert list(best_rows(run)["method"]) == ["msp"] and list(best_rows(run, per_category=False)["row"]) == ["msp"]
    frame.loc[(frame["method"] == "knn") & (frame["ood_set"] == "local"), "auroc"] = 95.0
    assert list(best_rows(run)["method"]) == ["knn"]


def test_shiftedbronzes_table2_reads_the_checkpoint_the_run_scored():
    """A dating model that keeps a best epoch: Table 2 shows the accuracy of the checkpoint the results name
    (`checkpoint` column), the last epoch's where they name none."""
    from detectors.harness.report.shiftedbronzes import classifier_accuracy, scored_checkpoint

    metrics = {"label_field": "era", "top1": {"test": {"label": 0.80}},
               "checkpoints": {"last": {"test": {"label": 0.80}}, "best": {"test": {"label": 0.85}}}}
    assert classifier_accuracy(metrics, "best") == {"era": 85.0, "overall": 85.0}
    assert classifier_accuracy(metrics, "last") == {"era": 80.0, "overall": 80.0}
    assert classifier_accuracy({"top1": {"test": {"label": 0.7}}}, "best") == {"label": 70.0, "overall": 70.0}
    assert scored_checkpoint(pd.DataFrame({"checkpoint": ["best", "best"]})) == "best"
    assert scored_checkpoint(pd.DataFrame({"checkpoint": ["", None]})) == "last"
    assert scored_checkpoint(pd.DataFrame({"method": ["msp"]})) == "last"
