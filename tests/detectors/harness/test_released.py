"""The Open-Insect model zoo through the evaluation command, commands only: a make_splits-layout region (synthetic
occurrences, tiny images) and stand-in zoo files with its class count (tests/helpers/open_insect_zoo.py).

- `oodforge evaluate --config configs/species_c-america.yaml model=<zoo>/basics_c-america.pth ...` writes rows;
- `configs/species_zoo_c-america.yaml` (the whole Table 2 from the zoo folder; its post-hoc list and rules shortened)
  loads every training method's file with no training and writes a row per method, rule and OOD set;
- a file whose class count is not the ID rows', or whose keys are not its network's, stops the dry run with one line
  naming the key and the file (exit 2)."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from helpers.open_insect_zoo import make_zoo
from PIL import Image

from detectors.harness.plan import make_plan
from detectors.harness.runconfig import ConfigError, EvalConfig
from gen.insects import load_region, synthetic_occurrences
from pipelines.configfile import load_yaml

ROOT = Path(__file__).resolve().parents[3]
REGION = "c-america"

pytestmark = pytest.mark.slow


def _run(*args: str, cwd: Path, script: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, str(ROOT / "scripts" / script)] if script else [sys.executable, "-m", "oodforge"]
    return subprocess.run([*command, *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


def _image(species: str, seed: int) -> Image.Image:
    code = hashlib.sha256(str(species).encode()).digest()
    base = np.array(list(code[:12]), dtype=np.float32).reshape(2, 2, 3)
    pixels = np.kron(base, np.ones((16, 16, 1))) + np.random.default_rng(seed).normal(0, 12, (32, 32, 3))
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


@pytest.fixture(scope="module")
def region(tmp_path_factory):
    """make_splits.py on a synthetic table (4 ID species, few rows a set), an image for every row, and the zoo's files
    under weights/ with the region's class count."""
    tmp = tmp_path_factory.mktemp("zoo_eval")
    occ, ids = synthetic_occurrences(12000, n_species=150, seed=3)
    ids = ids[ids.region == REGION].head(4)
    occ.to_csv(tmp / "occ.csv", index=False)
    ids.to_csv(tmp / "ids.csv", index=False)
    done = _run("--occurrences", tmp / "occ.csv", "--id-species", tmp / "ids.csv", "--image-root", tmp / "images",
                "--out", tmp / "splits", "--target-taxon", "moth", "split.aux_species_by_region.c-america=6",
                "--aux-per-species", 5, "--non-local-cap", 2, "--local-cap", 4, "--id-cap", 10,
                "--non-target-cap", 8, cwd=tmp, script="make_splits.py")
    assert done.returncode == 0, done.stderr[-3000:]
    splits = load_region(tmp / "splits" / REGION)
    for i, row in enumerate(splits.rows):
        path = splits.path(row)
        path.parent.mkdir(parents=True, exist_ok=True)
        _image(row["species"], i).save(path)
    classes = 1 + max(int(r["label"]) for r in splits.rows if r["role"] == "id")
    make_zoo(tmp / "weights", REGION, classes, aux=4)
    return tmp, tmp / "splits" / REGION, classes


def _paths(splits: Path, out: Path) -> list[str]:
    """The region file's paths pointed at the test's splits (no field set: BCI is not part of this test)."""
    return [f"id={splits}", f"ood=[{{manifest: {splits}}}]", f"aux.manifest={splits}", f"ood_val.manifest={splits}",
            f"out={out}", "field=[]", "threshold_transfer=[]", "num_workers=0", f"cache_dir={out.parent / 'cache'}"]


def test_species_config_evaluates_a_released_basics_file(region):
    tmp, splits, _ = region
    out = tmp / "basics_run"
    done = _run("evaluate", "--config", ROOT / "configs" / f"species_{REGION}.yaml",
                f"model={tmp / 'weights' / f'basics_{REGION}.pth'}", *_paths(splits, out), "detectors=[msp, ebo, mls]",
                cwd=tmp)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    rows = pd.read_csv(out / "results.csv")
    sets = {r["ood_set"] for r in load_region(splits).rows if r["role"] == "ood" and r["split"] == "test"}
    failures = (out / "failures.json").read_text() if (out / "failures.json").is_file() else ""
    assert set(rows.method) == {"msp", "ebo", "mls"} and set(rows.ood_set) == sets, failures
    assert rows.auroc.between(0, 100).all() and (rows.protocol == "open-insects").all()


def test_zoo_config_scores_every_training_method_without_training(region):
    tmp, splits, _ = region
    raw = load_yaml(ROOT / "configs" / f"species_zoo_{REGION}.yaml")
    specs = [d if isinstance(d, dict) else {"name": d} for d in raw["detectors"]]
    training = [s for s in specs if "rules" in s]
    assert [s["name"] for s in training] == ["confbranch", "logitnorm", "arpl", "godin", "rotpred", "oe", "mixoe",
                                             "energy_oe", "udg", "novel_branch", "extended"]
    kept = [s for s in specs if s["name"] in ("msp", "opengan")] + [{**s, "rules": ["msp", "mls"]} for s in training]
    raw.update(detectors=kept)
    (tmp / "zoo.yaml").write_text(yaml.safe_dump(raw))
    out = tmp / "zoo_run"
    done = _run("evaluate", "--config", tmp / "zoo.yaml", *_paths(splits, out), cwd=tmp)  # weights/ under cwd
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    rows = pd.read_csv(out / "results.csv")
    expected = {"msp", "opengan"} | {m for s in training for m in (s["name"], f"{s['name']}+msp", f"{s['name']}+mls")}
    assert set(rows.method) == expected
    trained = rows[rows.family == "training"]
    assert (trained["mode"] == "full").all() and trained.auroc.notna().all()
    # each method scored with its own released network: no two methods' scores coincide
    scores = pd.read_parquet(out / "scores.parquet")
    own = scores[scores.method.isin([s["name"] for s in training])]
    by_method = own.groupby("method")["score"].apply(lambda s: tuple(np.round(s.to_numpy(), 6)))
    assert by_method.nunique() == len(training)
    assert not list(out.rglob("finetune*.safetensors"))  # nothing was fine-tuned


def test_a_wrong_class_count_or_key_stops_the_plan_with_one_line(region, tmp_path):
    tmp, splits, classes = region
    weights = tmp / "weights"
    base = load_yaml(ROOT / "configs" / f"species_{REGION}.yaml",
                     _paths(splits, tmp_path / "run") + ["detectors=[msp]"])
    make_zoo(tmp_path / "wrong", REGION, classes + 1)
    with pytest.raises(ConfigError, match=rf"model: .*basics_{REGION}.pth: resnet50: {classes + 1} classes \(fc.weight "
                                          rf"has {classes + 1} rows\) where the ID rows \(id: .*\) has {classes}"):
        make_plan(EvalConfig.from_dict({**base, "model": str(tmp_path / "wrong" / f"basics_{REGION}.pth")}))
    spec = {"name": "confbranch", "load": str(tmp_path / "wrong" / f"conf_branch_{REGION}.pth")}
    with pytest.raises(ConfigError, match=rf"detectors\[1\].load: .*conf_branch_{REGION}.pth: conf_branch_net: "
                                          rf"{classes + 1} classes \(fc.weight has"):
        make_plan(EvalConfig.from_dict({**base, "model": str(weights / f"basics_{REGION}.pth"),
                                        "detectors": ["msp", spec]}))
    renamed = tmp_path / "classifier.pth"  # no zoo name: its keys decide, `model_network` can say it
    renamed.write_bytes((weights / f"udg_{REGION}.pth").read_bytes())
    plan = make_plan(EvalConfig.from_dict({**base, "model": str(renamed)}))
    assert plan.runtime.model == str(renamed) and plan.runtime.model_network is None
    with pytest.raises(ConfigError, match=r"model: .*classifier.pth: rot_net: keys differ.*missing \['rot_fc.bias', "
                                          r"'rot_fc.weight'\]; unexpected \['fc_aux.bias', 'fc_aux.weight'\]"):
        make_plan(EvalConfig.from_dict({**base, "model": str(renamed), "model_network": "rot_net"}))
    with pytest.raises(ConfigError, match="model_network: .*godin_net"):
        EvalConfig.from_dict({**base, "model": str(renamed), "model_network": "godin_net"})
    godin = {**base, "model": str(weights / f"godin_{REGION}.pth")}
    with pytest.raises(ConfigError, match="godin_net has no linear closed-set head"):
        make_plan(EvalConfig.from_dict(godin))
    done = _run("evaluate", "--config", ROOT / "configs" / f"species_{REGION}.yaml", "--dry-run",
                f"model={weights / f'rotpred_{REGION}.pth'}", *_paths(splits, tmp_path / "run"),
                f"detectors=[msp, {{name: rotpred, load: {weights / f'conf_branch_{REGION}.pth'}}}]", cwd=tmp)
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "detectors[1].load" in lines[0] and "rotpred reads rot_net files" in lines[0], lines
