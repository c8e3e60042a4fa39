"""evaluate.py killed (SIGKILL) in the middle of an atomic write: the rerun deletes the temp file that kill left, and
only that, and completes the run."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from helpers.killed import kill_during_write

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "evaluate.py"


def _env() -> dict[str, str]:
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    return {**{k: v for k, v in os.environ.items() if k not in drop}, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


@pytest.mark.slow
@pytest.mark.parametrize("pattern", ["*.safetensors", "rows.csv"])  # a feature cache, a unit's rows
def test_a_kill_during_a_write_leaves_no_temp_file_after_the_rerun(digits, tmp_path, pattern):
    id_dir, ood_dir, model = digits
    out = tmp_path / "run"
    config = tmp_path / "eval.yaml"
    config.write_text(yaml.safe_dump({"model": str(model), "id": str(id_dir), "ood": [{"manifest": str(ood_dir)}],
                                      "out": str(out), "detectors": ["msp", "ebo"]}))
    temp = kill_during_write("evaluate", ["--config", config], pattern, _env(), tmp_path / "kill")
    assert out in temp.parents
    mine = out / ".keep.txt.ab12cd34.0badf00d-1.tmp.txt"  # another host's temp file, recent: it may be a live writer's
    mine.write_text("x")
    done = subprocess.run([sys.executable, str(SCRIPT), "--config", str(config)], env=_env(), capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not temp.exists() and mine.exists()
    assert [p for p in out.rglob("*") if ".tmp" in p.name] == [mine]
    assert sorted(set(pd.read_csv(out / "results.csv")["method"])) == ["ebo", "msp"]
