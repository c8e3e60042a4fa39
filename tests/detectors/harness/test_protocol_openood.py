"""Protocol test: configs/openood_cifar10.yaml end to end on a tiny stand-in of OpenOOD v1.5's release.

The benchmark's data folder in the released layout is imported with `oodforge import-openood --benchmark cifar10`, a
tiny ResNet18_32x32 saved as OpenOOD saves `best.ckpt` is the `model:`, and the shipped config runs with only its
paths and detectors overridden. Each set's AUROC / FPR@95 is recomputed here from MSP on a plain-torch forward of the
reference network (OpenOOD's `_eval_ood`: ID test against one OOD set at a time), and the report's `near avg` /
`far avg` must be the plain means over the near sets (cifar100, tin) and the far sets (mnist, svhn, texture,
places365), as `evaluation_api/evaluator.py:365-369` averages them.
"""
from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image
from sklearn.metrics import roc_auc_score, roc_curve

from detectors.harness.evaluate import run_config
from detectors.harness.plan import make_plan
from pipelines.configfile import load_yaml
from tests.helpers.openood_release import RELEASE, fake_benchmark, forward_32x32, resnet18_32x32_state

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
NEAR, FAR = ["cifar100", "tin"], ["mnist", "svhn", "texture", "places365"]
MEAN, STD = np.array([0.4914, 0.4822, 0.4465]), np.array([0.2470, 0.2435, 0.2616])


def _config(benchmark: str, manifest: Path, ckpt: Path, out: Path, *extra: str) -> dict:
    """The shipped config with its paths on the stand-in (and `extra` overrides)."""
    return load_yaml(CONFIGS / f"openood_{benchmark}.yaml", [
        f"model={ckpt}", f"id={manifest}", f"ood=[{{manifest: {manifest}}}]", f"ood_val={{manifest: {manifest}}}",
        f"out={out}", *extra])


@pytest.mark.parametrize("benchmark", list(RELEASE))
def test_every_shipped_config_plans_the_benchmark(tmp_path, benchmark):
    """Each openood_<benchmark>.yaml plans on its imported stand-in: ID train / val / test, every near- and far-OOD
    set in its group, the OOD validation rows, every method of the base under protocol openood_v1.5."""
    root = tmp_path / "openood"
    fake_benchmark(root, benchmark, id_counts=(3, 2, 2), ood_count=2, size=(8, 8))
    importlib.import_module("oodforge.commands.import_openood").main(
        ["--root", str(root), "--benchmark", benchmark, "--out", str(tmp_path / "data")])
    ckpt = tmp_path / "best.ckpt"
    torch.save({}, ckpt)  # planning reads no weights
    plan = make_plan(_config(benchmark, tmp_path / "data" / benchmark, ckpt, tmp_path / "run"))
    _, _, _, near, far = RELEASE[benchmark]
    assert {s.name: s.group for s in plan.of_role("ood")} == {**{s: "near" for s in near}, **{s: "far" for s in far}}
    assert [len(plan.split(f"id-id_{s}").manifest) for s in ("train", "val", "test")] == [3, 2, 2]
    assert {r["ood_set"] for r in plan.of_role("ood_val")[0].manifest} == {"ood_val"}
    assert plan.protocol == "openood_v1.5"
    methods = load_yaml(CONFIGS / "openood_base.yaml")["detectors"]
    assert sorted({u.method for u in plan.units}) == sorted(methods) and len(methods) == 22


def _msp(state: dict[str, torch.Tensor], paths: list[Path]) -> tuple[np.ndarray, np.ndarray]:
    """(max softmax, predicted class) per image: CIFAR-10's normalisation, then the reference forward."""
    x = np.stack([(np.asarray(Image.open(p).convert("RGB"), dtype=np.float64) / 255 - MEAN) / STD for p in paths])
    with torch.no_grad():
        logits = forward_32x32(state, torch.from_numpy(x).permute(0, 3, 1, 2).float()).double()
    return torch.softmax(logits, 1).max(1).values.numpy(), logits.argmax(1).numpy()


def _fpr95(id_conf: np.ndarray, ood_conf: np.ndarray) -> float:
    """OpenOOD v1.5's FPR@95: OOD positive on -conf, the FPR at the first ROC point with TPR >= 0.95."""
    labels = np.r_[np.zeros(len(id_conf)), np.ones(len(ood_conf))]
    fpr, tpr, _ = roc_curve(labels, -np.r_[id_conf, ood_conf])
    return float(fpr[np.searchsorted(tpr, 0.95, side="left")])


@pytest.mark.slow
def test_openood_cifar10_config_near_far_averages(tmp_path):
    root = tmp_path / "openood"
    lists = fake_benchmark(root, "cifar10", id_counts=(24, 6, 12), ood_count=6)
    importlib.import_module("oodforge.commands.import_openood").main(
        ["--root", str(root), "--benchmark", "cifar10", "--out", str(tmp_path / "data")])
    state = resnet18_32x32_state(num_classes=10, width=4, seed=3)
    state["fc.weight"] = state["fc.weight"] * 0.01  # logits of a few units: MSP does not saturate into ties
    ckpt = tmp_path / "checkpoints" / "s0" / "best.ckpt"
    ckpt.parent.mkdir(parents=True)
    torch.save(state, ckpt)
    manifest = tmp_path / "data" / "cifar10"
    raw = _config("cifar10", manifest, ckpt, tmp_path / "run", "detectors=[msp]", "batch_size=5", "num_workers=0",
                  "device=cpu")
    assert raw["protocol"] == "openood_v1.5"
    results = run_config(raw)

    rows = results.set_index("ood_set")
    assert {s: rows.loc[s, "group"] for s in NEAR + FAR} == {**{s: "near" for s in NEAR}, **{s: "far" for s in FAR}}
    images = root / "images_classic"
    id_conf, id_pred = _msp(state, [images / p for p, _ in lists["test_cifar10.txt"]])
    expected = {}
    for name in NEAR + FAR:
        ood_conf, _ = _msp(state, [images / p for p, _ in lists[f"test_{name}.txt"]])
        auroc = roc_auc_score(np.r_[np.ones(len(id_conf)), np.zeros(len(ood_conf))], np.r_[id_conf, ood_conf])
        expected[name] = (auroc, _fpr95(id_conf, ood_conf))
        assert rows.loc[name, "auroc"] == pytest.approx(auroc, abs=1e-9)  # results.csv holds fractions
        assert rows.loc[name, "fpr95"] == pytest.approx(expected[name][1], abs=1e-9)
        assert rows.loc[name, "n_id"] == 12 and rows.loc[name, "n_ood"] == 6
    labels = np.array([int(label) for _, label in lists["test_cifar10.txt"]])
    assert rows["id_acc"].to_numpy() == pytest.approx(np.full(len(rows), np.mean(id_pred == labels)), abs=1e-9)

    assert len({round(a, 9) for a, _ in expected.values()}) > 2  # the averages mix different values
    importlib.import_module("oodforge.commands.report").main(
        ["--results", str(tmp_path / "run" / "results.csv"), "--out", str(tmp_path / "report"), "--figures", "none",
         "--top-k", "0"])
    table = pd.read_csv(tmp_path / "report" / "per_set.csv").set_index("method")
    for group, sets in (("near", NEAR), ("far", FAR)):
        auroc = 100 * np.mean([expected[s][0] for s in sets])
        fpr = 100 * np.mean([expected[s][1] for s in sets])
        assert table.loc["msp", f"{group} avg/auroc"] == pytest.approx(auroc, abs=1e-4)
        assert table.loc["msp", f"{group} avg/fpr95"] == pytest.approx(fpr, abs=1e-4)
