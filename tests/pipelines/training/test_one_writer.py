"""Two train_classifier runs on one `out` (unlocked, the folder could hold run B's model and config with run A's
history). Deterministic, no timing window: run B starts from inside run A's training loop (a hook in
place of the loop), and from a command while another process says it holds the folder; B is refused in one line and
writes nothing; `--dry-run` takes no lock."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml
from helpers.locks import held
from helpers.models import tiny_resnet_classifier

import pipelines.training.classify as classify
from pipelines.cli import run_main
from pipelines.importers import import_classes
from pipelines.locks import LOCK_NAME, FolderBusy
from pipelines.training.recipes import TrainConfig
from tests.pipelines.own_data_helpers import class_tree

ROOT = Path(__file__).resolve().parents[3]


def _cli():
    module = importlib.import_module("oodforge.commands.train_classifier")
    return module


@pytest.fixture
def setup(tmp_path):
    tiny_resnet_classifier(tmp_path / "model")
    import_classes(class_tree(tmp_path / "photos", {"train": 2, "val": 1, "test": 1}), tmp_path / "id")
    config = {"id": str(tmp_path / "id"), "out": str(tmp_path / "out"), "model": str(tmp_path / "model"), "epochs": 1,
              "batch_size": 4, "warmup_epochs": 0, "num_workers": 0, "image_size": 16}
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(config))
    return config, path


def test_run_b_started_while_run_a_trains_is_refused(setup, monkeypatch):
    config, _ = setup
    out = Path(config["out"])
    seen = {}

    def run_b_inside_run_a(*args, **kwargs):
        seen["files"] = sorted(p.name for p in out.iterdir())
        with pytest.raises(FolderBusy) as err:
            classify.train_classifier(TrainConfig.from_dict(config))
        seen["error"] = str(err.value)
        seen["after"] = sorted(p.name for p in out.iterdir())
        raise KeyboardInterrupt  # run A stops here too

    monkeypatch.setattr(classify, "finetune", run_b_inside_run_a)
    with pytest.raises(KeyboardInterrupt):
        classify.train_classifier(TrainConfig.from_dict(config))
    assert LOCK_NAME in seen["files"] and seen["after"] == seen["files"]  # B wrote nothing
    assert f"{out}: in use by pid " in seen["error"] and "(train_classifier" in seen["error"]
    assert "\n" not in seen["error"]
    assert not (out / LOCK_NAME).exists()  # A's lock went with it, killed by an exception


def test_the_command_is_refused_in_one_line_while_another_process_holds_out(setup, capsys):
    config, path = setup
    out = Path(config["out"])
    cli = _cli()
    capsys.readouterr()
    with held(out, "train_classifier") as holder:
        assert run_main(cli.main, ["--config", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{out}: in use by pid {holder.pid} on " in err and "(train_classifier" in err
        assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME]
        assert run_main(cli.main, ["--config", str(path), "--dry-run"]) == 0  # the dry run takes no lock
        assert "(new)" in capsys.readouterr().out
