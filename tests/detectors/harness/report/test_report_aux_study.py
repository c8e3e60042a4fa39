"""scripts/aux_study.py (Open-Insects Figure 4): deterministic, nested subsamples at a fixed image budget, one real
evaluation run per species count with a tiny trained classifier (OE, heads mode), reused on rerun, and the table
checked against scikit-learn on each run's scores.parquet."""
from __future__ import annotations

import contextlib
import importlib.util
import io
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import roc_auc_score

from detectors.harness.report.aux_study import subsample
from pipelines.data import read_manifest, write_manifest
from pipelines.errors import UserInputError

ROOT = Path(__file__).resolve().parents[4]


def _rows(species: int, per: int) -> list[dict]:
    return [{"file_name": f"s{s}/{i}.png", "split": "train", "role": "ood", "ood_set": "auxiliary", "group": None,
             "label": -1, "species": f"sp{s}", "aux_label": s} for s in range(species) for i in range(per)]


def test_subsample_is_deterministic_nested_and_on_budget():
    rows = _rows(10, 6)
    small, large = subsample(rows, 3, 12, seed=1), subsample(rows, 6, 12, seed=1)
    assert subsample(rows, 3, 12, seed=1) == small and len(small) == len(large) == 12
    assert {r["species"] for r in small} <= {r["species"] for r in large}  # a smaller count's species are kept
    assert sorted({r["aux_label"] for r in large}) == list(range(6))
    assert sorted(pd.Series([r["species"] for r in small]).value_counts()) == [4, 4, 4]
    odd = subsample(rows, 5, 13, seed=1)
    assert sorted(pd.Series([r["species"] for r in odd]).value_counts()) == [2, 2, 3, 3, 3]
    assert subsample(rows, 3, 12, seed=2) != small
    assert len(subsample(rows, 2, 100)) == 12  # a species with fewer images gives all it has
    with pytest.raises(UserInputError, match="has 10"):
        subsample(rows, 11, 100)
    with pytest.raises(UserInputError, match="cannot cover"):
        subsample(rows, 5, 4)


def _cli():
    module = importlib.import_module("oodforge.commands.aux_study")
    return module


@pytest.mark.slow
def test_aux_study_runs_each_count_and_reuses_finished_runs(digits, tmp_path, monkeypatch, capsys):
    import yaml

    id_dir, ood_dir, model = digits
    ood = read_manifest(ood_dir)
    aux = [{**r, "split": "train", "species": f"{r['ood_set']}_{i % 4}",
            "aux_label": i % 4 + 4 * (r["ood_set"] == "sketch")}
           for i, r in enumerate(ood.rows) if r["ood_set"] in ("sketch", "texture")]
    write_manifest(tmp_path / "aux", aux)
    (tmp_path / "aux" / "manifest_info.json").write_text(json.dumps({"image_root": str(ood_dir)}))
    config = tmp_path / "eval.yaml"
    config.write_text(yaml.safe_dump({"model": str(model), "id": str(id_dir),
                                      "ood": [{"manifest": str(ood_dir), "sets": ["digits_6_9"]}],
                                      "aux": {"manifest": str(tmp_path / "aux"), "split": "train"},
                                      "detectors": ["msp", {"name": "oe", "params": {"epochs": 1, "mode": "heads"}}],
                                      "out": str(tmp_path / "unused")}))
    args = ["--config", str(config), "--method", "oe", "--species", "2,6", "--budget", "12", "--out",
            str(tmp_path / "study")]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert _cli().main(args) == 0
    table = pd.read_csv(tmp_path / "study" / "aux_study.csv")
    assert list(table["species"]) == [2, 6] and list(table["images"]) == [12, 12]
    for count in (2, 6):
        run = tmp_path / "study" / f"species_{count}"
        sub = read_manifest(run / "aux")
        assert len(sub) == 12 and len({r["aux_label"] for r in sub.rows}) == count
        assert all(sub.path(r).is_file() for r in sub.rows)  # the images stay where they are
        results = pd.read_csv(run / "results.csv")
        assert set(results["method"]) == {"oe"}  # only the studied method ran
        scores = pd.read_parquet(run / "scores.parquet")
        own = scores[scores["method"] == "oe"]
        ids, ood_scores = own.loc[own["role"] == "id", "score"], own.loc[own["role"] == "ood", "score"]
        expected = 100 * roc_auc_score(np.r_[np.ones(len(ids)), np.zeros(len(ood_scores))], np.r_[ids, ood_scores])
        assert table.loc[table["species"] == count, "auroc"].iloc[0] == pytest.approx(expected)
    assert (tmp_path / "study" / "aux_study.png").is_file()
    again = io.StringIO()
    with contextlib.redirect_stdout(again):
        assert _cli().main(args) == 0
    assert again.getvalue().count("finished run reused") == 2
    _dry_run_failures_and_bad_configs(args, tmp_path)

    # the Open-Insects layout from these real runs (one per count, as regions), cell by cell against the scores
    cli = importlib.import_module("oodforge.commands.report")
    runs = {c: tmp_path / "study" / f"species_{c}" for c in (2, 6)}
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli.main(["--layout", "open-insects", "--figures", "none", "--out", str(tmp_path / "oi"),
                         "--results", *(f"aux{c}={r / 'results.csv'}" for c, r in runs.items())]) == 0
    table2 = pd.read_csv(tmp_path / "oi" / "table2.csv").set_index("row")
    assert list(table2.index) == ["oe"] and table2.loc["oe", "category"] == "Training with auxiliary data"
    for count, run in runs.items():
        auroc = table.loc[table["species"] == count, "auroc"].iloc[0]  # sklearn-checked above
        assert table2.loc["oe", f"aux{count}/digits_6_9"] == pytest.approx(auroc)
        acc = pd.read_csv(run / "results.csv")["id_acc"].iloc[0]
        assert table2.loc["oe", f"aux{count}/id_acc"] == pytest.approx(100 * acc)


def _dry_run_failures_and_bad_configs(args: list[str], tmp_path: Path) -> None:
    """On the finished study: a dry run states each count and writes nothing; a count whose evaluation fails is
    recorded while the others go on (exit 1); a bad config or count is one line before any run (exit 2)."""
    import subprocess

    from pipelines.cli import run_main

    study = tmp_path / "study"
    before = {p: p.stat().st_mtime_ns for p in study.rglob("*")}
    with_three = [*args[:args.index("--species") + 1], "2,3,6", *args[args.index("--species") + 2:]]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert run_main(_cli().main, [*with_three, "--dry-run"]) == 0
    lines = printed.getvalue().splitlines()
    assert lines[0] == f"species 2: 12 images, 2 species -> {study / 'species_2'} (finished run reused)"
    assert lines[1] == f"species 3: 12 images, 3 species -> {study / 'species_3'} (new)"
    assert {p: p.stat().st_mtime_ns for p in study.rglob("*")} == before and not (tmp_path / "study" / "check").exists()

    real = subprocess.run

    def species_3_fails(command, *a, **k):
        if f"out={study / 'species_3'}" in command:
            return subprocess.CompletedProcess(command, 1)
        return real(command, *a, **k)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(subprocess, "run", species_3_fails)
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
            assert run_main(_cli().main, with_three) == 1
    assert err.getvalue().strip().splitlines()[-1].startswith("error: the evaluation of 1 count(s) failed (3 species)")
    assert json.loads((study / "aux_study_failures.json").read_text()) == {"3": "exit 1"}
    assert sorted(set(pd.read_csv(study / "aux_study.csv")["species"])) == [2, 6]  # the others are in the table

    for extra, message in ((["detectors=[{name: oe, params: {epochs: 0}}]"],
                            "detectors[0].params.epochs: oe: epochs must be >= 1"),
                           (["--species", "2,99"], "99 species asked for; the auxiliary set has 8")):
        out = tmp_path / "refused"
        argv = [*args[:-1], str(out), *extra]
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
            assert run_main(_cli().main, argv) == 2
        line = err.getvalue().strip()
        assert line.startswith("error: ") and "\n" not in line and message in line, line
        assert not out.exists()  # refused before any run
