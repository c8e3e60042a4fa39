"""Malformed evaluation configs: each is refused through `scripts/evaluate.py` in one line
naming the key, exit 2, before any model loads and with nothing written under `--out`, by the run and by `--dry-run`
alike; the cases accepted on purpose say why in their id.

Each case is the override list given on the command line over one valid config (YAML values, as a user types them),
or keys dropped from it."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from helpers.models import stub_weights
from runner_helpers import evaluate_main, id_ood_manifests

from pipelines.cli import run_main

REFUSED = [
    # (case id, overrides, keys dropped, the start of the one line after "error: <file>: ")
    ("model-path-typo", ["model=runs/own/clasifier"], (),
     r"model: the local model folder 'runs/own/clasifier' does not exist"),
    ("model-folder-without-weights", ["model={empty}"], (), r"model: the local model folder .* holds no weight files"),
    ("ood-group-Hard", ["ood.0.group=Hard"], (),
     r"ood\[0\]\.group: must be one of 'hard', 'easy', 'near', 'far'.*did you mean 'hard'"),
    ("ood-empty", ["ood=[]"], (), r"ood: give at least one OOD manifest"),
    ("detectors-empty", ["detectors=[]"], (), r"detectors: give at least one detector"),
    ("seed-not-a-key", ["seed=abc"], (), r"seed: unknown key"),
    ("num_workers-negative", ["num_workers=-1"], (), r"num_workers: must be >= 0, got -1"),
    ("num_workers-word", ["num_workers=two"], (), r"num_workers: must be an integer, got str 'two'"),
    ("device-gpu", ["device=gpu"], (), r"device: must be cpu, cuda, cuda:N or auto"),
    ("device-cuda-x", ["device=cuda:x"], (), r"device: must be cpu, cuda, cuda:N or auto"),
    ("device-mps-no-float64", ["device=mps"], (),
     r"device: mps is not supported \(several detectors compute in float64"),
    ("k-quoted-is-a-string", ['detectors.knn.params.k="5"'], (),
     r"detectors\[1\]\.params\.k: must be an integer, got str '5'"),
    ("lr-quoted-1e-3-is-a-string", ['detectors.logitnorm.params.lr="1e-3"'], (),
     r"detectors\[2\]\.params\.lr: must be a number, got str '1e-3'"),
    ("lr-negative", ["detectors.logitnorm.params.lr=-1"], (), r"detectors\[2\]\.params\.lr: logitnorm: lr must be > 0"),
    ("top-level-typo", ["detetcors=all"], (), r"detetcors: unknown key \(did you mean 'detectors'\?\)"),
    ("param-typo", ["detectors.knn.params.K=5"], (), r"detectors\[1\]\.params\.K: knn: unknown parameter\(s\) \['K'\]"),
    ("batch_size-string", ['batch_size="64"'], (), r"batch_size: must be an integer, got str '64'"),
    ("batch_size-zero", ["batch_size=0"], (), r"batch_size: must be >= 1, got 0"),
    ("protocol-unknown", ["protocol=openood"], (), r"protocol: must be one of .*did you mean 'openood_v1.5'"),
    ("cache_hash-md5", ["cache_hash=md5"], (), r"cache_hash: must be one of 'stat', 'content'"),
    ("select-metric", ["select={metric: acc}"], (), r"select\.metric: must be one of 'auroc'"),
    ("transfer-tpr-percent", ["threshold_transfer=[{source: near, targets: [far], tpr: 95}]"], (),
     r"threshold_transfer\[0\]\.tpr: must be > 0 and <= 1, got 95"),
    ("transfer-unknown-source", ["threshold_transfer=[{source: nearby, targets: [far]}]"], (),
     r"threshold_transfer\[0\]\.source: 'nearby' is not an evaluated OOD set"),
    ("precision-half", ["precision=half"], (), r"precision: must be one of 'auto', 'bf16', 'fp16', 'fp32'"),
    ("families-typo", ["families=[postoc]", "detectors=all"], (), r"families\[0\]: .*did you mean 'posthoc'"),
    ("ood-a-string", ["ood=folder"], (), r"ood: must be a list .*\(write \[folder\]\)"),
    ("id-missing", [], ("id",), r"id: required"),
    ("id-folder-missing", ["id=no/such/folder"], (), r"id: .*no metadata.jsonl: not a manifest folder"),
    ("aux-overlaps-ood_val", ["aux={manifest: {ood}, split: val, sets: [near]}"], (),
     r"aux and ood_val: 3 row\(s\) are in both"),
    ("unknown-detector", ["detectors=[mps]"], (), r"detectors\[0\]\.name: unknown detector 'mps'"),
    ("rules-on-posthoc", ["detectors=[{name: msp, rules: [ebo]}]"], (),
     r"detectors\[0\]\.rules: only training-time methods"),
    ("rule-reads-pixels", ["detectors=[{name: logitnorm, rules: [odin]}]"], (),
     r"detectors\[0\]\.rules\[0\]: 'odin' is not a feature-level post-hoc detector"),
    ("rule-param-typo", ["detectors=[{name: logitnorm, rules: [{name: tempscale, params: {fitt: exact}}]}]"], (),
     r"detectors\[0\]\.rules\[0\]\.params\.fitt: tempscale: unknown parameter"),
    ("unknown-ood-set", ["ood.0.sets=[nearr]"], (), r"ood\[0\]: OOD set 'nearr' has no rows with split 'test'"),
    ("head-levels-missing", ["head={levels: no/such/head, level: genus}"], (),
     r"head\.levels: no/such/head is not a folder"),
    ("plugin-missing", ["plugins=[no_such_module_xyz]"], (), r"plugins\[0\]: cannot import 'no_such_module_xyz'"),
    ("fewshot-no-shots", ["fewshot={shots: []}"], (), r"fewshot: shots must be a non-empty list"),
    ("params-beside-name", ["detectors=[{name: knn, k: 10}]"], (),
     r"detectors\[0\]\.k: unknown key; 'k' is a parameter of knn: write it under params \(\{name: knn, params: "
     r"\{k: 10\}\}\)"),
    ("rule-params-beside-name", ["detectors=[{name: logitnorm, rules: [{name: knn, k: 3}]}]"], (),
     r"detectors\[0\]\.rules\[0\]\.k: unknown key; 'k' is a parameter of knn: write it under params"),
]

ACCEPTED = [
    ("lr-1e-3-is-a-YAML-1.2-number", ["detectors.logitnorm.params.lr=1e-3"]),
    ("device-auto-is-torch's-first-device", ["device=auto"]),
    ("model-hub-id-is-looked-up-when-loaded", ["model=org/classifier"]),
    ("split-all-reads-every-split-of-a-source", ["ood_val={manifest: {ood}, split: all, sets: [near]}",
                                                 "ood.0.sets=[far]"]),
]


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """An ID manifest (train/val/test), an OOD manifest (test sets near and far; val rows of set near), a model
    folder with a weight file (never loaded: every case is refused first) and an empty folder."""
    root = tmp_path_factory.mktemp("faults")
    id_ood_manifests(root)
    (root / "model").mkdir()
    stub_weights(root / "model" / "model.safetensors")
    (root / "empty").mkdir()
    return {"root": root, "id": root / "id", "ood": root / "ood", "model": root / "model", "empty": root / "empty"}


@pytest.fixture(autouse=True)
def no_model_loads(monkeypatch):
    """Every case ends before a model loads: loading one fails the test."""
    from pipelines.classifier import ImageClassifier

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the config was refused")

    monkeypatch.setattr(ImageClassifier, "from_pretrained", classmethod(refuse))


def _config(folders: dict[str, Path], tmp_path: Path, drop: tuple[str, ...] = ()) -> Path:
    raw = {"model": str(folders["model"]), "id": str(folders["id"]), "ood": [{"manifest": str(folders["ood"])}],
           "ood_val": {"manifest": str(folders["ood"])}, "out": str(tmp_path / "out"),
           "detectors": ["msp", {"name": "knn", "params": {"k": 1}},
                         {"name": "logitnorm", "params": {"mode": "heads"}}]}
    path = tmp_path / "eval.yaml"
    path.write_text(yaml.safe_dump({k: v for k, v in raw.items() if k not in drop}))
    return path


def _filled(folders, overrides) -> list[str]:
    return [o.replace("{empty}", str(folders["empty"])).replace("{ood}", str(folders["ood"])) for o in overrides]


def _run(folders, tmp_path, overrides, drop=(), dry_run=False) -> int:
    argv = ["--config", str(_config(folders, tmp_path, drop)), *_filled(folders, overrides),
            *(["--dry-run"] if dry_run else [])]
    return run_main(evaluate_main().main, argv)


@pytest.mark.parametrize("overrides, drop, message", [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
@pytest.mark.parametrize("dry_run", [False, True], ids=["run", "dry-run"])
def test_refused_in_one_line_naming_the_key(folders, tmp_path, capsys, overrides, drop, message, dry_run):
    """The line names the override the faulty key came from (`override seed=abc: seed: ...`), else the file."""
    import re

    assert _run(folders, tmp_path, overrides, drop, dry_run) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    line = err.removeprefix("error: ")
    blamed = [o for o in _filled(folders, overrides) if line.startswith(f"override {o}: ")]
    line = line.removeprefix(f"override {blamed[0]}: ") if blamed else line.split("eval.yaml: ", 1)[-1]
    assert re.match(message, line), line
    assert "huggingface-cli" not in err  # never hub advice
    assert not (tmp_path / "out").exists()  # refused before anything is written


@pytest.mark.parametrize("overrides", [c[1] for c in ACCEPTED], ids=[c[0] for c in ACCEPTED])
def test_accepted_on_purpose(folders, tmp_path, capsys, overrides):
    assert _run(folders, tmp_path, overrides, dry_run=True) == 0, capsys.readouterr().err
    assert "units to run (3): msp, knn, logitnorm" in capsys.readouterr().out
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("override, named", [
    ("batchsize=32", "override batchsize=32: batchsize: unknown key (did you mean 'batch_size'?)"),
    ("batch_size=abc", "override batch_size=abc: batch_size: must be an integer, got str 'abc'"),
    ("detectors.knn.params.K=5", "override detectors.knn.params.K=5: detectors[1].params.K: knn: unknown parameter"),
])
def test_an_override_typo_names_the_override_not_the_config_file(folders, tmp_path, capsys, override, named):
    """A typo in a command-line override (`batchsize=32`) is named as the override, never as the config file's key."""
    assert _run(folders, tmp_path, [override], dry_run=True) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {named}") and "eval.yaml" not in err, err
    (tmp_path / "eval.yaml").write_text((tmp_path / "eval.yaml").read_text() + "batchsize: 32\n")  # in the file
    assert run_main(evaluate_main().main, ["--config", str(tmp_path / "eval.yaml"), "--dry-run"]) == 2
    assert "eval.yaml: batchsize: unknown key" in capsys.readouterr().err  # the file's own typo names the file


def test_the_table_holds_at_least_32_refusals():
    assert len(REFUSED) >= 32 and len({c[0] for c in REFUSED}) == len(REFUSED)
