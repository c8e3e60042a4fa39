"""Malformed training configs through `oodforge train-classifier`: each is refused in one line naming
the key (exit 2, no traceback, before any model loads) or accepted on purpose."""
from __future__ import annotations

import json
import pickle
import re
from pathlib import Path

import pytest

from oodforge.commands import train_classifier as script
from pipelines.cli import run_main

REFUSED = [
    ("weight_decay: -1", r"weight_decay: must be >= 0"),
    ("seed: abc", r"seed: must be an integer, got str 'abc'"),
    ("num_workers: -1", r"num_workers: must be >= 0"),
    ('num_workers: "two"', r"num_workers: must be an integer"),
    ("device: gpu", r"device: unknown key"),
    ("warmup_epochs: -2", r"warmup_epochs: must be >= 0"),
    ('pretrained: "yes"', r"pretrained: must be true or false"),
    ('lr: "fast"', r"lr: must be a number"),
    ("epochs: 0", r"epochs: must be >= 1"),
    ("batch_size: 0", r"batch_size: must be >= 1"),
    ("epochs: 6\nwarmup_epochs: 6", r"warmup_epochs \(6\) must be below epochs \(6\)"),
    ("recipe: fast", r"recipe: must be one of"),
    ("protocol: openood", r"protocol: must be one of"),
    ("precision: fp64", r"precision: must be one of"),
    ("levels: category", r"levels: must be a list"),
    ("epoch: 3", r"epoch: unknown key \(did you mean 'epochs'\?\)"),
    ("model: runs/own/clasifier", r"model: the local model folder 'runs/own/clasifier' does not exist"),
    ("id: nowhere/at/all", r"id: the manifest folder 'nowhere/at/all' does not exist"),
    ("augment: rotate", r"augment: must be one of"),
]

ACCEPTED = [
    ("weight_decay: 1e-5", "weight_decay", 1e-5),  # a YAML 1.2 number, not the string '1e-5'
    ("lr: 1e-3", "lr", 1e-3),
    ("warmup_epochs: 0", "warmup_epochs", 0.0),
    ("pretrained: false", "pretrained", False),
    ("protocol: exact", "schedule", "clean"),
]


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A config folder with a manifest folder `id/`; model loading and training are replaced by a recorder."""
    (tmp_path / "id").mkdir()
    monkeypatch.chdir(tmp_path)
    seen = []

    def fake_train(config):
        seen.append(config)
        out = Path(config.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "metrics.json").write_text(json.dumps({"top1": {"val": {}, "test": {}}}))
        return out

    import pipelines.training.classify as classify

    monkeypatch.setattr(classify, "train_classifier", fake_train)
    monkeypatch.setattr(classify, "build_classifier", lambda *a, **k: pytest.fail("a model loaded"))
    return tmp_path, seen


def _run(folder: Path, text: str, capsys) -> tuple[int, str]:
    path = folder / "train.yaml"
    path.write_text(f"id: id\nout: out\nmodel: microsoft/resnet-50\n{text}\n")
    code = run_main(script.main, ["--config", str(path)], doc="docs/training.md")
    return code, capsys.readouterr().err


@pytest.mark.parametrize("text, message", REFUSED, ids=[c[0].replace("\n", "; ") for c in REFUSED])
def test_refused_in_one_line_naming_the_key(folder, capsys, text, message):
    base, seen = folder
    code, err = _run(base, text, capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert re.search(message, lines[0]), lines[0]
    assert "Traceback" not in err and "huggingface-cli" not in err and not seen


@pytest.mark.parametrize("text, key, value", ACCEPTED, ids=[c[0] for c in ACCEPTED])
def test_accepted_on_purpose(folder, capsys, text, key, value):
    base, seen = folder
    code, err = _run(base, text, capsys)
    assert code == 0, err
    assert getattr(seen[0], key) == value


def test_a_model_folder_without_a_config_is_refused(folder, capsys):
    base, _ = folder
    (base / "empty_model").mkdir()
    code, err = _run(base, "model: ./empty_model", capsys)
    assert code == 2 and "model: the local model folder './empty_model' has no config.json" in err


def test_the_untouched_default_config_builds_offline(tmp_path, monkeypatch):
    """microsoft/resnet-50 with pretrained: false: the architecture and processor come from pipelines/hub_configs."""
    from pipelines.training.classify import build_classifier
    from pipelines.training.recipes import TrainConfig

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty_cache"))
    config = TrainConfig.from_dict({"id": str(tmp_path), "out": str(tmp_path / "out"), "pretrained": False})
    clf = build_classifier(config, ["a", "b", "c"])
    assert clf.head.out_features == 3 and clf.head.in_features == 2048
    assert clf.image_size == (126, 126)  # the open-insects protocol's crop
    processor = clf.processor
    assert int(126 / processor.crop_pct) == 128 and processor.resample == 2  # Resize(128) bilinear + CenterCrop(126)


def test_a_pickled_checkpoint_as_model_runs_no_code(tmp_path, monkeypatch):
    """A `.pth` model that is not tensors only is refused in one line; its payload never runs."""
    from pipelines.errors import ConfigError
    from pipelines.training.classify import build_classifier
    from pipelines.training.recipes import TrainConfig

    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (Path.touch, (marker,))

    path = tmp_path / "resnet50.pth"
    with open(path, "wb") as fh:
        pickle.dump({"conv1.weight": Payload()}, fh, protocol=2)
    config = TrainConfig.from_dict({"id": str(tmp_path), "out": str(tmp_path / "o"), "model": str(path)})
    with pytest.raises(ConfigError, match="model: .* is not a tensor-only torch checkpoint"):
        build_classifier(config, ["a", "b"])
    assert not marker.exists()


def test_one_id_class_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    """A one-class ID set trained to "100% accuracy" and evaluated to a constant msp (AUROC 50): refused before any
    model loads, dry run included."""
    from pipelines.data import make_row, write_manifest

    monkeypatch.chdir(tmp_path)
    (tmp_path / "id").mkdir()
    write_manifest(tmp_path / "id", [make_row(f"{i}.png", split="train", label=0, class_name="shirt")
                                     for i in range(4)])
    config = tmp_path / "train.yaml"
    config.write_text("id: id\nout: out\nmodel: microsoft/resnet-50\n")
    for extra in ([], ["--dry-run"]):
        code = run_main(script.main, ["--config", str(config), *extra], doc="docs/training.md")
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1
        assert "id: id has one ID class (0) in its train rows: a one-class classifier learns nothing" in err
    assert not (tmp_path / "out").exists()
