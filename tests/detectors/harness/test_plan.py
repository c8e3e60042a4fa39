"""The plan as a value: units, kinds and content keys, leak guard and value checks, before (and without) any model."""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

import pytest
from helpers.models import stub_weights
from runner_helpers import evaluate_main, id_ood_manifests, noise_image

from detectors import registry
from detectors.base import Detector
from detectors.harness.plan import check_spec, make_plan, safe_name
from detectors.harness.runconfig import ConfigError
from pipelines.data import make_row, write_manifest
from pipelines.params import Params, param


@dataclass(frozen=True)
class CheckedParams(Params):
    k: int = param(5, "a count")
    dim: int = param(2, "a dimension")


class CheckedDetector(Detector):
    """Its own value checks (`check_params`, as every detector declares them); the plan must call them."""

    family = "posthoc"
    inputs = frozenset({"features"})
    Params = CheckedParams

    @classmethod
    def check_params(cls, params: dict, dims: dict | None = None) -> None:
        if params.get("k", 5) < 1:
            raise ValueError(f"k must be >= 1, got {params['k']}")
        if dims is not None and params.get("dim", 2) >= dims["features"]:
            raise ValueError(f"dim must be below the feature dimension {dims['features']}, got {params['dim']}")


@pytest.fixture()
def checked_detector(monkeypatch):
    """CheckedDetector registered as 'plugin_checked' for one test only (the real registry, loaded, stays as it was)."""
    registry.available()  # every real detector module imported into the real registry first
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    registry.register_detector("plugin_checked")(CheckedDetector)




@pytest.fixture
def data(tmp_path):
    return id_ood_manifests(tmp_path / "data")


def _config(data, tmp_path, **extra):
    id_dir, ood_dir = data
    return {"id": str(id_dir), "ood": [{"manifest": str(ood_dir)}], "out": str(tmp_path / "out"),
            "model": "org/no-model-yet", **extra}  # a hub id: checked when loaded, and nothing loads here


def test_units_and_kinds_without_any_model(data, tmp_path):
    plan = make_plan(_config(data, tmp_path, detectors=["msp", "knn", {"name": "logitnorm", "rules": ["ebo", "knn"]}],
                             select={"metric": "auroc"}, ood_val={"manifest": str(data[1]), "split": "val"},
                             fewshot={"shots": [1]}))
    assert [(u.kind, u.method) for u in plan.units] == [
        ("detector", "msp"), ("select", "knn"), ("detector", "logitnorm"), ("rule", "logitnorm+ebo"),
        ("rule", "logitnorm+knn"), ("fewshot", "fewshot")]
    assert plan.units[3].parent.method == "logitnorm" and plan.units[3].rule == "ebo"
    assert len({u.key for u in plan.units}) == len(plan.units)
    assert [s.id for s in plan.splits] == ["id-id_train", "id-id_val", "id-id_test", "ood-near", "ood-far",
                                           "ood_val-ood_val"]
    assert plan.class_names == ("c0", "c1") and plan.needs_features
    # validation rows named like a test set: no clash, and they are the val rows only
    assert {r["file_name"] for r in plan.ood_val.manifest.rows} == {f"val_near_{i}.png" for i in range(3)}
    assert plan.select.split == "ood_val-ood_val"
    assert not (tmp_path / "out").exists()
    text = plan.describe()
    assert "units to run (6)" in text and "units to reuse (0)" in text and "id-id_train 4" in text


def test_dry_run_prints_the_plan_and_loads_nothing(data, tmp_path, capsys):
    import yaml

    main = evaluate_main().main

    path = tmp_path / "eval.yaml"
    path.write_text(yaml.safe_dump(_config(data, tmp_path, detectors=["msp"])))
    assert main(["--config", str(path), "--dry-run", "detectors=[msp, ebo]"]) == 0
    out = capsys.readouterr().out
    assert "units to run (2): msp, ebo" in out and "caches to build" in out
    assert not (tmp_path / "out").exists()


def test_config_errors_are_one_line_exit_2(data, tmp_path, capsys, checked_detector):
    import yaml

    from pipelines.cli import run_main
    main = evaluate_main().main

    path = tmp_path / "eval.yaml"
    path.write_text(yaml.safe_dump(_config(data, tmp_path, detectors=[{"name": "plugin_checked", "params": {"k": -5}}],
                                           plugins=["test_plan"])))
    assert run_main(main, ["--config", str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "detectors[0].params.k: plugin_checked: k must be >= 1" in err


def test_unit_keys_follow_content(data, tmp_path):
    """Weights rewritten in place with size and mtime kept, edited class names, a re-saved load: folder, a runtime
    argument: each changes the key of the units it concerns (and only those)."""
    model = tmp_path / "model"
    model.mkdir()
    stub_weights(model / "model.safetensors", 1.0)
    saved = tmp_path / "saved_detector"
    saved.mkdir()
    (saved / "config.json").write_text('{"name": "msp", "params": {}}')
    config = _config(data, tmp_path, model=str(model),
                     detectors=["odin", "mcm", {"name": "ebo", "load": str(saved), "label": "loaded"}])
    keys = lambda **extra: {u.method: u.key for u in make_plan({**config, **extra}).units}  # noqa: E731
    before = keys()
    assert before == keys()

    stat = os.stat(model / "model.safetensors")
    stub_weights(model / "model.safetensors", 2.0)
    os.utime(model / "model.safetensors", ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert os.stat(model / "model.safetensors").st_mtime_ns == stat.st_mtime_ns
    rewritten = keys()
    assert {m for m in before if rewritten[m] != before[m]} == {"odin", "loaded"}  # pixel-only ODIN takes it; CLIP's
    # MCM never reads the classifier, so its unit is kept

    names = keys(class_names=["zero", "one"])
    assert names["mcm"] != rewritten["mcm"] and names["odin"] == rewritten["odin"]  # only MCM reads class names

    stat = os.stat(saved / "config.json")
    (saved / "config.json").write_text('{"name": "msp", "params":{} }')
    os.utime(saved / "config.json", ns=(stat.st_atime_ns, stat.st_mtime_ns))
    resaved = keys()
    assert resaved["loaded"] != rewritten["loaded"] and resaved["odin"] == rewritten["odin"]

    device = keys(device="cpu")
    assert all(device[m] != resaved[m] for m in ("odin", "mcm"))
    record = make_plan(config).units[0].parts
    assert record["runtime"] == {"device": None, "precision": None, "classifier": "run model"}


def test_leak_guard_by_content_and_field_rows(data, tmp_path):
    id_dir, ood_dir = data
    copies = tmp_path / "copies"
    copies.mkdir()
    shutil.copy(ood_dir / "far_1.png", copies / "innocent.png")  # a byte copy of a test OOD image, renamed
    shutil.copy(id_dir / "test_2.png", copies / "also_innocent.png")  # and of an ID test image
    noise_image(copies / "fresh.png", 999)
    rows = [make_row(n, split="train", role="ood", ood_set="auxiliary") for n in ("fresh.png", "innocent.png")]
    write_manifest(copies, rows)
    with pytest.raises(ConfigError, match=r"aux: 1 row\(s\) are byte copies of test images \(first: 'innocent.png'\)"):
        make_plan(_config(data, tmp_path, detectors=["msp"], aux={"manifest": str(copies), "split": "train"}))
    write_manifest(copies, [make_row("also_innocent.png", split="val", role="ood", ood_set="v")])
    with pytest.raises(ConfigError, match=r"ood_val: 1 row\(s\) are byte copies of test images"):
        make_plan(_config(data, tmp_path, detectors=["msp"], ood_val={"manifest": str(copies), "split": "val"}))

    field = tmp_path / "field"
    for i in range(2):
        noise_image(field / f"f{i}.png", 300 + i)
    write_manifest(field, [make_row("f0.png", role="id", label=0), make_row("f1.png", role="ood", ood_set="bci")])
    write_manifest(tmp_path / "field_val", [])
    with pytest.raises(ConfigError, match=r"ood_val: 1 row\(s\) are field-set rows"):
        make_plan(_config(data, tmp_path, detectors=["msp"], field=[{"manifest": str(field)}],
                          ood_val={"manifest": str(field), "split": "test", "sets": ["bci"]}))
    write_manifest(copies, rows[:1])
    plan = make_plan(_config(data, tmp_path, detectors=["msp"], aux={"manifest": str(copies), "split": "train"}))
    assert len(plan.split("aux-aux").manifest) == 1


def test_value_checks_in_the_plan_and_with_dims(checked_detector):
    with pytest.raises(ConfigError, match=r"detectors\[3\]\.params\.k: plugin_checked: k must be >= 1, got 0"):
        make_plan_of = registry.detector_class("plugin_checked")
        check_spec(make_plan_of, {"k": 0}, None, "detectors[3]", {"features": 4, "classes": 2})
    cls = registry.detector_class("plugin_checked")
    check_spec(cls, {"dim": 8}, None, "detectors[0]")  # D unknown yet: passes the plan
    with pytest.raises(ConfigError, match=r"detectors\[0\]\.params\.dim: plugin_checked: dim must be below the feature "
                                          r"dimension 4, got 8"):
        check_spec(cls, {"dim": 8}, None, "detectors[0]", {"features": 4, "classes": 2})


@pytest.mark.parametrize("name", ["../../x", "/abs", "a/b", "..", ".hidden", "ok-name_1.2+b"])
def test_safe_name_is_one_harmless_component(name):
    safe = safe_name(name)
    assert "/" not in safe and "\\" not in safe and not safe.startswith(".") and safe
    assert (safe == name) == (name == "ok-name_1.2+b")
    assert safe_name("a/b") != safe_name("a_b")


def test_a_unit_key_covers_only_the_splits_it_reads(data, tmp_path):
    """Changing `aux` reruns the units that read it (OE, OpenGAN) and not msp / mds / knn; changing
    `ood_val` reruns what fits or selects on it, not msp."""
    id_dir, ood_dir = data
    extra = tmp_path / "aux"
    for i in range(4):
        noise_image(extra / f"a{i}.png", 500 + i)
    write_manifest(extra, [make_row(f"a{i}.png", split="train", role="ood", ood_set="auxiliary") for i in range(4)])
    detectors = ["msp", "mds", "knn", "opengan", {"name": "oe", "params": {"mode": "heads"}}, "tempscale"]
    keys = lambda **extra_keys: {u.method: u.key for u in make_plan(_config(data, tmp_path,  # noqa: E731
                                                                            detectors=detectors, **extra_keys)).units}
    ood_val = {"manifest": str(ood_dir), "split": "val"}
    before = keys(aux={"manifest": str(extra)}, ood_val=ood_val)
    write_manifest(extra, [make_row(f"a{i}.png", split="train", role="ood", ood_set="auxiliary") for i in range(3)])
    after = keys(aux={"manifest": str(extra)}, ood_val=ood_val)
    assert {m for m in before if before[m] != after[m]} == {"opengan", "oe"}
    without_val = keys(aux={"manifest": str(extra)})
    # tempscale reads id_val only; knn sweeps its k on OOD validation (openood_v1.5's knn.yml), so it reads ood_val
    assert {m for m in after if after[m] != without_val[m]} == {"opengan", "oe", "knn"}
    plan = make_plan(_config(data, tmp_path, detectors=detectors, aux={"manifest": str(extra)}, ood_val=ood_val))
    reads = {u.method: u.parts["reads"] for u in plan.units}
    assert "aux" not in reads["msp"] and "ood_val" not in reads["msp"] and "id_val" not in reads["msp"]
    assert {"aux", "ood_val", "id_val"} <= set(reads["opengan"]) and "id_val" in reads["tempscale"]


def test_cache_hash_reaches_every_cache(data, tmp_path, monkeypatch):
    """`cache_hash: content` is in force while the runner runs (`image_identity`), so every cache keyed by images
    without an explicit mode (trained features, CLIP features, fine-tunes) sees a same-size rewrite with the mtime
    kept; `stat` does not."""
    from detectors.base import ImageSet
    from detectors.clip.features import images_key
    from detectors.harness.evaluate import Runner
    from pipelines.data import read_manifest
    from pipelines.fingerprint import _IDENTITY, image_identity

    id_dir, _ = data
    manifest = read_manifest(id_dir).select(split="train")
    path = manifest.path(manifest.rows[0])
    keys = {}
    for mode in ("stat", "content"):
        with image_identity(mode):
            keys[mode] = images_key(ImageSet(manifest=manifest))
    stat = os.stat(path)
    data_bytes = bytearray(path.read_bytes())
    data_bytes[-1] ^= 1
    path.write_bytes(bytes(data_bytes))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    for mode in ("stat", "content"):
        with image_identity(mode):
            changed = images_key(ImageSet(manifest=manifest)) != keys[mode]
        assert changed == (mode == "content")

    seen = []
    monkeypatch.setattr(Runner, "_run", lambda self: seen.append(_IDENTITY.get()))
    Runner(make_plan(_config(data, tmp_path, detectors=["msp"], cache_hash="content"))).run()
    assert seen == ["content"] and _IDENTITY.get() == "stat"
    plans = {h: make_plan(_config(data, tmp_path, detectors=["msp"], cache_hash=h)) for h in ("stat", "content")}
    assert plans["stat"].units[0].key != plans["content"].units[0].key


def test_plan_warns_about_a_set_with_nonoise_image(data, tmp_path):
    id_dir, ood_dir = data
    for path in ood_dir.glob("far_*.png"):
        path.unlink()
    plan = make_plan(_config(data, tmp_path, detectors=["msp"]))
    assert len(plan.warnings) == 1 and "ood[0]: none of the 4 image file(s) of set 'far' exists" in plan.warnings[0]
    assert "warning: ood[0]: none of the 4" in plan.describe()


def test_aux_and_ood_val_must_be_disjoint(data, tmp_path):
    _, ood_dir = data
    with pytest.raises(ConfigError, match=r"^aux and ood_val: 3 row\(s\) are in both \(first: 'val_near_0.png'\)"):
        make_plan(_config(data, tmp_path, detectors=["msp"], ood_val={"manifest": str(ood_dir)},
                          aux={"manifest": str(ood_dir), "split": "val", "sets": ["near"]}))
    with pytest.raises(ConfigError, match=r"^aux and select.ood_val: "):
        make_plan(_config(data, tmp_path, detectors=["knn"], select={"ood_val": {"manifest": str(ood_dir)}},
                          aux={"manifest": str(ood_dir), "split": "val", "sets": ["near"]}))


def test_model_is_needed_by_feature_detectors(data, tmp_path):
    config = {k: v for k, v in _config(data, tmp_path, detectors=["msp"]).items() if k != "model"}
    with pytest.raises(ConfigError, match=r"^model: a classifier hub id or folder is needed"):
        make_plan(config)
