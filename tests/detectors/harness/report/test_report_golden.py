"""Golden tables: the papers' tables from small fixed scores files (golden/*.csv), compared with the Markdown and LaTeX
written by hand from the papers' layouts (golden/<layout>/<table file>, one file per expected table).

Every OOD set's scores are the ID scores [1, 2, 3, 4] shifted down by a whole d, so each cell is known by hand:
AUROC d=-1 28.125, 0 50, 1 71.875, 2 87.5, 3 96.875, 4 100; FPR@95 (OOD positive: all four OOD detected, the ID share
at or below the highest OOD score) d=-1 100, 0 100, 1 75, 2 50, 3 25, 4 0. Two decimals round half to even (28.12).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from detectors.harness.report import write_open_insects, write_report
from detectors.harness.results import RESULT_COLUMNS
from detectors.metrics import evaluate
from pipelines.data import make_row, write_manifest

GOLDEN = Path(__file__).resolve().parent / "golden"
TRAINING = {"logitnorm": ("logitnorm", ""), "oe": ("oe", ""), "oe+msp": ("oe", "msp"), "udg": ("udg", "")}
ID_ACC = {"ne-america": {"posthoc": 0.80, "generative": 0.80, "logitnorm": 0.78, "oe": 0.81, "udg": 0.77},
          "c-america": {"posthoc": 0.70, "generative": 0.70, "logitnorm": 0.72, "oe": 0.69, "udg": 0.75}}
NOVEL = ["Aus bus", "Aus bus", "Cus dus", "Cus dus", "Eus fus"]


def _results(scores: pd.DataFrame, id_acc) -> pd.DataFrame:
    rows = []
    for method, own in scores.groupby("method", sort=False):
        ids = own.loc[own["role"] == "id", "score"].to_numpy()
        base, rule = TRAINING.get(method, ("", ""))
        for ood_set, part in own[own["role"] == "ood"].groupby("ood_set", sort=False):
            rows.append({"method": method, "family": own["family"].iloc[0], "mode": "full" if base else "",
                         "base": base, "rule": rule, "ood_set": ood_set, "group": part["group"].iloc[0],
                         **evaluate(ids, part["score"].to_numpy()), "id_acc": id_acc(method, own["family"].iloc[0]),
                         "n_id": len(ids), "n_ood": len(part), "seconds": 1.0, "params": "{}"})
    return pd.DataFrame(rows, columns=RESULT_COLUMNS)


def _insect_run(base: Path, region: str, scores: pd.DataFrame) -> Path:
    run = base / region
    run.mkdir(parents=True)
    scores = scores.drop(columns="run").assign(group=scores["group"].fillna(""))
    scores.to_parquet(run / "scores.parquet", index=False)
    acc = ID_ACC[region]
    _results(scores, lambda m, f: acc.get(TRAINING.get(m, (m,))[0], acc.get(f))).to_csv(run / "results.csv",
                                                                                        index=False)
    pd.DataFrame([{"base": b, "rule": r, "metric": "auroc", "value": 0.9, "ood_val": "auxiliary", "chosen": c}
                  for b, r, c in (("logitnorm", "", True), ("oe", "", False), ("oe", "msp", True), ("udg", "", True))]
                 ).to_csv(run / "rule_selection.csv", index=False)
    if region == "c-america":
        transfer = {"msp": (0.9, 0.5), "vim": (0.8, 0.75), "opengan": (0.1, 0.1), "logitnorm": (0.5, 0.25),
                    "oe+msp": (0.6, 0.6), "oe": (0.6, 0.6), "udg": (1.0, 1.0)}
        pd.DataFrame([{"method": m, "source": "local", "target": "bci", "tpr": 0.95, "threshold": 2.0, "precision": p,
                       "recall": r, "id_kept": 0.95, "tp": 1, "fp": 1, "n_id": 4, "n_ood": 5}
                      for m, (p, r) in transfer.items()]).to_csv(run / "threshold_transfer.csv", index=False)
        rows = [make_row(f"k{i}.png", split="test", role="id", label=0, species="Known sp") for i in range(4)]
        rows += [make_row(f"n{i}.png", split="test", role="ood", ood_set="bci", species=s) for i, s in enumerate(NOVEL)]
        write_manifest(run / "field", rows)
    return run


def _summary(folder: Path) -> Path:
    def entry(region, name, split, species, images, hops=()):
        return {"region": region, "set": f"{name}_{split}", "name": name, "role": "id" if name == "id" else "ood",
                "split": split, "species": species, "images": images,
                "hops": [{"hop": h, "species": s, "images": n} for h, s, n in hops]}

    sets = [entry("ne-america", "id", "train", 6, 60, [(0, 6, 60)]), entry("ne-america", "id", "test", 6, 12),
            entry("ne-america", "local", "test", 5, 40, [(1, 2, 10), (2, 2, 20), (3, 1, 10)]),
            entry("ne-america", "non_local", "test", 3, 30, [(3, 3, 30)]),
            entry("ne-america", "non_target", "test", 4, 8, [(3, 4, 8)]),
            entry("c-america", "id", "train", 3, 30, [(0, 3, 30)]), entry("c-america", "id", "test", 3, 9),
            entry("c-america", "local", "test", 4, 16, [(2, 1, 4), (1, 3, 12)]),  # hops out of order
            entry("c-america", "non_local", "test", 2, 8, [(3, 2, 8)])]
    folder.mkdir()
    (folder / "summary.json").write_text(json.dumps({
        "sets": sets, "dropped": {"blank species": 4},
        "shortfalls": [{"region": "c-america", "what": "aux species", "requested": 8000, "found": 20}]}))
    return folder


@pytest.fixture(scope="module")
def insects(tmp_path_factory):
    base = tmp_path_factory.mktemp("golden_insects")
    scores = pd.read_csv(GOLDEN / "open_insects_scores.csv", keep_default_na=False)
    runs = {r: _insect_run(base, r, part) for r, part in scores.groupby("run", sort=False)}
    write_open_insects([(r, p / "results.csv") for r, p in runs.items()], base / "report",
                       splits=_summary(base / "splits"), figures="none")
    return base / "report"


NOTE2 = ("AUROC (%) of ID test against each OOD type (L local, NL non-local, NM non-moth); ID acc.: top-1 accuracy (%) "
         "on ID test. Best per category in bold, best overall underlined (both: bold and underlined; markdown: bold "
         "italics). The post-hoc methods (OpenGAN among them) score the region's one base classifier: its ID accuracy "
         "is shown once. Training methods are scored with the post-hoc rule chosen on validation (rule_selection.csv; "
         "without one, their own score): LogitNorm (NE-America, C-America); OE + MSP (NE-America, C-America); UDG "
         "(NE-America, C-America). Input metrics were fractions, converted to percent.")


@pytest.fixture(scope="module")
def bronzes(tmp_path_factory):
    base = tmp_path_factory.mktemp("golden_bronzes")
    scores = pd.read_csv(GOLDEN / "shiftedbronzes_scores.csv").drop(columns="run")
    run = base / "bronze"
    run.mkdir()
    scores.to_parquet(run / "scores.parquet", index=False)
    own = {"locoop": 0.60, "idlike": 0.65}
    _results(scores, lambda m, f: own.get(m, 0.8125)).to_csv(run / "results.csv", index=False)
    for name, metrics in (("akg", {"top1": {"test": {"label": 0.8125, "era": 0.75, "overall": 0.625}},
                                   "label_field": "dating"}),
                          ("resnet50", {"top1": {"test": {"label": 0.70}}, "label_field": "dating"})):
        (base / name).mkdir()
        (base / name / "metrics.json").write_text(json.dumps(metrics))
    write_report(run / "results.csv", base / "report", layout="shiftedbronzes", figures="none",
                 classifier=[base / "akg", f"resnet50={base / 'resnet50'}"])
    return base / "report"


NOTE3 = ("Cells: FPR@95 / AUROC (%). Best per column and metric in bold, second best underlined (markdown: italics). "
         "Average: the mean over all 4 sets. Input metrics were fractions, converted to percent.")
FLAG = "† AUROC below 50: the detector scores this OOD set as more in-distribution than ID."

GOLDEN_TABLES = sorted((layout.name, table.name) for layout in GOLDEN.iterdir() if layout.is_dir()
                       for table in layout.iterdir())
"""Every expected table: golden/<layout>/<file> is what the report writes as <file> for that layout (a new table is
one more file here; write it by hand from the paper's layout, never by copying the output)."""


@pytest.mark.parametrize(("layout", "name"), GOLDEN_TABLES, ids=[f"{a}/{b}" for a, b in GOLDEN_TABLES])
def test_the_written_table_is_the_golden_one(layout, name, request):
    """Open-Insects: Table 2 (categories, best per category), Tables 4 and 6 (the best method per category in C-America,
    the run with a field set; Table 6's denominator is the field set's novel-species images: 5 here, 117 in the paper),
    Table 5 (hop x region x local / non-local, hops sorted; `non_target` is NM). ShiftedBronzes: Table 3 (the paper's
    names and order: post-hoc as its Section 5 lists them, then VLM-based, then generation-based; no ID acc. column,
    the Average not flagged), Table 4 (Post-hoc, VLM-based, Generation-based), Table 2 (one row per dating model,
    overall then per head)."""
    folder = request.getfixturevalue({"open_insects": "insects", "shiftedbronzes": "bronzes"}[layout])
    assert (folder / name).read_text() == (GOLDEN / layout / name).read_text(encoding="utf-8")


def test_every_table_the_layouts_write_has_a_golden_file(insects, bronzes):
    """A table the report writes with no golden file (in one of its formats) fails here: a new table comes with its
    expected text."""
    for layout, folder in (("open_insects", insects), ("shiftedbronzes", bronzes)):
        written = {p.stem for p in folder.glob("*") if p.suffix in (".md", ".tex") and p.stem[:5] in ("table", "sb_ta")}
        golden = {Path(name).stem for lay, name in GOLDEN_TABLES if lay == layout}
        assert written <= golden, (layout, sorted(written - golden))


def test_golden_cells_match_the_metrics():
    """The hand values above are detectors.metrics' (the shift table of the module docstring)."""
    ids = np.array([1.0, 2, 3, 4])
    for d, (auroc, fpr) in {-1: (28.125, 100), 0: (50, 100), 1: (71.875, 75), 2: (87.5, 50), 3: (96.875, 25),
                            4: (100, 0)}.items():
        got = evaluate(ids, ids - d)
        assert (100 * got["auroc"], 100 * got["fpr95"]) == pytest.approx((auroc, fpr))
