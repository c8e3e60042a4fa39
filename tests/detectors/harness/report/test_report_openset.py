"""`oodforge report --openset`: the Open-Insect evaluator's ood.csv columns per run (openset.{md,csv}), the runner's
values in percent in the reference's column order; older tables without the columns leave the section out with a log
line; Open-Insects' Table 2 is the same file with and without the flag."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from test_report_golden import GOLDEN, _insect_run

from detectors.harness.openset import ood_csv_table
from detectors.harness.report import write_open_insects, write_report
from detectors.harness.results import RESULT_COLUMNS
from detectors.metrics import evaluate
from detectors.openset_metrics import OOD_CSV_COLUMNS, Predictions, reference_metrics
from oodforge.commands import report

REFERENCE_ORDER = ["TNR@10", "TNR@20", "AUROC", "AUPR", "FPR", "ACC", "AUOSCR", "OpenAUC", "OSA", "OOSA"]
"""example/ood.csv's header in RolnickLab/Open-Insect (after its unnamed index column)."""


def _results(path, with_openset=True):
    rng = np.random.default_rng(3)
    rows = []
    labels = rng.integers(0, 3, 30)
    pred = np.where(rng.random(30) < 0.8, labels, 0)
    for method in ("msp", "knn"):
        ids = rng.normal(1, 1, 30)
        for ood_set in ("local", "non-local"):
            ood = rng.normal(0, 1, 20)
            row = {"method": method, "family": "posthoc", "ood_set": ood_set, "group": "near", **evaluate(ids, ood),
                   "id_acc": float(np.mean(pred == labels)), "n_id": 30, "n_ood": 20, "seconds": 1.0, "params": "{}"}
            if with_openset:
                row |= reference_metrics(ids, ood, Predictions(pred, labels), theta=float(np.median(ids)))
            rows.append(row)
    frame = pd.DataFrame(rows, columns=RESULT_COLUMNS if with_openset else None)
    frame.to_csv(path, index=False)
    return frame


def test_ood_csv_table_is_the_reference_shape(tmp_path):
    frame = _results(tmp_path / "results.csv")
    table = ood_csv_table(frame)
    assert list(table.columns) == ["method", "ood_set", *REFERENCE_ORDER] == ["method", "ood_set", *OOD_CSV_COLUMNS]
    for label, column in OOD_CSV_COLUMNS.items():
        np.testing.assert_allclose(table[label], np.round(frame[column] * 100, 2))
    assert table.loc[0, "ACC"] == pytest.approx(round(frame.loc[0, "id_acc"] * 100, 2))


def test_report_openset_flag_writes_the_section(tmp_path, capsys):
    frame = _results(tmp_path / "results.csv")
    assert report.main(["--results", str(tmp_path / "results.csv"), "--out", str(tmp_path / "report"),
                        "--figures", "none", "--openset"]) == 0
    written = pd.read_csv(tmp_path / "report" / "openset.csv")
    pd.testing.assert_frame_equal(written, ood_csv_table(frame), check_dtype=False)
    markdown = (tmp_path / "report" / "openset.md").read_text()
    assert f"| Method | OOD set | {' | '.join(REFERENCE_ORDER)} |" in markdown
    assert "Open-set metrics" in (tmp_path / "report" / "index.html").read_text()
    write_report(tmp_path / "results.csv", tmp_path / "plain", figures="none")
    assert not (tmp_path / "plain" / "openset.csv").exists()  # only where the user asks


def test_an_older_table_leaves_the_section_out(tmp_path):
    _results(tmp_path / "results.csv", with_openset=False)
    lines = []
    write_report(tmp_path / "results.csv", tmp_path / "report", figures="none", openset=True, log=lines.append)
    assert not (tmp_path / "report" / "openset.csv").exists()
    assert any("no open-set column" in line for line in lines)


@pytest.mark.slow
def test_open_insects_table2_unchanged_with_openset(tmp_path):
    scores = pd.read_csv(GOLDEN / "open_insects_scores.csv", keep_default_na=False)
    runs = {r: _insect_run(tmp_path / "runs", r, part) for r, part in scores.groupby("run", sort=False)}
    for folder in runs.values():  # give the rows open-set columns, as a run writes them
        frame = pd.read_csv(folder / "results.csv")
        frame["tnr10"], frame["auoscr"] = 0.5, frame["id_acc"] * 0.9
        frame.to_csv(folder / "results.csv", index=False)
    specs = [(r, p / "results.csv") for r, p in runs.items()]
    write_open_insects(specs, tmp_path / "plain", figures="none")
    write_open_insects(specs, tmp_path / "openset", figures="none", openset=True)
    for name in ("table2.md", "table2.tex", "table2.csv"):
        assert (tmp_path / "openset" / name).read_text() == (tmp_path / "plain" / name).read_text(), name
    for region in runs:
        table = pd.read_csv(tmp_path / "openset" / f"openset_{region}.csv")
        assert list(table.columns) == ["method", "ood_set", *REFERENCE_ORDER]
        assert set(table["TNR@10"]) == {50.0} and table["OOSA"].isna().all()
