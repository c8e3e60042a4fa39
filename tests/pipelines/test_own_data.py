"""README "Your own data": its three command lines, run verbatim through the scripts on generated class folders, with
`microsoft/resnet-50` resolved offline to the tiny stand-in."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd

from pipelines.classifier import ImageClassifier

from tests.pipelines.own_data_helpers import class_tree, fake_hub_cache, ood_tree

ROOT = Path(__file__).resolve().parents[2]


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Your own data", 1)[1]
    block = section.split("```bash", 1)[1].split("```", 1)[0]
    return [line.strip() for line in block.strip().splitlines() if line.strip()]


def test_readme_commands_take_class_folders_to_a_report(tmp_path):
    commands = readme_commands()
    assert len(commands) == 3
    class_tree(tmp_path / "photos", {"train": 8, "val": 3, "test": 3})
    ood_tree(tmp_path / "new_photos")
    for name in ("scripts", "configs"):
        (tmp_path / name).symlink_to(ROOT / name)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_CACHE": str(fake_hub_cache(tmp_path / "hub")),
           "HF_HUB_OFFLINE": "1", "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    for command in commands:
        done = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{command}\n{done.stderr[-3000:]}"
    names = json.loads((tmp_path / "data" / "own" / "class_names.json").read_text())["names"]
    assert names == ["ant", "bee", "cat"]
    model = tmp_path / "runs" / "own" / "classifier"
    metrics = json.loads((model / "metrics.json").read_text())
    assert set(metrics["top1"]) == {"val", "test"} and 0 <= metrics["id_acc"] <= 1
    assert ImageClassifier.from_pretrained(model).class_names == names  # what `model:` in eval configs loads
    results = pd.read_csv(tmp_path / "runs" / "own" / "results.csv")
    assert set(results["ood_set"]) == {"moths", "rocks"} and set(results["method"]) >= {"msp", "mds"}
    assert (tmp_path / "runs" / "own" / "report" / "per_set.md").is_file()
