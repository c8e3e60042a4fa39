"""scripts/train_classifier.py on a tiny ResNet-50 stand-in: resume after kill -9 gives the uninterrupted weights,
2 processes give the 1-process weights (batch norm over the global batch), levels, transforms, config errors."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from pipelines.checkpoints import read_metadata
from pipelines.errors import ConfigError
from pipelines.importers import ClassImport, import_classes
from tests.pipelines.own_data_helpers import class_tree, png

pytestmark = pytest.mark.slow  # its module fixture alone takes seconds (make test-fast leaves it out)

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "train_classifier.py"
ENV_DROP = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """An imported ID manifest and a tiny random-weight ResNet-50 folder."""
    from pipelines.tiny import save_tiny_model

    base = tmp_path_factory.mktemp("train")
    import_classes(class_tree(base / "photos", {"train": 8, "val": 2, "test": 2}), base / "id")
    model = save_tiny_model(base / "tiny", "microsoft/resnet-50")
    return base, model


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ENV_DROP}
    return {**env, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}


def _config(base: Path, model: Path, out: Path, **extra: object) -> Path:
    values = {"id": str(base / "id"), "out": str(out), "model": str(model), "epochs": 4, "batch_size": 8, "lr": 0.01,
              "warmup_epochs": 1, "num_workers": 0, "image_size": 32, **extra}
    path = out.with_suffix(".yaml")
    path.write_text("\n".join(f"{k}: {json.dumps(v)}" for k, v in values.items()))
    return path


def _weights(out: Path) -> dict[str, torch.Tensor]:
    return load_file(str(out / "model.safetensors"))


@pytest.mark.slow
def test_killed_run_resumes_to_the_uninterrupted_weights(setup, tmp_path):
    from helpers.killed import kill_after_writes

    base, model = setup
    whole = subprocess.run([sys.executable, str(SCRIPT), "--config",
                            str(_config(base, model, tmp_path / "a", epochs=6))],
                           env=_env(), capture_output=True, text=True, timeout=300)
    assert whole.returncode == 0, whole.stderr[-2000:]
    config = _config(base, model, tmp_path / "b", epochs=6)
    checkpoint = kill_after_writes("train-classifier", ["--config", config], "checkpoint.safetensors", 2, _env(),
                                   tmp_path / "kill")  # killed right after epoch 2's checkpoint
    done = int((read_metadata(checkpoint) or {}).get("epoch", 0))
    assert done == 2 and not (tmp_path / "b" / "metrics.json").exists()  # killed mid-run
    again = subprocess.run([sys.executable, str(SCRIPT), "--config", str(config)], env=_env(), capture_output=True,
                           text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    a, b = _weights(tmp_path / "a"), _weights(tmp_path / "b")
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=0, atol=0)
    history = [json.loads((tmp_path / x / "metrics.json").read_text())["history"] for x in ("a", "b")]
    assert [h["loss"] for h in history[0]] == pytest.approx([h["loss"] for h in history[1]], abs=0)


TORCHRUN_MAIN = """
import runpy, sys
from pipelines.runtime import partial_state
partial_state(cpu=True)
sys.argv = ["oodforge", *sys.argv[1:]]  # the command and its own arguments
runpy.run_module("oodforge", run_name="__main__")
"""


@pytest.mark.slow
def test_two_processes_train_the_one_process_weights(setup, tmp_path):
    """torchrun, 2 CPU processes, batch norm layers: each process takes half of every global batch of 8 and batch
    statistics span both halves, so the weights match the 1-process run."""
    base, model = setup
    # lr 1e-3: Adam's first steps are about lr * sign(gradient), so a coordinate whose gradient is float noise may move
    # by up to lr a step in either run; at this lr that stays within the tolerance below (gradients agree to ~1e-6)
    settings = {"epochs": 2, "lr": 0.001, "warmup_epochs": 0}
    one = subprocess.run([sys.executable, str(SCRIPT), "--config",
                          str(_config(base, model, tmp_path / "one", **settings))],
                         env=_env(), capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr[-2000:]
    launcher = tmp_path / "launch.py"
    launcher.write_text(TORCHRUN_MAIN)
    config = _config(base, model, tmp_path / "two", **settings)
    torchrun = Path(sys.executable).with_name("torchrun")
    two = subprocess.run([str(torchrun), "--standalone", "--nproc_per_node", "2", str(launcher), "train-classifier",
                          "--config", str(config)], env=_env(), capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert two.returncode == 0, "\n".join(l for l in two.stderr.splitlines() if "rror" in l or "File" in l)[-3000:]
    a, b = _weights(tmp_path / "one"), _weights(tmp_path / "two")
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=1e-3, atol=1e-4, msg=key)
    m1, m2 = (json.loads((tmp_path / x / "metrics.json").read_text()) for x in ("one", "two"))
    assert m1["steps"] == m2["steps"] == 2 * 3
    assert [h["loss"] for h in m2["history"]] == pytest.approx([h["loss"] for h in m1["history"]], rel=1e-4)


def test_levels_give_one_head_each_and_the_runner_can_read_them(setup, tmp_path):
    from pipelines.training.classify import train_classifier
    from pipelines.training.objectives import MultiGranularity
    from pipelines.training.recipes import TrainConfig

    base, model = setup
    rng = np.random.default_rng(0)
    for split, n in (("train", 4), ("val", 1), ("test", 1)):
        for cat, era, colour in (("ding", "shang", (200, 0, 0)), ("ding", "zhou", (0, 200, 0)),
                                 ("gui", "zhou", (0, 0, 200))):
            for i in range(n):
                png(tmp_path / "b" / split / cat / era / f"{i}.png", colour, rng)
    import_classes(tmp_path / "b", tmp_path / "id", ClassImport(levels=["category", "era"]))
    config = TrainConfig.from_dict({"id": str(tmp_path / "id"), "out": str(tmp_path / "out"), "model": str(model),
                                    "recipe": "multi-granularity", "levels": ["category", "era"], "epochs": 1,
                                    "warmup_epochs": 0, "batch_size": 4, "num_workers": 0, "image_size": 32})
    out = train_classifier(config)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["heads"] == ["label", "category"] and metrics["label_field"] == "era"
    assert set(metrics["top1"]["test"]) == {"label", "category", "overall"}
    assert MultiGranularity.from_pretrained(out).vocab == {"category": ["ding", "gui"]}
    assert (out / "training.png").stat().st_size > 0


def test_eval_transform_matches_the_image_processor(setup):
    """Training-time evaluation pixels = what the runner's image processor gives (resize shorter side to size / 0.875,
    centre crop, normalise)."""
    from pipelines.classifier import ImageClassifier
    from pipelines.training.classify import transforms_for
    from pipelines.training.transforms import Normalize

    _, model = setup
    clf = ImageClassifier.from_pretrained(model)
    train_tf, eval_tf = transforms_for(clf)
    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 256, (50, 70, 3), dtype=np.uint8))
    ours = Normalize(clf.mean.flatten().tolist(), clf.std.flatten().tolist())(eval_tf(image)[None])
    theirs = clf.preprocess([image])
    assert ours.shape == theirs.shape == (1, 3, 32, 32)
    assert (ours - theirs).abs().max() < 0.05  # uint8 rounding of the resized pixels
    crops = [train_tf(image, np.random.default_rng([0, 1, 2])) for _ in range(2)]
    assert torch.equal(crops[0], crops[1]) and crops[0].shape == (3, 32, 32) and crops[0].dtype == torch.uint8


def test_config_errors_name_the_key(tmp_path):
    from pipelines.training.recipes import TrainConfig

    base = {"id": str(tmp_path), "out": "y"}
    with pytest.raises(ConfigError, match=r"epoch: unknown key \(did you mean 'epochs'\?\)"):
        TrainConfig.from_dict({**base, "epoch": 3})
    with pytest.raises(ConfigError, match="recipe 'multi-granularity' needs `levels`"):
        TrainConfig.from_dict({**base, "recipe": "multi-granularity"})
    with pytest.raises(ConfigError, match="recipe: must be one of"):
        TrainConfig.from_dict({**base, "recipe": "fast"})
    config = TrainConfig.from_dict({**base, "recipe": "open-insects-scratch", "epochs": 7})
    assert ((config.pretrained, config.epochs, config.batch_size, config.lr, config.warmup_epochs)
            == (False, 7, 512, 0.01, 6))
    assert (config.protocol, config.schedule, config.drop_last, config.precision) == ("open-insects", "reference",
                                                                                      False, "fp32")
    assert (config.augment, config.image_size, config.pre_size) == ("ami", 126, 128)
    exact = TrainConfig.from_dict({**base, "protocol": "exact"})
    assert ((exact.schedule, exact.drop_last, exact.precision, exact.augment, exact.image_size)
            == ("clean", True, "auto", "imagenet", None))
    assert TrainConfig.from_dict(exact.to_dict()) == exact


# -- the run's key: images by identity, a finished rerun a true no-op, kills leave no temp files ---------------------
def _train_config(tmp: Path, model: Path, **extra: object):
    from pipelines.training.recipes import TrainConfig

    return TrainConfig.from_dict({"id": str(tmp / "id"), "out": str(tmp / "out"), "model": str(model), "epochs": 1,
                                  "batch_size": 8, "lr": 0.01, "warmup_epochs": 0, "num_workers": 0, "image_size": 32,
                                  **extra})


def _own_manifest(tmp: Path) -> Path:
    """An imported ID manifest of the test's own (its images get rewritten), PNGs stored uncompressed so a rewrite with
    other pixels keeps the file size."""
    from pipelines.data import read_manifest

    import_classes(class_tree(tmp / "photos", {"train": 4, "val": 1, "test": 1}), tmp / "id")
    for row in read_manifest(tmp / "id").rows:
        path = read_manifest(tmp / "id").path(row)
        Image.open(path).save(path, compress_level=0)
    return tmp / "id"


def _rewrite_class(tmp: Path, label: int, colour: tuple[int, int, int], keep_mtime: bool = False) -> int:
    """Every image of class `label` with new pixels (same size on disk); `keep_mtime` puts the old mtime back."""
    from pipelines.data import read_manifest

    manifest = read_manifest(tmp / "id")
    paths = [manifest.path(r) for r in manifest.rows if r["label"] == label]
    for path in paths:
        before = path.stat()
        Image.new("RGB", Image.open(path).size, colour).save(path, compress_level=0)
        assert path.stat().st_size == before.st_size
        if keep_mtime:
            os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    return len(paths)


def _folder_state(folder: Path) -> dict[str, tuple[int, bytes]]:
    return {p.relative_to(folder).as_posix(): (p.stat().st_mtime_ns, p.read_bytes())
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _run_key(out: Path) -> str:
    return json.loads((out / "metrics.json").read_text())["run_key"]


def test_a_finished_rerun_rewrites_nothing_and_changed_images_train_again(setup, tmp_path, monkeypatch, capsys):
    import pipelines.training.classify as classify
    from pipelines.fingerprint import source_identity

    _, model = setup
    _own_manifest(tmp_path)
    out = classify.train_classifier(_train_config(tmp_path, model))
    before, identity, key = _folder_state(out), source_identity(out), _run_key(out)
    real_build = classify.build_classifier
    monkeypatch.setattr(classify, "build_classifier", lambda *a: pytest.fail("a finished run must not load the model"))
    capsys.readouterr()
    classify.train_classifier(_train_config(tmp_path, model, num_workers=1))  # the worker count decides nothing
    assert "up to date" in capsys.readouterr().out
    assert _folder_state(out) == before and source_identity(out) == identity  # evaluation units keyed by it stay

    # every class-0 image rewritten (new bytes and mtime): the stale model is not kept
    monkeypatch.setattr(classify, "build_classifier", real_build)
    assert _rewrite_class(tmp_path, 0, (250, 250, 250)) == 6
    classify.train_classifier(_train_config(tmp_path, model))
    assert _run_key(out) != key and _weights(out) != before["model.safetensors"]
    assert (out / "metrics.json").stat().st_mtime_ns != before["metrics.json"][0]

    # what `cache_hash: stat` can miss (README): a same-size rewrite with the mtime put back
    key, weights = _run_key(out), (out / "model.safetensors").read_bytes()
    _rewrite_class(tmp_path, 0, (5, 5, 5), keep_mtime=True)
    classify.train_classifier(_train_config(tmp_path, model))
    assert _run_key(out) == key and (out / "model.safetensors").read_bytes() == weights


def test_cache_hash_content_sees_a_rewrite_with_the_mtime_restored(setup, tmp_path):
    from pipelines.training.classify import train_classifier

    _, model = setup
    _own_manifest(tmp_path)
    out = train_classifier(_train_config(tmp_path, model, cache_hash="content"))
    key = _run_key(out)
    _rewrite_class(tmp_path, 0, (5, 5, 5), keep_mtime=True)
    train_classifier(_train_config(tmp_path, model, cache_hash="content"))
    assert _run_key(out) != key
    with pytest.raises(ConfigError, match="cache_hash"):
        _train_config(tmp_path, model, cache_hash="mtime")


@pytest.mark.slow
def test_a_kill_during_a_write_leaves_no_temp_file_after_the_rerun(setup, tmp_path):
    """SIGKILL while the checkpoint is written (its temp file complete, not renamed): the rerun removes that temp
    file and ends with a complete output folder."""
    from helpers.killed import kill_during_write

    base, model = setup
    config = _config(base, model, tmp_path / "out", epochs=2)
    temp = (kill_during_write("train-classifier", ["--config", config], "checkpoint.safetensors", _env(),
                              tmp_path / "kill"))
    assert temp.parent == tmp_path / "out"
    again = subprocess.run([sys.executable, str(SCRIPT), "--config", str(config)], env=_env(), capture_output=True,
                           text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    out = tmp_path / "out"
    assert not [p for p in out.rglob("*") if ".tmp" in p.name]
    assert json.loads((out / "metrics.json").read_text())["epochs"] == 2 and _weights(out)


def test_dry_run_states_the_plan_the_run_follows_and_writes_nothing(setup, tmp_path, capsys, monkeypatch):
    import pipelines.training.classify as classify
    from oodforge.commands.train_classifier import main
    from pipelines.cli import run_main
    _, model = setup
    _own_manifest(tmp_path)
    config = tmp_path / "train.yaml"
    config.write_text(f"id: {tmp_path / 'id'}\nout: {tmp_path / 'out'}\nmodel: {model}\nepochs: 2\nbatch_size: 4\n"
                      "lr: 0.01\nwarmup_epochs: 1\nimage_size: 32\n")
    real_build = classify.build_classifier
    monkeypatch.setattr(classify, "build_classifier", lambda *a: pytest.fail("a dry run loads no model"))
    assert run_main(main, ["--config", str(config), "--dry-run"]) == 0
    dry = capsys.readouterr().out.splitlines()
    assert not (tmp_path / "out").exists()
    assert dry[0].endswith("(new)") and "ID rows: train 12, val 3, test 3; 3 classes" in dry[1]
    assert any(line.startswith("estimate: data loading ") for line in dry)  # pipelines.training.cost, at measured rates
    monkeypatch.setattr(classify, "build_classifier", real_build)
    assert run_main(main, ["--config", str(config)]) == 0
    run = capsys.readouterr().out
    schedule = next(line for line in dry if line.startswith("schedule "))
    # the run's own line
    assert schedule.startswith("schedule reference: 2 epochs x 3 steps") and f": {schedule}" in run
    assert run_main(main, ["--config", str(config), "--dry-run"]) == 0
    assert capsys.readouterr().out.splitlines()[0].endswith("(up to date)")
    for override, message in ((["levels=[order]"], "levels: the ID train rows of"),
                              ([f"id={tmp_path / 'photos'}"], "metadata.jsonl")):
        for dry_run in (["--dry-run"], []):  # refused alike, before anything is written
            assert run_main(main, ["--config", str(config), *override, "--out", str(tmp_path / "bad"), *dry_run]) == 2
            err = capsys.readouterr().err.strip()
            assert err.startswith("error: ") and message in err and "\n" not in err, err
            assert not (tmp_path / "bad").exists()


# -- the best epoch beside the last: kill -9 and resume, checkpoints.json, evaluation with checkpoint: best | last -----
CURVE = [0.2, 0.6, 0.4, 0.6, 0.5, 0.3]  # scripted ID-val top-1: best epoch 4 (ties with 2, the later wins), last 6
SCRIPTED = """
import contextlib, json, pathlib, runpy, sys, time
import pipelines.io as io
curve, kill_at, marker = json.loads(sys.argv[1]), int(sys.argv[2]), pathlib.Path(sys.argv[3])
real, count = io.atomic_path, [0]

@contextlib.contextmanager
def slow(path):  # the kill_at-th write of the best epoch's weights: written, not renamed, killed here
    with real(path) as tmp:
        yield tmp
        if pathlib.Path(path).name == "checkpoint.best.safetensors":
            count[0] += 1
            if count[0] == kill_at:
                marker.write_text(str(tmp))
                time.sleep(600)

io.atomic_path = slow  # before pipelines.checkpoints binds it
import pipelines.training.loop as loop
measured = loop._Loop.evaluate

def evaluate(self, loader, targets, split):  # the validation accuracy of epoch i is curve[i]
    out = measured(self, loader, targets, split)
    return {**out, "acc_label": curve[len(self.result.history)]} if split == "val" else out

loop._Loop.evaluate = evaluate
sys.argv = ["oodforge", *sys.argv[4:]]
runpy.run_module("oodforge", run_name="__main__")
"""


def _scripted_run(tmp_path: Path, config: Path, kill_at: int = 0) -> subprocess.Popen:
    launcher, marker = tmp_path / "scripted.py", tmp_path / f"killed-{config.stem}"
    launcher.write_text(SCRIPTED)
    return subprocess.Popen([sys.executable, str(launcher), json.dumps(CURVE), str(kill_at), str(marker),
                             "train-classifier",
                             "--config", str(config)], env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)


@pytest.fixture(scope="module")
def best_and_last(setup, tmp_path_factory):
    """A 6-epoch run whose scripted validation curve peaks at epoch 4 (uninterrupted)."""
    base, model = setup
    tmp = tmp_path_factory.mktemp("best")
    proc = _scripted_run(tmp, _config(base, model, tmp / "whole", epochs=6))
    assert proc.wait(timeout=300) == 0, proc.stderr.read()[-2000:]
    return tmp / "whole"


@pytest.mark.slow
def test_the_folder_keeps_the_best_epoch_beside_the_last_and_says_which(best_and_last):
    from pipelines.checkpoints import checkpoint_folder, read_checkpoint_index

    out = best_and_last
    index = read_checkpoint_index(out)
    assert index["last"]["folder"] == "." and index["last"]["epoch"] == 6 and index["last"]["val"]["label"] == 0.3
    assert index["best"]["folder"] == "best" and index["best"]["epoch"] == 4 and index["best"]["val"]["label"] == 0.6
    assert "base_recorder.py:40-55" in index["rule"]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["checkpoints"] == {k: index[k] for k in ("last", "best")}
    assert (checkpoint_folder(out, "best") == (out / "best").resolve()
            and checkpoint_folder(out, "last") == out.resolve())
    assert int(read_metadata(out / "checkpoint.best.safetensors")["epoch"]) == 4
    best, last = _weights(out / "best"), _weights(out)
    assert best.keys() == last.keys() and any(not torch.equal(best[k], last[k]) for k in best)
    assert {"config.json", "preprocessor_config.json", "class_names.json"} <= {p.name for p in (out / "best").iterdir()}


@pytest.mark.slow
def test_kill_9_while_the_best_is_written_resumes_to_the_uninterrupted_best(setup, best_and_last, tmp_path):
    """SIGKILL during the third write of the best weights (epoch 4's; epochs 1 and 2 were the best before): the
    checkpoint says epoch 4, the best file still epoch 2; the rerun rewrites epoch 4's from the restored state and ends
    with the uninterrupted run's best/ and last weights."""
    base, model = setup
    config = _config(base, model, tmp_path / "b", epochs=6)
    proc = _scripted_run(tmp_path, config, kill_at=3)
    marker = tmp_path / f"killed-{config.stem}"
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None and not marker.exists():
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert marker.exists(), "the run never wrote the best weights a third time"
    out = tmp_path / "b"
    assert int(read_metadata(out / "checkpoint.safetensors")["epoch"]) == 4
    assert int(read_metadata(out / "checkpoint.best.safetensors")["epoch"]) == 2
    again = _scripted_run(tmp_path, config)
    assert again.wait(timeout=300) == 0, again.stderr.read()[-2000:]
    assert not [p for p in out.rglob("*") if ".tmp" in p.name]
    for folder in (Path("best"), Path(".")):
        a, b = _weights(best_and_last / folder), _weights(out / folder)
        for key in a:
            torch.testing.assert_close(b[key], a[key], rtol=0, atol=0)
    assert (json.loads((out / "checkpoints.json").read_text())
            == json.loads((best_and_last / "checkpoints.json").read_text()))


def test_no_val_rows_keep_the_last_only(setup, tmp_path):
    from pipelines.checkpoints import read_checkpoint_index
    from pipelines.training.classify import train_classifier

    _, model = setup
    import_classes(class_tree(tmp_path / "photos", {"train": 3, "test": 1}), tmp_path / "id")
    out = train_classifier(_train_config(tmp_path, model, epochs=2))
    index = read_checkpoint_index(out)
    assert index["best"] is None and index["last"]["epoch"] == 2 and not (out / "best").exists()
    assert not (out / "checkpoint.best.safetensors").exists()
    from detectors.harness.plan import classifier_checkpoint

    assert classifier_checkpoint(str(out), None, "open-insects") == (str(out), "last")  # the protocol's best: none
    with pytest.raises(ConfigError, match="keeps no best checkpoint"):
        classifier_checkpoint(str(out), "best", "open-insects")
    assert classifier_checkpoint(str(model), None, "open-insects") == (str(model), "")  # not a trained folder


def _ood_manifest(root: Path) -> Path:
    from pipelines.data import make_row, write_manifest
    from tests.pipelines.own_data_helpers import ood_tree

    ood_tree(root, ("rocks",), n=6)
    rows = [make_row(f"rocks/{i}.png", split="test", role="ood", ood_set="rocks") for i in range(6)]
    write_manifest(root, rows)
    return root


def test_evaluate_runs_the_checkpoint_the_config_or_protocol_names(setup, best_and_last, tmp_path, capsys):
    """scripts/evaluate.py on the trained folder: protocol open-insects runs best/ (the reference evaluates best.ckpt),
    `checkpoint=last` the folder's own weights, exact its last; rows and unit keys say which; an explicit best the
    model does not keep is one line, exit 2."""
    import pandas as pd
    import yaml

    from pipelines.cli import run_main
    from tests.detectors.harness.runner_helpers import evaluate_main

    base, model = setup
    main = evaluate_main().main
    config = {"model": str(best_and_last), "id": str(base / "id"), "detectors": ["msp"], "protocol": "open-insects",
              "ood": [{"manifest": str(_ood_manifest(tmp_path / "ood"))}], "out": str(tmp_path / "unused")}
    path = tmp_path / "eval.yaml"
    path.write_text(yaml.safe_dump(config))
    runs = {"protocol": [], "last": ["checkpoint=last"], "exact": ["protocol=exact"],
            "best folder": [f"model={best_and_last / 'best'}"]}
    found = {}
    for name, overrides in runs.items():
        out = tmp_path / name.replace(" ", "_")
        assert run_main(main, ["--config", str(path), "--out", str(out), *overrides]) == 0
        rows = pd.read_csv(out / "results.csv", keep_default_na=False)
        scores = pd.read_parquet(out / "scores.parquet")
        unit = json.loads((out / "units" / "msp" / "unit.json").read_text())
        found[name] = (rows["checkpoint"][0], scores["score"].to_numpy(), unit["key_parts"]["run"]["classifier"])
    assert [found[n][0] for n in runs] == ["best", "last", "last", ""]
    np.testing.assert_array_equal(found["protocol"][1], found["best folder"][1])  # best/ scored, as named directly
    np.testing.assert_array_equal(found["last"][1], found["exact"][1])
    assert not np.array_equal(found["protocol"][1], found["last"][1])
    assert found["protocol"][2]["checkpoint"] == "best" and found["protocol"][2] != found["last"][2]
    capsys.readouterr()
    for bad, message in ((model, "checkpoint: best: model"), (best_and_last / "best", "checkpoint: best: model")):
        code = run_main(main,
                        ["--config", str(path), "--out", str(tmp_path / "bad"), f"model={bad}", "checkpoint=best"])
        err = capsys.readouterr().err.strip()
        assert code == 2 and err.startswith(f"error: {message}") and "\n" not in err, err
