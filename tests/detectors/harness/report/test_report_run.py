"""scripts/report.py on a whole run folder built here as the runner writes it: a field set with threshold transfer,
scores with file names and manifests, heads-only rows with ID accuracy, a rule choice on validation and a set whose
AUROC is below 50. Every new table is checked against values computed here from the scores and the manifests
(scikit-learn AUROC, masks built from the manifest rows, counts by hand)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image
from sklearn.metrics import roc_auc_score

from detectors.harness import report
from detectors.harness.results import RESULT_COLUMNS
from detectors.metrics import evaluate, precision_recall_at, threshold_at_tpr
from pipelines.data import make_row, write_manifest

ROOT = Path(__file__).resolve().parents[4]
METHODS = {"msp": ("posthoc", "", "", ""), "knn": ("posthoc", "", "", ""), "oe": ("training", "oe", "", "heads"),
           "oe+msp": ("training", "oe", "msp", "heads")}
SHIFT = {"msp": 2.0, "knn": 1.0, "oe": 1.5, "oe+msp": 2.5}
NOVEL_SPECIES = [f"novel_{i}" for i in range(5)]


def _image(path: Path, color: tuple[int, int, int]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (24, 24), color).save(path)


def _manifests(data: Path) -> dict[str, list[dict]]:
    """ID test rows, OOD rows (local: hops 1-3; non_local: hop 3) and a field set (known + novel species)."""
    rows = {"id": [make_row(f"id_{i}.png", split="test", role="id", label=i % 3, species=f"id_sp{i % 3}", hop=0)
                   for i in range(40)],
            "ood": [make_row(f"local_{i}.png", split="test", role="ood", ood_set="local", group="near",
                             species=f"local_sp{i % 6}", hop=1 + i % 3) for i in range(30)]
            + [make_row(f"far_{i}.png", split="test", role="ood", ood_set="non_local", group="far",
                        species=f"far_sp{i % 4}", hop=3) for i in range(20)],
            "field": [make_row(f"known_{i}.png", split="test", role="id", label=i % 3, species=f"id_sp{i % 3}")
                      for i in range(10)]
            + [make_row(f"new_{i}.png", split="test", role="ood", ood_set="bci", species=NOVEL_SPECIES[i % 5])
               for i in range(15)]}
    for name, part in rows.items():
        for i, row in enumerate(part):
            _image(data / name / row["file_name"], ((37 * i) % 255, 90 if name == "id" else 200, 120))
        write_manifest(data / name, part)
    return rows


def _scores(rows: dict[str, list[dict]], data: Path) -> pd.DataFrame:
    """ID scores ~ N(shift, 1), OOD ~ N(0, 1) (knn on non_local: N(3, 1), so its AUROC is below 50)."""
    rng = np.random.default_rng(0)
    frames = []
    for method, (family, *_) in METHODS.items():
        parts = [("id", "id", "id", "id", rows["id"], SHIFT[method]),
                 ("ood", "local", "near", "data/ood", rows["ood"][:30], 0.0),  # relative to where the run started
                 # to the run
                 ("ood", "non_local", "far", "../data/ood", rows["ood"][30:], 3.0 if method == "knn" else 0.0),
                 ("field_id", "bci", "field", str(data / "field"), rows["field"][:10], SHIFT[method]),
                 ("field_ood", "bci", "field", str(data / "field"), rows["field"][10:], 0.0)]
        for role, ood_set, group, manifest, part, mean in parts:
            score = np.round(rng.normal(mean, 1.0, len(part)), 1)  # rounded: ties, as real scores have
            frames.append(pd.DataFrame({"method": method, "family": family, "role": role, "ood_set": ood_set,
                                        "group": group, "index": np.arange(len(part)), "score": score,
                                        "file_name": [r["file_name"] for r in part],
                                        "manifest": str(data / "id") if role == "id" else manifest}))
    return pd.concat(frames, ignore_index=True)


def _results(scores: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for method, (family, base, rule, mode) in METHODS.items():
        own = scores[scores["method"] == method]
        id_scores = own.loc[own["role"] == "id", "score"]
        for ood_set, part in own[own["role"] == "ood"].groupby("ood_set", sort=False):
            rows.append({"method": method, "family": family, "mode": mode, "base": base, "rule": rule,
                         "ood_set": ood_set, "group": part["group"].iloc[0], **evaluate(id_scores, part["score"]),
                         "id_acc": 0.9 if base else 0.8, "n_id": len(id_scores), "n_ood": len(part), "seconds": 1.0,
                         "params": "{}"})
    return pd.DataFrame(rows, columns=RESULT_COLUMNS)


def _transfer(scores: pd.DataFrame, species: dict[str, str]) -> pd.DataFrame:
    rows = []
    for method, own in scores.groupby("method", sort=False):
        t = threshold_at_tpr(own.loc[(own["role"] == "ood") & (own["ood_set"] == "local"), "score"], 0.95, "ood")
        novel = own[own["role"] == "field_ood"]
        flagged = novel["score"].to_numpy() < t
        names = novel["file_name"].map(species)
        rows.append({"method": method, "source": "local", "target": "bci", "tpr": 0.95,
                     **precision_recall_at(t, own.loc[own["role"] == "field_id", "score"], novel["score"]),
                     "species_detected": flagged.mean(),
                     "species_any": pd.Series(flagged).groupby(names.to_numpy()).any().mean(),
                     "n_novel_species": names.nunique()})
        far = own.loc[(own["role"] == "ood") & (own["ood_set"] == "non_local"), "score"]
        rows.append({"method": method, "source": "local", "target": "non_local", "tpr": 0.95,
                     **precision_recall_at(t, own.loc[own["role"] == "id", "score"], far)})
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The run folder, the report scripts/report.py wrote from it (--bootstrap 300), and what it printed."""
    base = tmp_path_factory.mktemp("report_run")
    rows = _manifests(base / "data")
    folder = base / "run"
    folder.mkdir()
    scores = _scores(rows, base / "data")
    scores.to_parquet(folder / "scores.parquet", index=False)
    _results(scores).to_csv(folder / "results.csv", index=False)
    species = {r["file_name"]: r["species"] for r in rows["field"]}
    _transfer(scores, species).to_csv(folder / "threshold_transfer.csv", index=False)
    pd.DataFrame([{"base": "oe", "rule": r, "metric": "auroc", "value": v, "ood_val": "aux_val", "chosen": r == "msp"}
                  for r, v in (("", 0.7), ("msp", 0.8))]).to_csv(folder / "rule_selection.csv", index=False)
    cli = importlib.import_module("oodforge.commands.report")
    import contextlib
    import io

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert cli.main(["--results", str(folder / "results.csv"), "--out", str(base / "report"), "--bootstrap", "300",
                         "--top-k", "3"]) == 0
    return {"folder": folder, "out": base / "report", "scores": scores, "rows": rows, "printed": printed.getvalue()}


def _auroc(scores: pd.DataFrame, method: str, ood_mask: pd.Series) -> float:
    own = scores[scores["method"] == method]
    id_scores = own.loc[own["role"] == "id", "score"]
    ood_scores = own.loc[ood_mask.loc[own.index], "score"]
    labels = np.r_[np.ones(len(id_scores)), np.zeros(len(ood_scores))]
    return 100 * roc_auc_score(labels, np.r_[id_scores, ood_scores])


def test_field_roles_and_per_set_auroc(run):
    scores, out = run["scores"], run["out"]
    table3 = pd.read_csv(out / "table3.csv").set_index("method")
    for method in METHODS:
        for ood_set in ("local", "non_local"):
            mask = (scores["role"] == "ood") & (scores["ood_set"] == ood_set)
            assert table3.loc[method, f"{ood_set}/auroc"] == pytest.approx(_auroc(scores, method, mask), abs=1e-9)
    assert (out / "score_densities.png").is_file() and (out / "roc.png").is_file()
    assert "novel-species images flagged" in (out / "threshold_transfer.md").read_text()


def test_low_auroc_flag_id_acc_and_heads_rows(run):
    out, printed = run["out"], run["printed"]
    md = (out / "table3.md").read_text()
    knn = next(line for line in md.splitlines() if "| knn |" in line)
    assert knn.split("|")[-2].strip().endswith("†") and "AUROC below 50" in md
    assert "warning: knn on non_local (far): AUROC" in printed
    assert "| ID acc. |" in md.splitlines()[2] and "oe+msp (heads)" in md
    oe = next(line for line in md.splitlines() if "| oe (heads) |" in line)
    assert oe.split("|")[3].strip() == "90.00"
    assert "\\textsuperscript{\\dag}" in (out / "table3.tex").read_text()


def test_families_average_their_own_rows(run):
    table4 = pd.read_csv(out_csv := run["out"] / "sb_table4.csv").set_index("family")
    assert out_csv.is_file() and list(table4.index) == ["posthoc", "training"]
    results = pd.read_csv(run["folder"] / "results.csv")
    for family in ("posthoc", "training"):
        per_method = results[results["family"] == family].groupby("method")["auroc"].mean() * 100
        assert table4.loc[family, "all/auroc"] == pytest.approx(per_method.mean())


def test_best_rule_names_the_validation_split(run):
    best = pd.read_csv(run["out"] / "best_rule.csv")
    assert list(best["method"]) == ["oe+msp"] and best["chosen on"].iloc[0] == "validation (aux_val): auroc 80.00"


def test_bootstrap_against_sklearn(run):
    scores = run["scores"]
    boot = pd.read_csv(run["out"] / "bootstrap.csv")
    assert len(boot) == len(METHODS) * 2 and (boot["n_boot"] == 300).all()
    for row in boot.itertuples():
        mask = (scores["role"] == "ood") & (scores["ood_set"] == row.ood_set)
        assert row.auroc == pytest.approx(_auroc(scores, row.method, mask), abs=1e-9)
        assert row.auroc_lo <= row.auroc <= row.auroc_hi and row.fpr95_lo <= row.fpr95 <= row.fpr95_hi
        assert row.auroc_hi - row.auroc_lo > 0


def test_hop_auroc_by_hand(run):
    scores, rows = run["scores"], run["rows"]
    hops = {r["file_name"]: r["hop"] for r in rows["ood"]}
    table = pd.read_csv(run["out"] / "hop_auroc.csv")
    ood = scores["role"] == "ood"
    hop = scores["file_name"].map(hops)
    for row in table.itertuples():
        mask = ood & (hop == row.hop) & ((scores["ood_set"] == row.ood_set) | (row.ood_set == "all"))
        assert row.auroc == pytest.approx(_auroc(scores, row.method, mask), abs=1e-9)
        assert row.n_ood == int(mask[scores["method"] == row.method].sum())
    assert set(table.loc[table["ood_set"] == "local", "distance"]) == {"same genus", "same family", "farther"}
    assert set(table.loc[table["ood_set"] == "non_local", "hop"]) == {3}


def test_species_field_report_by_hand(run):
    scores, out = run["scores"], run["out"]
    species = {r["file_name"]: r["species"] for r in run["rows"]["field"]}
    transfer = pd.read_csv(run["folder"] / "threshold_transfer.csv")
    table = pd.read_csv(out / "species_field.csv")
    for method in METHODS:
        threshold = transfer.loc[(transfer["method"] == method) & (transfer["target"] == "bci"), "threshold"].iloc[0]
        novel = scores[(scores["method"] == method) & (scores["role"] == "field_ood")]
        for name in NOVEL_SPECIES:
            mine = novel[novel["file_name"].map(species) == name]
            got = table[(table["method"] == method) & (table["species"] == name)].iloc[0]
            flagged = int((mine["score"] < threshold).sum())
            assert (got["images"], got["flagged"]) == (len(mine), flagged)
            assert got["any"] == (flagged > 0) and got["majority"] == (flagged > len(mine) / 2)
    md = (out / "species_field.md").read_text()
    summary = report.species_summary(table)
    for row in summary.itertuples():  # the same shares as the runner's transfer table
        t = transfer[(transfer["method"] == row.method) & (transfer["target"] == "bci")].iloc[0]
        assert row.images_flagged == pytest.approx(100 * t["species_detected"])
        assert row.any == pytest.approx(100 * t["species_any"])
    assert "species with >= 1 flagged (%)" in md


def test_id_looking_images(run):
    scores, out = run["scores"], run["out"]
    table = pd.read_csv(out / "id_looking.csv")
    for (method, ood_set), part in table.groupby(["method", "ood_set"]):
        own = scores[(scores["method"] == method) & (scores["role"] == "ood") & (scores["ood_set"] == ood_set)]
        top = own.sort_values("score", ascending=False, kind="mergesort").head(3)
        assert list(part["file_name"]) == list(top["file_name"]) and list(part["rank"]) == [1, 2, 3]
        id_scores = scores.loc[(scores["method"] == method) & (scores["role"] == "id"), "score"].to_numpy()
        assert part["id_share"].iloc[0] == pytest.approx(100 * (id_scores < top["score"].iloc[0]).mean())
    for s in ("local", "non_local"):
        with Image.open(out / f"id_looking_{s}.jpg") as sheet:
            assert sheet.width > 300 and sheet.height > 300


def test_index_html_references_every_figure_and_table(run):
    out = run["out"]
    page = (out / "index.html").read_text()
    assert report.missing_files(out / "index.html") == []
    referenced = set(report.referenced_files(page))
    pngs = {p.name for p in (*out.glob("*.png"), *out.glob("*.jpg"))}
    assert pngs <= referenced and {"table3.md", "bootstrap.csv", "hop_auroc.csv", "species_field.csv"} <= referenced
    for heading in ("Warnings", "Table 3", "Table 4", "Best rule", "Threshold transfer", "Bootstrap",
                    "taxonomic distance", "novel species", "ID-looking"):
        assert heading in page
    assert "<table>" in page and 'class="flag"' in page
    assert "field_sheet_bci.jpg" in pngs  # Figure 3: the field set's novel species, flagged or missed


def test_field_sheet_marks_each_novel_image_flagged_or_missed(run):
    """The sheet's captions against the transfer row of best recall and the scores, by hand."""
    from detectors.harness.report import plots

    transfer = pd.read_csv(run["folder"] / "threshold_transfer.csv")
    rule = transfer[transfer["target"] == "bci"].sort_values("recall", ascending=False, kind="mergesort").iloc[0]
    scores = run["scores"]
    novel = scores[(scores["method"] == rule["method"]) & (scores["role"] == "field_ood")]
    species = {r["file_name"]: r["species"] for r in run["rows"]["field"]}
    rows = novel.assign(species=novel["file_name"].map(species), path="missing.png",
                        flagged=novel["score"] < rule["threshold"])
    figure = plots.field_sheet(rows.groupby("species", sort=False, group_keys=False).head(4), "bci")
    texts = figure.captions
    shown = rows.groupby("species", sort=False, group_keys=False).head(4)
    assert sum("flagged" in t for t in texts) == int(shown["flagged"].sum())
    assert sum("missed" in t for t in texts) == int((~shown["flagged"]).sum())
    assert figure.labels == list(dict.fromkeys(shown["species"]))


def test_older_run_without_traceability_columns(tmp_path, run):
    folder = tmp_path / "old"
    folder.mkdir()
    scores = run["scores"].drop(columns=["file_name", "manifest"])
    scores.to_parquet(folder / "scores.parquet", index=False)
    results = pd.read_csv(run["folder"] / "results.csv").drop(columns=["mode", "id_acc", "params"])
    results.to_csv(folder / "results.csv", index=False)
    lines = []
    written = report.write_report(folder / "results.csv", tmp_path / "out", scores=folder / "scores.parquet",
                                  top_k=2, log=lines.append)
    names = {p.name for p in written}
    assert "index.html" in names and "hop_auroc.csv" not in names and "id_looking.csv" not in names
    assert any("file_name / manifest" in line for line in lines)
    assert "ID acc." not in (tmp_path / "out" / "table3.md").read_text()
    assert report.missing_files(tmp_path / "out" / "index.html") == []


def test_unknown_score_role_is_one_clear_error():
    frame = pd.DataFrame({"method": ["a"], "family": ["posthoc"], "role": ["aux"], "ood_set": ["x"], "group": [""],
                          "index": [0], "score": [1.0]})
    with pytest.raises(ValueError, match=r"role.*'field_ood'.*\['aux'\]"):
        report.read_scores(frame)
    assert json.dumps(sorted(report.read_scores(frame.assign(role="field_id"))["role"])) == '["field_id"]'
