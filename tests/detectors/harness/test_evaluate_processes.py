"""`torchrun --nproc_per_node 2 -m oodforge evaluate` on the CPU (gloo): each unit runs on one rank, the main process
writes what one process writes (bitwise), sharded fits stay within float tolerance, and a rank killed mid-run leaves
no detector failure behind and the rerun resumes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from runner_helpers import eval_config

from detectors.harness.evaluate import RANKS_FOLDER

ROOT = Path(__file__).parents[3]
METRICS = ["auroc", "fpr95", "fpr95_id", "aupr_in", "aupr_out", "n_id", "n_ood", "id_acc"]


def _evaluate(config: dict, path: Path, processes: int = 2, env: dict | None = None) -> subprocess.CompletedProcess:
    """`oodforge evaluate` on `config` in `processes` processes (1: plain python), one BLAS thread each (as torchrun
    gives them), so the kernels and their sums are the same in both runs."""
    path.write_text(yaml.safe_dump(config))
    launch = ([str(Path(sys.executable).with_name("torchrun")), "--standalone", "--nproc_per_node", str(processes)]
              if processes > 1 else [sys.executable])
    here = str(Path(__file__).parent)  # runner_plugins
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), here, os.environ.get("PYTHONPATH", "")]),
               "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([*launch, "-m", "oodforge", "evaluate", "--config", str(path)], capture_output=True,
                          text=True, timeout=600, cwd=ROOT, env=environ)


def _config(digits, out: Path, **extra) -> dict:
    return eval_config(digits, out, ood=[{"manifest": str(digits[1]), "sets": ["digits_6_9", "texture"]}],
                       plugins=["runner_plugins"], **extra)


@pytest.mark.slow
def test_units_are_divided_and_the_outputs_are_one_process_outputs(digits, tmp_path):
    detectors = ["msp", "knn", "odin", "mds", "vim", "react", "she", "ebo", "plugin_fail"]
    config = _config(digits, tmp_path / "two", detectors=detectors)
    for name, processes in (("two", 2), ("one", 1)):
        done = _evaluate({**config, "out": str(tmp_path / name)}, tmp_path / f"{name}.yaml", processes)
        assert done.returncode == 0, done.stderr[-3000:]
    one, two = tmp_path / "one", tmp_path / "two"

    marks = [json.loads((two / "units" / RANKS_FOLDER / f"process-{r:03d}.json").read_text()) for r in (0, 1)]
    assert marks[0]["units"] and marks[1]["units"]  # both ranks ran units
    assert sorted(marks[0]["units"] + marks[1]["units"]) == sorted(detectors)  # each unit on one rank
    assert not set(marks[0]["units"]) & set(marks[1]["units"])

    rows_one, rows_two = (pd.read_csv(f / "results.csv").drop(columns=["seconds"]) for f in (one, two))
    pd.testing.assert_frame_equal(rows_two, rows_one, check_exact=True)  # the same rows, in the same order
    pd.testing.assert_frame_equal(pd.read_parquet(two / "scores.parquet"), pd.read_parquet(one / "scores.parquet"),
                                  check_exact=True)
    failed_one, failed_two = (json.loads((f / "failures.json").read_text())["detectors"] for f in (one, two))
    assert [f["detector"] for f in failed_two] == [f["detector"] for f in failed_one] == ["plugin_fail"]
    assert failed_two[0]["exception"] == failed_one[0]["exception"]


@pytest.mark.slow
def test_sharded_fits_stay_within_float_tolerance(digits, tmp_path):
    """`shard_fit_rows: 1` shards every sum-statistics fit across the two processes: only the order of the float64
    sums changes, so scores and metrics agree to 1e-6 relative; ViM (float32 products, as the reference) is never
    sharded and gives one process's bits."""
    config = _config(digits, tmp_path / "two", detectors=["mds", "vim", "react", "she", "dice"], shard_fit_rows=1)
    for name, processes in (("two", 2), ("one", 1)):
        done = _evaluate({**config, "out": str(tmp_path / name)}, tmp_path / f"{name}.yaml", processes)
        assert done.returncode == 0, done.stderr[-3000:]
    one, two = (pd.read_csv(tmp_path / name / "results.csv") for name in ("one", "two"))
    np.testing.assert_allclose(two[METRICS[:5]].to_numpy(float), one[METRICS[:5]].to_numpy(float), rtol=1e-6)
    s1, s2 = (pd.read_parquet(tmp_path / f / "scores.parquet") for f in ("one", "two"))
    np.testing.assert_allclose(s2["score"].to_numpy(), s1["score"].to_numpy(), rtol=1e-6)
    vim = s1["method"] == "vim"
    np.testing.assert_array_equal(s2["score"][vim].to_numpy(), s1["score"][vim].to_numpy())


@pytest.mark.slow
def test_a_killed_rank_is_no_detector_failure_and_the_rerun_resumes(digits, tmp_path):
    """Rank 1 is SIGKILLed in its unit's fit: the launch ends with an error, no unit is recorded as failed; the same
    command then runs only that unit (the main rank's finished unit is reused) and writes the full table."""
    from detectors.harness.distribute import assign
    from detectors.harness.plan import make_plan

    config = _config(digits, tmp_path / "run", detectors=["msp", "plugin_die"])
    plan = make_plan(config)
    assert assign(plan.units, {"msp", "plugin_die"}, 2, 0) == {"msp": 0, "plugin_die": 1}
    env = {"PLUGIN_DIE": str(tmp_path), "PLUGIN_DIE_AFTER": str(tmp_path / "run" / "units" / "msp" / "unit.json")}
    first = _evaluate(config, tmp_path / "run.yaml", 2, env)
    assert first.returncode != 0
    assert (tmp_path / "died").read_text() == "1"
    assert not (tmp_path / "run" / "units" / "plugin_die" / "failure.json").exists()
    assert (tmp_path / "run" / "units" / "msp" / "unit.json").is_file()  # the main rank's unit was kept

    again = _evaluate(config, tmp_path / "run.yaml", 2, env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed: 1 of 2 units up to date" in again.stderr + again.stdout
    failures = json.loads((tmp_path / "run" / "failures.json").read_text())
    assert failures["detectors"] == []
    assert set(pd.read_csv(tmp_path / "run" / "results.csv")["method"]) == {"msp", "plugin_die"}


def _small_manifests(digits, root: Path) -> tuple[Path, Path]:
    """(ID manifest: every train and test row, 1 val row; OOD manifest: 1 texture image) copied from the digits sets
    under `root`: two sets with fewer rows than processes."""
    import shutil

    from pipelines.data import read_manifest, write_manifest

    wanted = {"val": 1, "test": 10**9}
    out = []
    for source, name, keep in ((digits[0], "id", lambda r, seen: r["split"] == "train" or seen < wanted[r["split"]]),
                               (digits[1], "ood", lambda r, seen: r["ood_set"] == "texture" and seen < 1)):
        rows, seen = [], {}
        for row in read_manifest(source).rows:
            group = row["split"] if name == "id" else "ood"
            if keep(row, seen.get(group, 0)):
                seen[group] = seen.get(group, 0) + 1
                rows.append(dict(row))
                (root / name / row["file_name"]).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(Path(source) / row["file_name"], root / name / row["file_name"])
        write_manifest(root / name, rows)
        out.append(root / name)
    return out[0], out[1]


@pytest.mark.slow
def test_sets_smaller_than_the_processes_give_the_one_process_outputs(digits, tmp_path):
    """An OOD set of one image and an ID val set of one row (rank 1's shares of their extraction, and of the val set
    in a sharded fit, are empty): units dealt to ranks give one process's outputs bit for bit; sharded fits
    (`shard_fit_rows: 1`; ReAct's percentile on the one val row) agree to float tolerance."""
    id_dir, ood_dir = _small_manifests(digits, tmp_path / "data")
    base = {"model": str(digits[2]), "id": str(id_dir), "ood": [{"manifest": str(ood_dir)}], "plugins": []}
    for extra, exact in (({"detectors": ["msp", "odin", "knn", "mds"]}, True),
                         ({"detectors": ["mds", "react", "she", "dice", "nci", "neco"], "shard_fit_rows": 1}, False)):
        for name, processes in (("two", 2), ("one", 1)):
            config = {**base, **extra, "out": str(tmp_path / name)}
            done = _evaluate(config, tmp_path / f"{name}.yaml", processes)
            assert done.returncode == 0, done.stderr[-3000:]
            assert json.loads((tmp_path / name / "failures.json").read_text())["detectors"] == []
        rows_one, rows_two = (pd.read_csv(tmp_path / f / "results.csv").drop(columns=["seconds"])
                              for f in ("one", "two"))
        scores_one, scores_two = (pd.read_parquet(tmp_path / f / "scores.parquet") for f in ("one", "two"))
        n_test = int((scores_two["role"] == "id").sum()) // len(extra["detectors"])
        assert len(scores_two) == len(extra["detectors"]) * (n_test + 1)  # the ID test rows and the one OOD image
        assert (scores_two["role"] == "ood").sum() == len(extra["detectors"])
        if exact:
            pd.testing.assert_frame_equal(rows_two, rows_one, check_exact=True)
            pd.testing.assert_frame_equal(scores_two, scores_one, check_exact=True)
        else:
            np.testing.assert_allclose(scores_two["score"].to_numpy(), scores_one["score"].to_numpy(), rtol=1e-6)


@pytest.mark.slow
def test_a_unit_failing_on_one_rank_fails_on_every_rank_at_once(digits, tmp_path):
    """A sharded fit raising on rank 1 only, while rank 0 waits in the fit's collective: rank 0 meets the failure
    there, the unit is recorded as failed once (rank 1's error), and the run goes on to the next unit and ends long
    before the process group's timeout (30 minutes)."""
    import time

    config = _config(digits, tmp_path / "run", detectors=["plugin_shard_fail", "mds", "msp"], shard_fit_rows=1)
    start = time.monotonic()
    done = _evaluate(config, tmp_path / "run.yaml", 2)
    assert time.monotonic() - start < 180
    assert done.returncode == 0, done.stderr[-3000:]
    failed = json.loads((tmp_path / "run" / "failures.json").read_text())["detectors"]
    assert [f["detector"] for f in failed] == ["plugin_shard_fail"]
    assert "plugin_shard_fail fails on rank 1" in failed[0]["exception"]
    assert set(pd.read_csv(tmp_path / "run" / "results.csv")["method"]) == {"mds", "msp"}


def test_a_lost_peer_in_a_unit_run_together_is_no_detector_failure(digits, tmp_path):
    """A unit run on every rank together whose collective fails for a lost peer raises `PeerLost` (one line naming
    the peer) and records nothing; a unit's own error is still recorded."""
    from detectors.harness.evaluate import Runner
    from detectors.harness.execute import UnitContext, execute
    from pipelines.collectives import PeerLost

    runner = Runner(_config(digits, tmp_path / "run", detectors=["msp"]))
    unit = runner.plan.units[0]
    together = UnitContext(runner.store, together=True, writes=True)

    def lost():
        raise RuntimeError("[../gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:29511")

    failures: dict = {}
    with pytest.raises(PeerLost, match=r"127.0.0.1:29511 stopped during unit msp"):
        execute(unit, lost, runner.plan, together, failures)
    assert failures == {} and not (tmp_path / "run" / "units" / "msp" / "failure.json").exists()

    assert execute(unit, lambda: 1 / 0, runner.plan, together, failures) == (None, None)
    assert failures["msp"]["exception"] == "ZeroDivisionError: division by zero"


@pytest.mark.slow
def test_accelerate_launch_gives_the_torchrun_outputs(digits, tmp_path):
    """`accelerate launch --multi_gpu --num_processes 2` on a CPU-only machine starts two gloo processes (the command
    the README names; `--cpu` would start one) and writes the outputs torchrun writes."""
    config = _config(digits, tmp_path / "acc", detectors=["msp", "knn", "mds", "odin"])
    path = tmp_path / "acc.yaml"
    path.write_text(yaml.safe_dump(config))
    here = str(Path(__file__).parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), here, os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    accelerate = Path(sys.executable).with_name("accelerate")
    done = subprocess.run([str(accelerate), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                           "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "oodforge", "evaluate",
                           "--config", str(path)], capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "on 2 process(es)" in done.stderr + done.stdout
    done = _evaluate({**config, "out": str(tmp_path / "tr")}, tmp_path / "tr.yaml", 2)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [pd.read_csv(tmp_path / f / "results.csv").drop(columns=["seconds"]) for f in ("acc", "tr")]
    pd.testing.assert_frame_equal(rows[0], rows[1], check_exact=True)
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "acc" / "scores.parquet"),
                                  pd.read_parquet(tmp_path / "tr" / "scores.parquet"), check_exact=True)
