"""detectors.report on a hand-made results table whose averages and best/second-best marks are worked out by hand."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from detectors import report

ROOT = Path(__file__).resolve().parents[2]
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
    text = report.render_per_set_markdown(report.per_set_table(results), report.Layout.of(results), scale)
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
    text = report.render_per_set_latex(report.per_set_table(results), report.Layout.of(results), scale)
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
    cells = markdown_cells(report.render_per_set_markdown(table, report.Layout.of(results), scale))
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
    assert rows["a"][2:] == [f"{method_mean(FPR, 'a', s):.2f} / {method_mean(AUC, 'a', s):.2f}" for s in (ALL_SETS, HARD, EASY)]
    assert rows["c"][2] == f"{method_mean(FPR, 'c', ALL_SETS):.2f} / {method_mean(AUC, 'c', ALL_SETS):.2f}"
    assert "converted to percent" in text


def transfer_table() -> pd.DataFrame:
    return pd.DataFrame([
        {"method": "a", "source": "local", "target": "field", "tpr": 0.95, "threshold": 0.123456, "precision": 0.8, "recall": 0.5,
         "id_kept": 0.95, "tp": 20, "fp": 5, "n_id": 100, "n_ood": 40, "species_detected": 0.75},
        {"method": "b", "source": "local", "target": "field", "tpr": 0.95, "threshold": -2.5, "precision": float("nan"), "recall": 0.0,
         "id_kept": 1.0, "tp": 0, "fp": 0, "n_id": 100, "n_ood": 40, "species_detected": float("nan")},
    ])


def test_threshold_transfer_markdown():
    lines = report.render_threshold_transfer(transfer_table()).splitlines()
    header = [c.strip() for c in lines[2].strip("|").split("|")]
    assert header == ["method", "source", "target", "tpr", "threshold", "precision", "recall", "id_kept", "tp", "fp",
                      "n_id", "n_ood", "species_detected"]
    row_a = [c.strip() for c in lines[4].strip("|").split("|")]
    row_b = [c.strip() for c in lines[5].strip("|").split("|")]
    assert row_a == ["a", "local", "field", "95.00", "0.1235", "80.00", "50.00", "95.00", "20", "5", "100", "40", "75.00"]
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
    names = {"per_set.md", "per_set.tex", "per_set.csv", "families.md", "families.csv", "fpr95_by_method.png",
             "score_density_a.png", "score_density_b.png", "score_density_c.png", "threshold_transfer.md"}
    assert set(written) == names and all(p.is_file() for p in written.values())
    percent, _ = report.read_results(results)
    table = report.per_set_table(percent)
    back = pd.read_csv(written["per_set.csv"])
    assert list(back["method"]) == ["a", "b", "c"] and list(back["family"]) == ["posthoc", "posthoc", "clip"]
    for column, metric in table.columns:
        np.testing.assert_allclose(back[f"{column}/{metric}"].to_numpy(), table[(column, metric)].to_numpy(), rtol=1e-12)
    families = pd.read_csv(written["families.csv"])
    expected = report.family_table(percent)
    assert list(families.columns) == ["family", "group", "fpr95", "auroc"]
    pd.testing.assert_frame_equal(families, expected, check_dtype=False, rtol=1e-12)
    for name in names - {"per_set.md", "per_set.tex", "per_set.csv", "families.md", "families.csv", "threshold_transfer.md"}:
        assert_png(written[name])


def test_cli_finds_companion_files(tmp_path, capsys):
    folder = tmp_path / "run"
    folder.mkdir()
    results_table().to_parquet(folder / "results.parquet")
    scores_table().to_parquet(folder / "scores.parquet")
    transfer_table().to_csv(folder / "threshold_transfer.csv", index=False)
    spec = importlib.util.spec_from_file_location("report_cli", ROOT / "scripts" / "report.py")
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    cli.main(["--results", str(folder / "results.parquet"), "--out", str(tmp_path / "out"), "--methods", "b,a"])
    out = tmp_path / "out"
    assert sorted(p.name for p in out.glob("score_density_*.png")) == ["score_density_a.png", "score_density_b.png"]
    assert (out / "threshold_transfer.md").read_text().count("| local |") == 2
    assert list(pd.read_csv(out / "per_set.csv")["method"]) == ["a", "b"]
    printed = capsys.readouterr().out
    assert "| a | posthoc |" in printed and "| c |" not in printed
