"""detectors.harness.report on a hand-made results table whose averages and best/second-best marks are worked out by
hand."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from detectors.harness import report

ROOT = Path(__file__).resolve().parents[4]
SETS = {"sketch_rubbing": "hard", "container": "hard", "texture": "easy"}
FAMILY = {"a": "posthoc", "b": "posthoc", "c": "clip"}
# Percent values: FPR[method][set], AUROC[method][set].
FPR = {"a": {"sketch_rubbing": 10, "container": 30, "texture": 50},
       "b": {"sketch_rubbing": 20, "container": 40, "texture": 5},
       "c": {"sketch_rubbing": 60, "container": 10, "texture": 40}}
AUC = {"a": {"sketch_rubbing": 90, "container": 80, "texture": 70},
       "b": {"sketch_rubbing": 95, "container": 85, "texture": 60},
       "c": {"sketch_rubbing": 70, "container": 99, "texture": 88}}


def results_table(scale: float = 1.0) -> pd.DataFrame:
    """Rows with clip first and sets shuffled, to check the stable ordering; metrics multiplied by `scale`."""
    order = [("c", "texture"), ("a", "container"), ("c", "sketch_rubbing"), ("a", "sketch_rubbing"), ("b", "texture"),
             ("a", "texture"), ("b", "sketch_rubbing"), ("c", "container"), ("b", "container")]
    return pd.DataFrame([{
        "method": m, "family": FAMILY[m], "ood_set": s, "group": SETS[s], "auroc": AUC[m][s] * scale,
        "fpr95": FPR[m][s] * scale, "aupr_in": 50 * scale, "aupr_out": 60 * scale, "n_id": 100, "n_ood": 40,
        "seconds": 0.5, "fpr95_id": 20 * scale} for m, s in order])


def mean(*values: float) -> float:
    return sum(values) / len(values)


def method_mean(table: dict, method: str, sets: list[str]) -> float:
    return mean(*[table[method][s] for s in sets])


HARD, EASY, ALL_SETS = ["sketch_rubbing", "container"], ["texture"], ["sketch_rubbing", "container", "texture"]


def test_layout_order_is_stable():
    results, _ = report.read_results(results_table())
    layout = report.Layout.of(results)
    assert list(layout.families.items()) == [("posthoc", ["a", "b"]), ("clip", ["c"])]
    assert list(layout.groups.items()) == [("hard", ["container", "sketch_rubbing"]), ("easy", ["texture"])]
    assert list(report.per_set_table(results).columns.get_level_values("column").unique()) == [
        "container", "sketch_rubbing", "texture", "hard avg", "easy avg", "all avg"]


@pytest.mark.parametrize("scale, expected", [(0.01, "fraction"), (1.0, "percent")])
def test_scale_detection_and_per_set_values(scale, expected):
    results, detected = report.read_results(results_table(scale))
    assert detected == expected
    table = report.per_set_table(results)
    for m in FPR:
        for s in ALL_SETS:
            assert table.loc[(FAMILY[m], m), (s, "fpr95")] == pytest.approx(FPR[m][s])
            assert table.loc[(FAMILY[m], m), (s, "auroc")] == pytest.approx(AUC[m][s])
        for name, sets in (("hard avg", HARD), ("easy avg", EASY), ("all avg", ALL_SETS)):
            assert table.loc[(FAMILY[m], m), (name, "fpr95")] == pytest.approx(method_mean(FPR, m, sets))
            assert table.loc[(FAMILY[m], m), (name, "auroc")] == pytest.approx(method_mean(AUC, m, sets))
    assert results["fpr95_id"].iloc[0] == pytest.approx(20.0)


def test_family_means_by_hand():
    results, _ = report.read_results(results_table(0.01))
    families = report.family_table(results).set_index(["family", "group"])
    assert list(families.index) == [(f, g) for f in ("posthoc", "clip") for g in ("all", "hard", "easy", "average")]
    for metric, values in (("fpr95", FPR), ("auroc", AUC)):
        posthoc_hard = mean(method_mean(values, "a", HARD), method_mean(values, "b", HARD))
        posthoc_easy = mean(values["a"]["texture"], values["b"]["texture"])
        posthoc_all = mean(method_mean(values, "a", ALL_SETS), method_mean(values, "b", ALL_SETS))
        assert families.loc[("posthoc", "hard"), metric] == pytest.approx(posthoc_hard)
        assert families.loc[("posthoc", "easy"), metric] == pytest.approx(posthoc_easy)
        assert families.loc[("posthoc", "all"), metric] == pytest.approx(posthoc_all)
        assert families.loc[("posthoc", "average"), metric] == pytest.approx(mean(posthoc_hard, posthoc_easy))
        assert families.loc[("clip", "hard"), metric] == pytest.approx(method_mean(values, "c", HARD))
        assert families.loc[("clip", "all"), metric] == pytest.approx(method_mean(values, "c", ALL_SETS))
        assert families.loc[("clip", "average"), metric] == pytest.approx(
            mean(method_mean(values, "c", HARD), values["c"]["texture"]))
    # `average` weighs groups equally, `all` weighs sets equally: they differ here (2 hard sets, 1 easy).
    assert families.loc[("clip", "average"), "fpr95"] != pytest.approx(families.loc[("clip", "all"), "fpr95"])


def markdown_cells(text: str) -> dict[tuple[str, str], str]:
    """{(method, column header): cell} from the per-set markdown table."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    cells = {}
    for line in lines[2:]:
        row = [c.strip() for c in line.strip("|").split("|")]
        cells.update({(row[1], h): c for h, c in zip(header[2:], row[2:])})
    return cells


def test_best_and_second_best_marks_markdown():
    results, scale = report.read_results(results_table())
    text = report.to_markdown(report.per_set_view(report.per_set_table(results), report.Layout.of(results), scale))
    cells = markdown_cells(text)
    # sketch_rubbing: FPR best a (10), second b (20); AUROC best b (95), second a (90).
    assert cells[("a", "sketch_rubbing (hard)")] == "**10.00** / _90.00_"
    assert cells[("b", "sketch_rubbing (hard)")] == "_20.00_ / **95.00**"
    assert cells[("c", "sketch_rubbing (hard)")] == "60.00 / 70.00"
    # texture: FPR best b (5), second c (40); AUROC best c (88), second a (70).
    assert cells[("b", "texture (easy)")] == "**5.00** / 60.00"
    assert cells[("c", "texture (easy)")] == "_40.00_ / **88.00**"
    # hard avg FPR a 20, b 30, c 35; AUROC a 85, b 90, c 84.5.
    assert cells[("a", "hard avg")] == "**20.00** / _85.00_"
    assert cells[("c", "hard avg")] == "35.00 / 84.50"
    # all avg AUROC: a 80, b 80 tie for second behind c 85.67; FPR b 21.67 best, a 30 second.
    assert cells[("a", "all avg")] == "_30.00_ / _80.00_"
    assert cells[("b", "all avg")] == "**21.67** / _80.00_"
    assert cells[("c", "all avg")] == "36.67 / **85.67**"
    assert "Input metrics were in percent" in text


def test_latex_marks_and_escaping():
    results, scale = report.read_results(results_table(0.01))
    text = report.to_latex(report.per_set_view(report.per_set_table(results), report.Layout.of(results), scale))
    assert "sketch\\_rubbing" in text and "sketch_rubbing" not in text
    row_a = next(line for line in text.splitlines() if line.startswith("posthoc & a &"))
    cells = [c.strip() for c in row_a.removesuffix("\\\\").split("&")]
    # columns: container, sketch_rubbing, texture, hard, easy, all
    assert cells[2] == "\\underline{30.00} / 80.00"
    assert cells[3] == "\\textbf{10.00} / \\underline{90.00}"
    assert "converted to percent" in text
    assert text.count("\\begin{tabular}") == 1 and text.rstrip().endswith("\\end{tabular}")


def test_missing_set_leaves_averages_empty():
    frame = results_table()
    frame = frame[~((frame["method"] == "c") & (frame["ood_set"] == "texture"))]
    results, scale = report.read_results(frame)
    table = report.per_set_table(results)
    assert np.isnan(table.loc[("clip", "c"), ("easy avg", "fpr95")])
    assert np.isnan(table.loc[("clip", "c"), ("all avg", "auroc")])
    assert table.loc[("clip", "c"), ("hard avg", "fpr95")] == pytest.approx(method_mean(FPR, "c", HARD))
    cells = markdown_cells(report.to_markdown(report.per_set_view(table, report.Layout.of(results), scale)))
    assert cells[("c", "texture (easy)")] == "– / –"
    assert cells[("b", "texture (easy)")] == "**5.00** / _60.00_"  # only a and b left: AUROC a 70 > b 60
    families = report.family_table(results).set_index(["family", "group"])
    assert np.isnan(families.loc[("clip", "easy"), "fpr95"]) and np.isnan(families.loc[("clip", "average"), "fpr95"])


def test_sets_without_group_fall_in_other():
    frame = results_table()
    frame["group"] = frame["group"].astype(object)
    frame.loc[frame["ood_set"] == "texture", "group"] = None
    results, _ = report.read_results(frame)
    assert list(report.Layout.of(results).groups) == ["hard", report.GROUP_MISSING]
    scores = scores_table().assign(group=lambda f: f["group"].where(f["ood_set"] != "texture", ""))
    assert set(report.read_scores(scores)["group"]) == {"id", "hard", report.GROUP_MISSING}


def test_input_errors_name_the_problem(tmp_path):
    path = tmp_path / "results.csv"
    results_table().drop(columns=["fpr95"]).to_csv(path, index=False)
    with pytest.raises(ValueError, match=r"results\.csv.*fpr95"):
        report.read_results(path)
    with pytest.raises(ValueError, match="several rows"):
        report.read_results(pd.concat([results_table(), results_table().iloc[:1]]))
    frame, _ = report.read_results(results_table())
    with pytest.raises(ValueError, match=r"unknown method\(s\) \['knn'\]"):
        report.select_methods(frame, ["a", "knn"])
    with pytest.raises(ValueError, match=r"group name\(s\) \['all'\] are reserved"):
        report.read_results(results_table().assign(group="all"))
    with pytest.raises(ValueError, match=r"\['hard avg'\] clash"):
        report.read_results(results_table().replace({"ood_set": {"texture": "hard avg"}}))
    with pytest.raises(ValueError, match="outside"):
        report.read_results(results_table().assign(auroc=150.0))


def test_render_summary():
    text = report.render_summary(results_table(0.01), methods=["c", "a"])
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()
            if line.startswith("| a ") or line.startswith("| c ")}
    assert set(rows) == {"a", "c"}
    assert rows["a"][2:] == [f"{method_mean(FPR, 'a', s):.2f} / {method_mean(AUC, 'a', s):.2f}"
                             for s in (ALL_SETS, HARD, EASY)]
    assert rows["c"][2] == f"{method_mean(FPR, 'c', ALL_SETS):.2f} / {method_mean(AUC, 'c', ALL_SETS):.2f}"
    assert "converted to percent" in text


def transfer_table() -> pd.DataFrame:
    return pd.DataFrame([
        {"method": "a", "source": "local", "target": "field", "tpr": 0.95, "threshold": 0.123456, "precision": 0.8,
         "recall": 0.5, "id_kept": 0.95, "tp": 20, "fp": 5, "n_id": 100, "n_ood": 40, "species_detected": 0.75},
        {"method": "b", "source": "local", "target": "field", "tpr": 0.95, "threshold": -2.5, "precision": float("nan"),
         "recall": 0.0, "id_kept": 1.0, "tp": 0, "fp": 0, "n_id": 100, "n_ood": 40, "species_detected": float("nan")},
    ])


def test_threshold_transfer_markdown():
    lines = report.render_threshold_transfer(transfer_table()).splitlines()
    header = [c.strip() for c in lines[2].strip("|").split("|")]
    # species_detected is a share of the novel-species IMAGES (detectors.harness.results), labelled as such
    assert header == ["method", "source", "target", "tpr", "threshold", "precision", "recall", "id_kept", "tp", "fp",
                      "n_id", "n_ood", "novel-species images flagged"]
    row_a = [c.strip() for c in lines[4].strip("|").split("|")]
    row_b = [c.strip() for c in lines[5].strip("|").split("|")]
    assert row_a == ["a", "local", "field", "95.00", "0.1235", "80.00", "50.00", "95.00", "20", "5", "100", "40",
                     "75.00"]
    assert row_b[5] == "–" and row_b[7] == "100.00" and row_b[-1] == "–"


def scores_table() -> pd.DataFrame:
    rng = np.random.default_rng(0)
    rows = []
    for m in FAMILY:
        rows += [{"method": m, "family": FAMILY[m], "role": "id", "ood_set": "id", "group": "id", "index": i,
                  "score": rng.normal(1.0)} for i in range(60)]
        for s, g in SETS.items():
            rows += [{"method": m, "family": FAMILY[m], "role": "ood", "ood_set": s, "group": g, "index": i,
                      "score": rng.normal(-1.0)} for i in range(20)]
    return pd.DataFrame(rows)


def assert_png(path: Path) -> None:
    with Image.open(path) as image:
        assert image.format == "PNG" and image.width > 100 and image.height > 100


def test_write_report_files_parse_back(tmp_path):
    results = results_table(0.01)
    paths = report.write_report(results, tmp_path / "out", scores=scores_table(), threshold_transfer=transfer_table())
    written = {p.name: p for p in paths}
    tables = {f"{t}.{x}" for t in ("per_set", "table3", "sb_table4")
              for x in ("md", "tex", "csv")} | {"families.md", "families.csv"}
    names = tables | {"fpr95_by_method.png", "score_densities.png", "threshold_transfer.md", "index.html",
                      "roc.png", "warnings.md"}
    assert set(written) == names and all(p.is_file() for p in written.values())
    percent, _ = report.read_results(results)
    table = report.per_set_table(percent)
    back = pd.read_csv(written["per_set.csv"])
    assert list(back["method"]) == ["a", "b", "c"] and list(back["family"]) == ["posthoc", "posthoc", "clip"]
    for column, metric in table.columns:
        np.testing.assert_allclose(back[f"{column}/{metric}"].to_numpy(), table[(column, metric)].to_numpy(),
                                   rtol=1e-12)
    families = pd.read_csv(written["families.csv"])
    expected = report.family_table(percent)
    assert list(families.columns) == ["family", "group", "fpr95", "auroc"]
    pd.testing.assert_frame_equal(families, expected, check_dtype=False, rtol=1e-12)
    for name in names - tables - {"threshold_transfer.md", "index.html", "warnings.md"}:
        assert_png(written[name])


def test_cli_finds_companion_files(tmp_path, capsys):
    folder = tmp_path / "run"
    folder.mkdir()
    results_table().to_parquet(folder / "results.parquet")
    scores_table().to_parquet(folder / "scores.parquet")
    transfer_table().to_csv(folder / "threshold_transfer.csv", index=False)
    cli = importlib.import_module("oodforge.commands.report")
    cli.main(["--results", str(folder / "results.parquet"), "--out", str(tmp_path / "out"), "--methods", "b,a"])
    out = tmp_path / "out"
    assert (out / "score_densities.png").is_file()
    assert (out / "threshold_transfer.md").read_text().count("| local |") == 2
    assert list(pd.read_csv(out / "per_set.csv")["method"]) == ["a", "b"]
    printed = capsys.readouterr().out
    assert "| a | posthoc |" in printed and "| c |" not in printed


# -- ShiftedBronzes Table 3 / Table 4 and the best-rule table, against pandas computed here ----------------------------
PAPER_SETS = {"sketch_rubbing": "hard", "transferred_bronze": "hard", "transferred_container": "hard",
              "container": "hard",
              "species": "easy", "imagenet_o": "easy", "inaturalist": "easy", "texture": "easy", "openimage_o": "easy"}
PAPER_METHODS = {"msp": "posthoc", "ebo": "posthoc", "vim": "posthoc", "gram": "posthoc", "opengan": "generative",
                 "diffguard": "generative", "clipn": "clip", "locoop": "clip", "idlike": "clip"}


def paper_results(seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = [{"method": m, "family": f, "ood_set": s, "group": g, "auroc": rng.uniform(50, 100),
             "fpr95": rng.uniform(0, 100), "aupr_in": 50.0, "aupr_out": 50.0, "n_id": 10, "n_ood": 10, "seconds": 1.0}
            for m, f in PAPER_METHODS.items() for s, g in PAPER_SETS.items()]
    return pd.DataFrame(rows).sample(frac=1.0, random_state=seed)  # row order must not matter


def test_table3_and_table4_against_plain_pandas_means(tmp_path):
    frame = paper_results()
    report.write_report(frame, tmp_path)
    table3 = pd.read_csv(tmp_path / "table3.csv").set_index("method")
    columns = list(table3.columns[1:])
    assert sorted(columns) == sorted(f"{s}/{m}" for s in PAPER_SETS for m in ("fpr95", "auroc"))
    # hard sets first
    assert {c.split("/")[0] for c in columns[:8]} == {s for s, g in PAPER_SETS.items() if g == "hard"}
    assert list(table3["family"].drop_duplicates()) == ["posthoc", "generative", "clip"]
    for row in frame.itertuples():
        assert table3.loc[row.method, f"{row.ood_set}/auroc"] == pytest.approx(row.auroc)
        assert table3.loc[row.method, f"{row.ood_set}/fpr95"] == pytest.approx(row.fpr95)

    table4 = pd.read_csv(tmp_path / "sb_table4.csv").set_index("family")
    assert list(table4.index) == ["posthoc", "generative", "clip"]
    # the paper: All | Hard | Easy
    assert list(table4.columns) == [f"{g}/{m}" for g in ("all", "hard", "easy") for m in ("fpr95", "auroc")]
    for family in ("posthoc", "generative", "clip"):
        rows = frame[frame["family"] == family]
        for group in ("hard", "easy", "all"):
            part = rows if group == "all" else rows[rows["group"] == group]
            per_method = part.groupby("method")[["fpr95", "auroc"]].mean()  # per method over the group's sets
            for metric in ("fpr95", "auroc"):
                assert table4.loc[family, f"{group}/{metric}"] == pytest.approx(per_method[metric].mean(), rel=1e-12)
    tex = (tmp_path / "sb_table4.tex").read_text()
    assert tex.count("\\begin{tabular}") == 1 and "generative &" in tex
    md = (tmp_path / "sb_table4.md").read_text()
    best_hard_auroc = table4["hard/auroc"].idxmax()
    assert f"| {best_hard_auroc} |" in md and f"/ **{table4.loc[best_hard_auroc, 'hard/auroc']:.2f}**" in md


def insect_results() -> pd.DataFrame:
    """Two training methods (bases) x three rules, on local / non_local / non_moth, plus a baseline without a base."""
    values = {("ce", "msp"): (80, 70, 60), ("ce", "ebo"): (85, 60, 90), ("ce", "vim"): (75, 95, 95),
              ("oe", "msp"): (70, 80, 80), ("oe", "ebo"): (70, 90, 70), ("oe", "vim"): (65, 99, 99)}
    rows = []
    for (base, rule), aurocs in values.items():
        for s, a in zip(("local", "non_local", "non_moth"), aurocs):
            rows.append({"method": f"{base}+{rule}", "family": "training", "ood_set": s,
                         "group": "near" if s == "local" else "far",
                         "auroc": a, "fpr95": 100 - a / 2, "aupr_in": 50.0, "aupr_out": 50.0, "n_id": 5, "n_ood": 5,
                         "seconds": 1.0, "base": base, "rule": rule})
    rows += [{"method": "knn", "family": "posthoc", "ood_set": s, "group": "near" if s == "local" else "far",
              "auroc": 99.0,
              "fpr95": 1.0, "aupr_in": 50.0, "aupr_out": 50.0, "n_id": 5, "n_ood": 5, "seconds": 1.0, "base": None,
              "rule": None} for s in ("local", "non_local", "non_moth")]
    return pd.DataFrame(rows)


def rule_selection() -> pd.DataFrame:
    """The runner's choice on validation: ce -> vim and oe -> msp (on local TEST AUROC ce would pick ebo, oe tie)."""
    rows = [("ce", r, r == "vim") for r in ("msp", "ebo", "vim")] + [("oe", r, r == "msp")
                                                                     for r in ("msp", "ebo", "vim")]
    return pd.DataFrame([{"base": b, "rule": r, "metric": "auroc", "value": 0.9 if chosen else 0.8,
                          "ood_val": "aux_val", "chosen": chosen} for b, r, chosen in rows])


def test_best_rule_follows_the_validation_choice(tmp_path):
    frame = insect_results()
    results, _ = report.read_results(frame)
    best = report.best_rule_table(results, report.read_rule_selection(rule_selection()))
    assert [i[:3] for i in best.index] == [("ce", "vim", "ce+vim"), ("oe", "msp", "oe+msp")]
    assert best.index[0][3] == "validation (aux_val): auroc 90.00"
    assert best.loc[("ce", "vim", "ce+vim", best.index[0][3]), ("local", "auroc")] == 75
    assert best.loc[("oe", "msp", "oe+msp", best.index[1][3]), ("non_local", "fpr95")] == pytest.approx(60)
    selection = tmp_path / "rule_selection.csv"
    rule_selection().to_csv(selection, index=False)
    report.write_report(frame, tmp_path, rule_selection=selection)
    back = pd.read_csv(tmp_path / "best_rule.csv")
    assert list(back[["base", "rule", "method"]].itertuples(index=False, name=None)) == [("ce", "vim", "ce+vim"),
                                                                                         ("oe", "msp", "oe+msp")]
    hand = frame.set_index(["method", "ood_set"])
    for _, row in back.iterrows():
        for s in ("local", "non_local", "non_moth"):
            assert row[f"{s}/auroc"] == hand.loc[(row["method"], s), "auroc"]
    assert "chosen on validation" in (tmp_path / "best_rule.md").read_text()


def test_best_rule_without_selection_picks_nothing_on_test(tmp_path):
    results, _ = report.read_results(insect_results())
    listed = report.best_rule_table(results)
    assert [i[2] for i in listed.index] == [f"{b}+{r}" for b in ("ce", "oe") for r in ("msp", "ebo", "vim")]
    assert {i[3] for i in listed.index} == {report.NOT_SELECTED}
    lines = []
    report.write_report(insect_results(), tmp_path, log=lines.append)
    assert "not selected on validation" in (tmp_path / "best_rule.md").read_text()
    assert any("not selected on validation" in line for line in lines)
    with pytest.raises(ValueError, match="lacks column"):
        report.best_rule_table(report.read_results(results_table())[0])
    bad = rule_selection().assign(chosen=True)
    with pytest.raises(ValueError, match="exactly one chosen"):
        report.read_rule_selection(bad)
    report.write_report(results_table(), tmp_path / "plain")  # no base / rule columns: no best-rule table
    assert not (tmp_path / "plain" / "best_rule.md").exists()
