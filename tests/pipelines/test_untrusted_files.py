"""No code from data: a pickle that runs a shell command when loaded is planted in each place a run reads a file it
did not just write (a train_classifier output folder, an evaluation unit's work folder, a model folder, a detector
`load:` folder, the .pt files of DIFFGUARD, its distances and the CLIPN converter); nothing runs, and where the file
cannot be used the run says so in one line, with no advice to turn the safety off."""
from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from PIL import Image

from pipelines.data import make_row, write_manifest
from pipelines.errors import UserInputError
from pipelines.importers import import_classes
from tests.pipelines.own_data_helpers import class_tree

ROOT = Path(__file__).resolve().parents[2]


class Planted:
    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def plant(path: Path, marker: Path) -> Path:
    """A pickle at `path` whose loading creates `marker`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"format": "oodforge-train-checkpoint-v1", "key": "", "epoch": 99, "state": Planted(marker)}, path)
    return path


def _env() -> dict[str, str]:
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    return {**{k: v for k, v in os.environ.items() if k not in drop}, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
            "MPLBACKEND": "Agg"}


def _script(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / name), *map(str, args)], env=_env(),
                          capture_output=True, text=True, timeout=600)


def _one_line(done: subprocess.CompletedProcess) -> str:
    err = done.stderr.strip()
    assert done.returncode == 2 and err.count("\n") == 0 and "Traceback" not in err, done.stderr[-3000:]
    assert "weights_only" not in err
    return err


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny random ResNet-50 stand-in with a 3-class head, its pickle-only twin, and small ID / OOD manifests."""
    from pipelines.classifier import ImageClassifier
    from pipelines.tiny import RESNET_ID, save_tiny_model

    root = tmp_path_factory.mktemp("untrusted")
    torch.manual_seed(0)
    clf = ImageClassifier.from_pretrained(save_tiny_model(root / "hub", RESNET_ID), num_labels=3,
                                          id2label={0: "ant", 1: "bee", 2: "cat"},
                                          label2id={"ant": 0, "bee": 1, "cat": 2}, ignore_mismatched_sizes=True)
    model = clf.save_pretrained(root / "model")
    pickled = root / "pickled"
    shutil.copytree(model, pickled)
    (pickled / "model.safetensors").unlink()
    plant(pickled / "pytorch_model.bin", root / "ran-model")
    import_classes(class_tree(root / "photos", {"train": 4, "val": 1, "test": 2}), root / "id")
    rng = np.random.default_rng(1)
    (root / "ood").mkdir()
    rows = []
    for i in range(6):
        Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)).save(root / "ood" / f"{i}.png")
        rows.append(make_row(f"{i}.png", split="test", role="ood", ood_set="noise", group="far"))
    write_manifest(root / "ood", rows)
    return root, model, pickled


def _eval_yaml(root: Path, out: Path, model: Path, detectors: list) -> Path:
    config = {"model": str(model), "id": str(root / "id"), "ood": [{"manifest": str(root / "ood")}], "out": str(out),
              "detectors": detectors}
    path = out.with_suffix(".yaml")
    path.write_text(yaml.safe_dump(config))
    return path


FINETUNE = {"name": "logitnorm", "params": {"epochs": 1, "batch_size": 8, "lr": 0.01, "warmup_epochs": 0}}


def test_train_classifier_output_folder(tiny, tmp_path, capsys):
    """A planted checkpoint under `checkpoint.pt` and under `CHECKPOINT`: the run trains from scratch, nothing runs."""
    from pipelines.training.classify import CHECKPOINT, train_classifier
    from pipelines.training.recipes import TrainConfig

    root, model, _ = tiny
    out, marker = tmp_path / "out", tmp_path / "ran"
    plant(out / "checkpoint.pt", marker)
    plant(out / CHECKPOINT, marker)
    config = TrainConfig.from_dict({"id": str(root / "id"), "out": str(out), "model": str(model), "epochs": 1,
                                    "batch_size": 8, "warmup_epochs": 0, "num_workers": 0, "image_size": 32})
    train_classifier(config)
    assert not marker.exists()
    assert json.loads((out / "metrics.json").read_text())["epochs"] == 1
    warning = [line for line in capsys.readouterr().err.splitlines() if "ignoring" in line]
    assert len(warning) == 1 and CHECKPOINT in warning[0]


@pytest.mark.slow
def test_a_model_folder_with_only_a_pickle(tiny, tmp_path):
    """`model:` naming a folder whose weights are a hostile pytorch_model.bin: one line, exit 2, for evaluate and
    train_classifier alike (never torch's traceback advising weights_only=False)."""
    root, _, pickled = tiny
    marker = root / "ran-model"
    done = _script("evaluate.py", "--config", _eval_yaml(root, tmp_path / "run", pickled, ["msp"]))
    assert "pickled objects other than tensors" in _one_line(done) and str(pickled) in done.stderr
    train = tmp_path / "train.yaml"
    train.write_text(yaml.safe_dump({"id": str(root / "id"), "out": str(tmp_path / "clf"), "model": str(pickled),
                                     "pretrained": True, "epochs": 1, "warmup_epochs": 0, "batch_size": 8,
                                     "num_workers": 0}))
    assert "pickled objects other than tensors" in _one_line(_script("train_classifier.py", "--config", train))
    assert not marker.exists()


def test_evaluation_unit_work_folder_and_the_trained_artifact(tiny, tmp_path):
    """Planted fine-tune checkpoints in units/<method>/work are never run; the unit trains, writes its trained
    detector to units/<method>/work/model, and `load:` of that folder scores the same rows."""
    from detectors.harness.evaluate import run_config

    root, model, _ = tiny
    out, marker = tmp_path / "run", tmp_path / "ran"
    work = out / "units" / "logitnorm" / "work"
    plant(work / "finetune.pt", marker)
    plant(work / "finetune.safetensors", marker)
    first = run_config(_eval_yaml(root, out, model, [FINETUNE]))
    assert not marker.exists() and len(first) == 1
    artifact = work / "model"
    assert (artifact / "config.json").is_file() and (artifact / "classifier" / "model.safetensors").is_file()

    again = run_config(_eval_yaml(root, tmp_path / "loaded", model, [{"name": "logitnorm", "load": str(artifact)}]))
    assert not (tmp_path / "loaded" / "units" / "logitnorm" / "work" / "finetune.safetensors").exists()  # no training
    scores = [pd.read_parquet(folder / "scores.parquet").sort_values(["role", "index"])
              for folder in (out, tmp_path / "loaded")]
    np.testing.assert_allclose(scores[1]["score"], scores[0]["score"], rtol=1e-6)
    assert again["auroc"].tolist() == pytest.approx(first["auroc"].tolist())


@pytest.mark.parametrize("where", ["classifier/pytorch_model.bin", "model.safetensors"])
def test_a_detector_load_folder(tiny, tmp_path, where):
    """A saved detector folder whose weights are a pickle: never run, the unit fails in one recorded line."""
    from detectors import build, load
    from detectors.base import ImageSet
    from detectors.harness.evaluate import run_config
    from pipelines.classifier import ImageClassifier
    from pipelines.data import read_manifest

    root, model, _ = tiny
    manifest = read_manifest(root / "id")
    det = build("logitnorm", classifier=ImageClassifier.from_pretrained(model), **FINETUNE["params"])
    folder = det.fit(ImageSet(manifest=manifest.select(split="train"))).save_pretrained(tmp_path / "saved")
    marker = tmp_path / "ran"
    if where.startswith("classifier/"):
        (folder / "classifier" / "model.safetensors").unlink()
    else:
        (folder / where).unlink()
    plant(folder / where, marker)
    with pytest.raises(UserInputError) as err:  # the classifier folder: a refused pickle; model.safetensors: its header
        load(folder)
    assert "weights_only" not in str(err.value) and "\n" not in str(err.value).strip()
    results = run_config(_eval_yaml(root, tmp_path / "run", model, [{"name": "logitnorm", "load": str(folder)}]))
    failures = json.loads((tmp_path / "run" / "failures.json").read_text())["detectors"]
    assert len(results) == 0 and len(failures) == 1 and "weights_only" not in failures[0]["exception"]
    assert not marker.exists()


def test_foreign_pt_files_of_diffguard_distances_and_clipn(tmp_path):
    from detectors.clip.clipn_convert import convert_clipn
    from detectors.generative.distances import load_weight_files
    from detectors.generative.guided_diffusion import read_checkpoint

    marker = tmp_path / "ran"
    bad = plant(tmp_path / "256x256_diffusion_uncond.pt", marker)
    for load_it in (read_checkpoint, lambda p: load_weight_files(p, "dists"),
                    lambda p: convert_clipn(p, tmp_path / "clipn")):
        with pytest.raises(UserInputError) as err:
            load_it(bad)
        assert str(bad) in str(err.value) and "\n" not in str(err.value) and "weights_only" not in str(err.value)
    assert not marker.exists()


@pytest.mark.slow
def test_feature_caches_of_a_copied_run_folder(tiny, tmp_path):
    """Every feature cache replaced by a pickle: the rerun reads none of them as code, warns once per file, computes
    them again and ends with the same results."""
    root, model, _ = tiny
    config = _eval_yaml(root, tmp_path / "run", model, ["msp"])
    first = _script("evaluate.py", "--config", config)
    assert first.returncode == 0, first.stderr[-3000:]
    caches = sorted((tmp_path / "run" / "cache").rglob("*.safetensors"))
    assert caches
    marker = tmp_path / "ran"
    for cache in caches:
        plant(cache, marker)
    again = _script("evaluate.py", "--config", config)
    assert again.returncode == 0, again.stderr[-3000:]
    assert not marker.exists()
    warnings = [line for line in again.stderr.splitlines() if "ignoring the feature cache" in line]
    assert len(warnings) == len(caches) and "weights_only" not in again.stderr
    from pipelines.features import FeatureCache

    assert all(len(FeatureCache.load(c)) for c in caches)  # rewritten as real caches


def _in_process(name: str, capsys, *args: str) -> str:
    """The one error line of `scripts/<name>` run in this process (exit 2)."""
    from pipelines.cli import run_main

    capsys.readouterr()
    code = run_main(importlib.import_module(f"oodforge.commands.{Path(name).stem}").main, list(map(str, args)))
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "Traceback" not in err, err
    return err


def test_a_safetensors_header_declaring_2_62_bytes_is_one_line_wherever_it_is_read(tiny, tmp_path, capsys):
    """One line, never safetensors' SafetensorError traceback: the header bomb as a model folder's weights (evaluate and
    train_classifier), a detector folder's state, a label-levels folder and the diffusion / distance weight files."""
    from detectors import load
    from detectors.generative.distances import load_weight_files
    from detectors.generative.guided_diffusion import read_checkpoint
    from pipelines.checkpoints import UnsafeFileError
    from pipelines.training.objectives import MultiGranularity
    from tests.pipelines.test_checkpoints import header_bomb

    root, model, _ = tiny
    bombed = tmp_path / "bombed"
    shutil.copytree(model, bombed)
    header_bomb(bombed / "model.safetensors")
    err = _in_process("evaluate.py", capsys, "--config", _eval_yaml(root, tmp_path / "run", bombed, ["msp"]))
    assert "declares a 4611686018427387904-byte header" in err and "SafetensorError" not in err
    train = tmp_path / "train.yaml"
    train.write_text(yaml.safe_dump({"id": str(root / "id"), "out": str(tmp_path / "clf"), "model": str(bombed),
                                     "pretrained": True, "epochs": 1, "warmup_epochs": 0, "batch_size": 8,
                                     "num_workers": 0}))
    for dry in ([], ["--dry-run"]):
        assert "declares a 4611686018427387904-byte header" in _in_process("train_classifier.py", capsys, "--config",
                                                                          train, *dry)

    from detectors import build
    from detectors.base import FeatureSet

    rng = np.random.default_rng(0)
    folder = build("mds").fit(FeatureSet(rng.normal(size=(20, 4)), rng.normal(size=(20, 2)),
                                         np.arange(20) % 2)).save_pretrained(tmp_path / "det")
    header_bomb(folder / "model.safetensors")
    levels = tmp_path / "levels"
    levels.mkdir()
    (levels / "levels.json").write_text(json.dumps({"levels": {"genus": "genus"}, "weights": {}, "vocab": {}}))
    header_bomb(levels / "levels.safetensors")
    readers = [lambda: load(folder), lambda: MultiGranularity.from_pretrained(levels),
               lambda: read_checkpoint(header_bomb(tmp_path / "unet.safetensors")),
               lambda: load_weight_files(header_bomb(tmp_path / "dists.safetensors"), "dists")]
    for read in readers:
        with pytest.raises(UnsafeFileError, match="declares a 4611686018427387904-byte header") as err:
            read()
        assert "\n" not in str(err.value)


@pytest.mark.slow  # the command in a subprocess, so that its stdin holds the "y"
def test_a_model_folder_that_needs_its_own_code_is_refused_whatever_stdin_holds(tiny, tmp_path, capsys):
    """With "y" piped in, transformers' prompt would run the folder's Python: refused in one line before
    transformers reads the folder (it never prompts), by evaluate (the command, "y" on its stdin) and
    train_classifier."""
    from safetensors.torch import save_file

    from tests.pipelines.test_remote_code import evil_folder

    root, _, _ = tiny
    marker = tmp_path / "ran"
    folder = evil_folder(tmp_path / "evil", marker)
    save_file({"w": torch.zeros(2)}, str(folder / "model.safetensors"))  # a folder with weights, as `model:` wants
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "evaluate.py"), "--config",
                           str(_eval_yaml(root, tmp_path / "run", folder, ["msp"]))], input="y\n" * 20, env=_env(),
                          capture_output=True, text=True, timeout=600)
    err = _one_line(done)
    assert "maps its model_type 'evilnet' to Python code in the folder" in err and "never runs" in err
    assert "[y/N]" not in done.stdout + done.stderr and "trust_remote_code=True" not in err
    train = tmp_path / "train.yaml"
    train.write_text(yaml.safe_dump({"id": str(root / "id"), "out": str(tmp_path / "clf"), "model": str(folder),
                                     "pretrained": False, "epochs": 1, "warmup_epochs": 0, "batch_size": 8,
                                     "num_workers": 0}))
    for dry in ([], ["--dry-run"]):  # the dry run refuses it too, before any work
        assert "never runs a model folder's own code" in _in_process("train_classifier.py", capsys, "--config", train,
                                                                     *dry)
    assert not marker.exists()


def test_evaluate_refuses_a_native_model_folder_with_an_auto_map_in_one_line(tiny, tmp_path, capsys):
    """A trained ResNet folder whose config.json has an `auto_map` to code in the folder (transformers would load its
    own ResNet) is refused in one line, before any feature is extracted."""
    root, _, _ = tiny
    folder = tmp_path / "model"
    shutil.copytree(root / "model", folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "auto_map": {"AutoModel": "custom.Model"}}))
    err = _in_process("evaluate.py", capsys, "--config", _eval_yaml(root, tmp_path / "run", folder, ["msp"]))
    assert "config.json maps its model_type 'resnet' to Python code in the folder" in err, err
    assert "remove `auto_map` from config.json" in err
    assert not list((tmp_path / "run").rglob("*.safetensors"))  # no feature cache: refused before extraction
