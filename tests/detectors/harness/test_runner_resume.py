"""Long runs you can trust: per-detector persistence, resume, failure records, content-addressed caches, kill -9."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from runner_helpers import eval_config

from detectors import build
from detectors.harness.evaluate import run_config
from detectors.metrics import evaluate
from pipelines.classifier import ImageClassifier
from pipelines.data import read_manifest
from pipelines.features import extract_features

HERE = Path(__file__).parent
REPO = HERE.parents[2]


def _unit_stamp(out: Path, method: str) -> int:
    return (out / "units" / method / "unit.json").stat().st_mtime_ns


@pytest.mark.slow
def test_failing_detector_is_recorded_and_the_others_finish(digits, tmp_path):
    out = tmp_path / "run"
    config = eval_config(digits, out, detectors=["msp", "plugin_fail", "ebo"], plugins=["runner_plugins"])
    results = run_config(config)
    assert list(dict.fromkeys(results["method"])) == ["msp", "ebo"]
    failures = json.loads((out / "failures.json").read_text())
    (record,) = failures["detectors"]
    assert record["detector"] == "plugin_fail" and record["exception"] == "RuntimeError: plugin_fail always fails"
    assert "plugin_fail always fails" in (out / record["traceback"]).read_text()
    assert set(pd.read_csv(out / "results.csv")["method"]) == {"msp", "ebo"}

    stamps = {m: _unit_stamp(out, m) for m in ("msp", "ebo")}
    again = run_config(config)  # resume: finished units are read back, not recomputed
    assert {m: _unit_stamp(out, m) for m in ("msp", "ebo")} == stamps
    pd.testing.assert_frame_equal(again.reset_index(drop=True), results.reset_index(drop=True), check_dtype=False)
    assert len(json.loads((out / "failures.json").read_text())["detectors"]) == 1  # tried again, failed again


@pytest.mark.slow
def test_changed_parameters_redo_only_that_unit(digits, tmp_path):
    out = tmp_path / "run"
    run_config(eval_config(digits, out, detectors=["msp", {"name": "knn", "params": {"k": 5}}]))
    stamps = {m: _unit_stamp(out, m) for m in ("msp", "knn")}
    results = run_config(eval_config(digits, out, detectors=["msp", {"name": "knn", "params": {"k": 7}}]))
    assert _unit_stamp(out, "msp") == stamps["msp"] and _unit_stamp(out, "knn") != stamps["knn"]
    assert len(results) == 6


def test_changed_aux_redoes_only_the_units_that_read_it(digits, tmp_path):
    """A unit's key holds only the splits it reads: changing `aux` reruns OE, not msp or knn."""
    from PIL import Image

    from pipelines.data import make_row, write_manifest

    aux = tmp_path / "aux"
    aux.mkdir()
    for i in range(6):
        Image.fromarray(np.random.default_rng(i).integers(0, 255, (28, 28, 3), dtype=np.uint8)).save(aux / f"a{i}.png")
    rows = [make_row(f"a{i}.png", split="train", role="ood", ood_set="auxiliary") for i in range(6)]
    write_manifest(aux, rows[:5])
    out = tmp_path / "run"
    detectors = ["msp", {"name": "knn", "params": {"k": 5}}, {"name": "oe", "params": {"mode": "heads", "epochs": 1}}]
    ood = [{"manifest": str(digits[1]), "sets": ["texture"]}]
    run_config(eval_config(digits, out, detectors=detectors, ood=ood, aux={"manifest": str(aux)}))
    stamps = {m: _unit_stamp(out, m) for m in ("msp", "knn", "oe")}
    write_manifest(aux, rows)
    results = run_config(eval_config(digits, out, detectors=detectors, ood=ood, aux={"manifest": str(aux)}))
    assert {m for m in stamps if _unit_stamp(out, m) != stamps[m]} == {"oe"}
    assert set(results["method"]) == {"msp", "knn", "oe"}


@pytest.mark.slow
def test_retrained_model_in_the_same_folder_never_reuses_features(digits, tmp_path):
    """Content-addressed caches: the key hashes the weights actually loaded, not the folder name."""
    id_dir, ood_dir, model = digits
    folder = tmp_path / "clf"
    clf = ImageClassifier.from_pretrained(model)
    clf.save_pretrained(folder)
    config = eval_config((id_dir, ood_dir, folder), tmp_path / "run", detectors=["msp"],
                         ood=[{"manifest": str(ood_dir), "sets": ["digits_6_9"]}])
    before = run_config(config)
    with torch.no_grad():  # "retrain": another head, saved into the same folder
        torch.manual_seed(3)
        clf.head.weight.copy_(torch.randn_like(clf.head.weight))
    clf.save_pretrained(folder)
    after = run_config(config)
    fresh = ImageClassifier.from_pretrained(folder)
    idm, oodm = read_manifest(id_dir), read_manifest(ood_dir)
    msp = build("msp")
    expect = evaluate(msp.score(extract_features(fresh, idm.select(split="test", role="id")).to_featureset()),
                      msp.score(extract_features(fresh, oodm.select(ood_set="digits_6_9")).to_featureset()))
    assert after.iloc[0]["auroc"] == pytest.approx(expect["auroc"], abs=1e-9)
    assert after.iloc[0]["auroc"] != pytest.approx(before.iloc[0]["auroc"], abs=1e-6)
    assert len(list((tmp_path / "run" / "cache").glob("id-id_test-*.safetensors"))) == 2


@pytest.mark.slow
def test_image_identity_is_in_the_key(digits, tmp_path):
    """Rewriting an image file (same name, other bytes) gives its split a new cache."""
    from PIL import Image

    from pipelines.toydata import write_digits

    id_dir, ood_dir = write_digits(tmp_path / "data", n_textures=4)
    model = digits[2]
    config = eval_config((id_dir, ood_dir, model), tmp_path / "run", detectors=["msp"],
                         ood=[{"manifest": str(ood_dir), "sets": ["texture"]}])
    run_config(config)
    row = read_manifest(ood_dir).select(ood_set="texture").rows[0]
    Image.new("RGB", (16, 16), (255, 0, 0)).save(ood_dir / row["file_name"])
    os.utime(ood_dir / row["file_name"], ns=(1, 1))
    run_config(config)
    assert len(list((tmp_path / "run" / "cache").glob("ood-texture-*.safetensors"))) == 2
    assert len(list((tmp_path / "run" / "cache").glob("id-id_test-*.safetensors"))) == 1


@pytest.mark.slow
def test_bad_images_are_excluded_alike_on_every_path(digits, tmp_path):
    """A truncated ID image and an empty OOD file: recorded by name, left out of feature and pixel detectors alike."""
    from pipelines.toydata import write_digits

    id_dir, ood_dir = write_digits(tmp_path / "data", n_textures=4)
    idm, oodm = read_manifest(id_dir), read_manifest(ood_dir)
    bad_id = idm.select(split="test", role="id").rows[3]["file_name"]
    bad_ood = oodm.select(ood_set="texture").rows[1]["file_name"]
    data = (id_dir / bad_id).read_bytes()
    (id_dir / bad_id).write_bytes(data[: len(data) // 2])
    (ood_dir / bad_ood).write_bytes(b"")
    out = tmp_path / "run"
    results = run_config(eval_config((id_dir, ood_dir, digits[2]), out,
                                     detectors=["msp", {"name": "odin", "params": {"noise": 0.0}}],
                                     ood=[{"manifest": str(ood_dir), "sets": ["texture"]}]))
    failures = json.loads((out / "failures.json").read_text())["images"]
    assert {(f["split"], f["file"]) for f in failures} == {("id_test", bad_id), ("texture", bad_ood)}
    assert all(f["reason"] for f in failures)
    n_test = len(idm.select(split="test", role="id"))
    assert set(results["n_id"]) == {n_test - 1} and set(results["n_ood"]) == {3}
    scores = pd.read_parquet(out / "scores.parquet")
    for method in ("msp", "odin"):
        ids = scores[(scores.method == method) & (scores.role == "id")]
        assert 3 not in set(ids["index"]) and len(ids) == n_test - 1
    # ODIN with noise 0 and T=1000 ranks like MSP at T=1000 on the same rows: the same rows were scored
    msp_t = scores[(scores.method == "odin") & (scores.role == "id")]["index"].to_numpy()
    assert np.array_equal(msp_t, scores[(scores.method == "msp") & (scores.role == "id")]["index"].to_numpy())


@pytest.mark.slow
def test_pixel_only_run_probes_images(digits, tmp_path):
    """Without feature detectors the runner still finds unreadable images first (a probe, cached by image identity)."""
    from pipelines.toydata import write_digits

    id_dir, ood_dir = write_digits(tmp_path / "data", n_textures=4)
    bad = read_manifest(ood_dir).select(ood_set="texture").rows[0]["file_name"]
    (ood_dir / bad).write_text("not an image")
    out = tmp_path / "run"
    results = run_config(eval_config((id_dir, ood_dir, digits[2]), out, detectors=["odin"],
                                     ood=[{"manifest": str(ood_dir), "sets": ["texture"]}]))
    assert results.iloc[0]["n_ood"] == 3
    assert [f["file"] for f in json.loads((out / "failures.json").read_text())["images"]] == [bad]
    assert len(list((out / "cache" / "probe").glob("*.json"))) == 4  # id train/val/test + texture


@pytest.mark.slow
def test_kill_9_between_detectors_then_resume(digits, tmp_path):
    """SIGKILL while the second detector runs: the rerun keeps the first detector's unit and finishes the rest once."""
    out, block = tmp_path / "run", tmp_path / "block"
    block.mkdir()
    config = eval_config(digits, out, detectors=["msp", "plugin_block", "ebo"], plugins=["runner_plugins"])
    path = tmp_path / "eval.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {**os.environ, "PLUGIN_BLOCK": str(block),
           "PYTHONPATH": os.pathsep.join([str(HERE), str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, str(REPO / "scripts" / "evaluate.py"), "--config", str(path)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while not (block / "blocking").exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert (block / "blocking").exists(), "the blocking detector never started"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert ((out / "units" / "msp" / "unit.json").is_file()
            and not (out / "units" / "plugin_block" / "unit.json").exists())
    assert set(pd.read_csv(out / "results.csv")["method"]) == {"msp"}  # what finished was already written
    stamp = _unit_stamp(out, "msp")

    (block / "release").touch()
    os.environ["PLUGIN_BLOCK"] = str(block)
    try:
        results = run_config(config)
    finally:
        del os.environ["PLUGIN_BLOCK"]
    assert _unit_stamp(out, "msp") == stamp
    assert (block / "fits.txt").read_text().count("fit") == 2  # killed once, finished once
    assert list(dict.fromkeys(results["method"])) == ["msp", "plugin_block", "ebo"]
    assert not results.duplicated(["method", "ood_set"]).any()
    scores = pd.read_parquet(out / "scores.parquet")
    assert not scores.duplicated(["method", "role", "ood_set", "index"]).any()


def test_bad_input_matrix_in_evaluation(digits, tmp_path):
    """Every awkward image of the shared matrix as an OOD set: the loadable ones are scored by feature and pixel
    detectors alike, the others are recorded with file and reason; bad manifest lines are refused in the plan."""
    from badinputs import bad_images, bad_manifest

    from pipelines.data import make_row, write_manifest
    from pipelines.errors import ConfigError

    folder = tmp_path / "bad"
    cases = bad_images(folder)
    write_manifest(folder, [make_row(c.path.name, role="ood", ood_set="awkward", group="far") for c in cases.values()])
    out = tmp_path / "run"
    results = run_config(eval_config(digits, out, detectors=["msp", {"name": "odin", "params": {"noise": 0.0}}],
                                     ood=[{"manifest": str(folder)}]))
    loads = {c.path.name for c in cases.values() if c.loads}
    assert set(results["n_ood"]) == {len(loads)}
    failures = {f["file"]: f["reason"] for f in json.loads((out / "failures.json").read_text())["images"]}
    assert set(failures) == {c.path.name for c in cases.values() if not c.loads}
    for case in cases.values():
        if not case.loads:
            assert __import__("re").search(case.reason, failures[case.path.name]), (case.name, failures[case.path.name])
    scores = pd.read_parquet(out / "scores.parquet")
    rows = read_manifest(folder).rows
    for method in ("msp", "odin"):
        scored = {rows[i]["file_name"] for i in scores[(scores.method == method) & (scores.role == "ood")]["index"]}
        assert scored == loads

    broken = tmp_path / "broken"
    good = {k: v for k, v in cases.items() if v.loads}
    (broken / "x").mkdir(parents=True)
    for case in good.values():
        (broken / case.path.name).write_bytes(case.path.read_bytes())
    moved = {k: type(v)(v.name, broken / v.path.name, v.loads) for k, v in good.items()}
    info = bad_manifest(broken, moved, role="ood", ood_set="awkward", label=-1)
    with pytest.raises(ConfigError, match=r"^ood\[0\]: .*metadata.jsonl, line 2, field 'split'"):  # key, then line
        run_config(eval_config(digits, tmp_path / "run2", detectors=["msp"], ood=[{"manifest": str(broken)}]))
    assert info["bad_lines"][2] == "split" and not (tmp_path / "run2").exists()


@pytest.mark.slow
def test_weights_rewritten_in_place_redo_a_pixel_only_unit(digits, tmp_path):
    """Classifier weights rewritten with size and mtime kept: the pixel-only ODIN unit is redone, not reused."""
    id_dir, ood_dir, model = digits
    folder = tmp_path / "clf"
    clf = ImageClassifier.from_pretrained(model)
    clf.save_pretrained(folder)
    config = eval_config((id_dir, ood_dir, folder), tmp_path / "run",
                         detectors=[{"name": "odin", "params": {"noise": 0.0}}],
                         ood=[{"manifest": str(ood_dir), "sets": ["texture"]}])
    before = run_config(config)
    stamp = _unit_stamp(tmp_path / "run", "odin")
    weights = {p: p.stat() for p in folder.iterdir()}
    with torch.no_grad():
        torch.manual_seed(5)
        clf.head.weight.copy_(torch.randn_like(clf.head.weight))
    clf.save_pretrained(folder)
    for path, st in weights.items():  # same sizes, same mtimes: only the bytes tell
        assert path.stat().st_size == st.st_size
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = run_config(config)
    assert _unit_stamp(tmp_path / "run", "odin") != stamp
    fresh = run_config({**config, "out": str(tmp_path / "fresh")})
    assert after.iloc[0]["auroc"] == pytest.approx(fresh.iloc[0]["auroc"], abs=1e-9)
    assert after.iloc[0]["auroc"] != pytest.approx(before.iloc[0]["auroc"], abs=1e-6)
    record = json.loads((tmp_path / "run" / "units" / "odin" / "unit.json").read_text())["key_parts"]
    assert {p[0] for p in record["unit"]["classifier"]["model"]} >= {"model.safetensors", "config.json"}  # audit trail


def test_console_resume_and_failure_summary(digits, tmp_path, capsys):
    out = tmp_path / "run"
    config = eval_config(digits, out, detectors=["msp", "plugin_fail"], plugins=["runner_plugins"],
                         ood=[{"manifest": str(digits[1]), "sets": ["texture"]}])
    run_config(config)
    first = capsys.readouterr().out
    assert "1 detector failed -> " in first and "resumed:" not in first
    run_config(config)
    again = capsys.readouterr().out
    assert "resumed: 1 of 2 units up to date" in again and "1 detector failed -> " in again

    from runner_helpers import evaluate_main

    path = tmp_path / "eval.yaml"
    path.write_text(yaml.safe_dump(config))
    assert evaluate_main().main(["--config", str(path), "--dry-run"]) == 0
    plan = capsys.readouterr().out
    assert "units to run (1): plugin_fail" in plan and "units to reuse (1): msp" in plan
    assert evaluate_main().main(["--config", str(path), "-q"]) == 0  # -q: the INFO lines go, the warnings stay
    quiet = capsys.readouterr()
    assert "resumed:" not in quiet.out + quiet.err and "1 detector failed -> " not in quiet.out + quiet.err
    assert "[oodforge] detector plugin_fail failed: " in quiet.err


def test_every_detector_failed_is_one_line_and_non_zero(digits, tmp_path, capsys):
    from runner_helpers import evaluate_main

    path = tmp_path / "eval.yaml"
    path.write_text(yaml.safe_dump(eval_config(digits, tmp_path / "run", detectors=["plugin_fail"],
                                               plugins=["runner_plugins"],
                                               ood=[{"manifest": str(digits[1]), "sets": ["texture"]}])))
    assert evaluate_main().main(["--config", str(path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: no results: every detector failed (1 failure(s)) -> ")


def test_process_count_warning(monkeypatch):
    from runner_helpers import evaluate_main

    warn = evaluate_main()._process_warning
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setenv("ACCELERATE_NUM_PROCESSES", "2")
    assert "torchrun --nproc_per_node 2" in warn(1) and "ACCELERATE_NUM_PROCESSES=2" in warn(1)
    assert warn(2) is None
    monkeypatch.delenv("ACCELERATE_NUM_PROCESSES")
    assert warn(1) is None
    monkeypatch.setenv("ACCELERATE_USE_CPU", "True")  # what `accelerate launch --num_processes 2` leaves on CPU
    monkeypatch.setenv("MASTER_PORT", "29500")
    assert "torchrun --nproc_per_node N" in warn(1) and "accelerate launch --multi_gpu --num_processes N" in warn(1)


def test_manifest_names_never_leave_the_output_folder(digits, tmp_path):
    """Traversal strings in ood_set, category, species and a method label stay inside `out/` (sanitised names)."""
    from pipelines.data import make_row, write_manifest

    id_dir, ood_dir, model = digits
    oodm = read_manifest(ood_dir).select(ood_set="texture")
    crafted = tmp_path / "data" / "crafted"
    crafted.mkdir(parents=True)
    rows = []
    for i, r in enumerate(oodm.rows[:12]):
        (crafted / f"{i}.png").write_bytes(oodm.path(r).read_bytes())
        name, extra = ("../../x", {"category": "/abs"}) if i < 6 else ("/abs", {"species": "a/b"})
        rows.append(make_row(f"{i}.png", split="test", role="ood", ood_set=name, group="far", **extra))
    write_manifest(crafted, rows)
    field = tmp_path / "data" / "field"
    field.mkdir()
    frows = []
    for i, r in enumerate(read_manifest(ood_dir).select(ood_set="digits_6_9").rows[:6]):
        (field / f"{i}.png").write_bytes(read_manifest(ood_dir).path(r).read_bytes())
        frows.append(make_row(f"{i}.png", split="test", role="ood", ood_set="a/b", species=("a/b", "../../s")[i % 2]))
    write_manifest(field, frows)
    before = {p for p in tmp_path.rglob("*")}
    out = tmp_path / "deep" / "run"
    results = run_config(eval_config(digits, out, detectors=[{"name": "msp", "label": "../../lbl"}, "knn"],
                                     ood=[{"manifest": str(crafted)}], field=[{"manifest": str(field)}],
                                     select={"ood_val": {"manifest": str(ood_dir), "split": "test",
                                                         "sets": ["sketch"]}},
                                     threshold_transfer=[{"source": "../../x", "targets": ["a/b", "/abs"]}]))
    assert set(results["ood_set"]) == {"../../x", "/abs"} and set(results["method"]) == {"../../lbl", "knn"}
    outside = [p for p in tmp_path.rglob("*") if p not in before and out not in p.parents and p != out]
    assert outside == [tmp_path / "deep"]
    transfer = pd.read_csv(out / "threshold_transfer.csv")
    assert set(transfer["target"]) == {"a/b", "/abs"} and transfer["n_novel_species"].dropna().eq(2).all()
