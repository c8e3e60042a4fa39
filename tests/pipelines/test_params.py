"""The typed config layer: one loader, one error path (pipelines.params), the shared Source."""
from __future__ import annotations

from typing import Literal

import numpy as np
import pytest

from pipelines.configfile import parse_yaml
from pipelines.errors import ConfigError
from pipelines.params import REQUIRED, Config, config, param
from pipelines.sources import Source


@config
class Inner(Config):
    k: int = param(5, "neighbours", ge=1)
    name: str = param(REQUIRED, "a name")


@config
class Outer(Config):
    lr: float = param(1e-3, "learning rate", gt=0)
    mode: Literal["a", "b"] = param("a", "the mode")
    inner: list[Inner] = param([], "inner entries")
    ood: list[Source] = param(REQUIRED, "OOD sources")
    aux: Source | None = param(None, "an optional source")


def test_nested_values_are_typed_and_round_trip():
    made = Outer.from_dict(parse_yaml("lr: 1e-5\nood: [x, {manifest: y, split: val, group: hard}]\ninner: [{name: q}]"))
    assert made.lr == 1e-5 and made.inner == [Inner(name="q")]
    assert made.ood == [Source(manifest="x"), Source(manifest="y", split="val", group="hard")]
    assert Outer.from_dict(made.to_dict()) == made
    assert Outer.from_dict(parse_yaml("lr: 2\nood: []")).lr == 2.0  # ints widen to floats


@pytest.mark.parametrize("text, message", [
    ("lr: '1e-5'\nood: []", r"^config.lr: must be a number, got str '1e-5'$"),
    ("lr: -1\nood: []", r"^config.lr: must be > 0, got -1.0"),
    ("mode: c\nood: []", r"^config.mode: must be one of 'a', 'b', got str 'c'"),
    ("ood: [{manifest: x, group: Hard}]", r"^config.ood\[0\].group: .*got str 'Hard' \(did you mean 'hard'\?\)"),
    ("ood: x", r"^config.ood: must be a list .*\(write \[x\]\)"),
    ("oodd: []", r"^config.oodd: unknown key \(did you mean 'ood'\?\)"),
    ("ood: [{manifest: x, splt: val}]", r"^config.ood\[0\].splt: unknown key \(did you mean 'split'\?\)"),
    ("ood: []\ninner: [{name: q, k: 0}]", r"^config.inner\[0\].k: must be >= 1, got 0"),
    ("ood: []\ninner: [{}]", r"^config.inner\[0\].name: required \(a name\)"),
    ("lr: 1", r"^config.ood: required"),
    ("ood: [{manifest: x, sets: []}]", r"sets must name at least one"),
    ("ood: [2024]", r"^config.ood\[0\]: a mapping of Source keys"),
])
def test_every_fault_is_one_line_naming_the_key(text, message):
    with pytest.raises(ConfigError, match=message) as err:
        Outer.from_dict(parse_yaml(text))
    assert "\n" not in str(err.value)


def test_source_split_defaults_to_the_key_it_stands_under():
    assert Source(manifest="m").read_split("test") == "test"
    assert Source(manifest="m", split="all").read_split("test") is None
    assert Source(manifest="m", split="val").read_split(None) == "val"


def test_model_refs_local_paths_must_hold_weights_hub_ids_pass(tmp_path):
    from pipelines.runtime import check_model_ref

    check_model_ref("microsoft/resnet-50", "model")  # a hub id: looked up when loaded
    with pytest.raises(ConfigError, match=r"^model: the local model folder 'runs/own/clasifier' does not exist$"):
        check_model_ref("runs/own/clasifier", "model")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="holds no weight files"):
        check_model_ref(str(tmp_path / "empty"), "models.base")
    (tmp_path / "ok" / "unet").mkdir(parents=True)
    (tmp_path / "ok" / "unet" / "diffusion_pytorch_model.safetensors").write_bytes(b"")
    with pytest.raises(ConfigError, match="not a readable safetensors file"):  # the load's own checks run here too
        check_model_ref(str(tmp_path / "ok"), "models.base")
    (tmp_path / "ok" / "unet" / "diffusion_pytorch_model.safetensors").write_bytes(b"\x02\0\0\0\0\0\0\0{}")
    check_model_ref(str(tmp_path / "ok"), "models.base")


@config
class Flagged(Config):
    lr: float = param(1e-3, "learning rate", gt=0)
    pad_lat: float = param(1.0, "latitude padding")
    pad_lon: float = param(3.0, "longitude padding")
    box: dict[str, int] = param({}, "a mapping the flags fill")
    aux: Source | None = param(None, "an optional source")


def test_from_yaml_reads_the_file_then_the_overrides_then_the_flags(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "base.yaml").write_text("lr: 0.5\nbox: {a: 1}\n")
    (tmp_path / "run.yaml").write_text("base: base.yaml\nbox: {b: 2}\naux: {manifest: x}\n")
    assert Flagged.from_yaml("run.yaml") == Flagged(lr=0.5, box={"a": 1, "b": 2}, aux=Source(manifest="x"))
    made = Flagged.from_yaml("run.yaml", ["lr=0.25", "aux.split=val"],
                             {"--lr": ("lr", 0.125), "--box": ("box", {"c": 3}),
                              "--pad": (("pad_lat", "pad_lon"), (7, 8))})
    assert made == Flagged(lr=0.125, pad_lat=7.0, pad_lon=8.0, box={"a": 1, "b": 2, "c": 3},
                           aux=Source(manifest="x", split="val"))  # a flag wins; a mapping flag fills its keys
    assert Flagged.from_yaml(None, ["lr=2"]) == Flagged(lr=2.0)


@pytest.mark.parametrize("overrides, flags, message", [
    ([], {"--lr": ("lr", -1)}, r"^--lr: must be > 0, got -1"),  # the flag that set it
    (["lr=-1"], {}, r"^run.yaml: lr: must be > 0, got -1"),  # the file (run_main names the override)
    ([], {"--aux": ("aux", {"split": "nope"})}, r"^--aux split: must be one of"),  # the rest of the key follows
    (["lr: 1"], {}, r"^override takes NAME=VALUE"),
])
def test_from_yaml_faults_name_where_the_value_came_from(tmp_path, monkeypatch, overrides, flags, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run.yaml").write_text("aux: {manifest: x}\n")
    with pytest.raises(ConfigError, match=message):
        Flagged.from_yaml("run.yaml", overrides, flags)
    with pytest.raises(ConfigError, match=r"^none.yaml: no such config file"):
        Flagged.from_yaml("none.yaml")


def test_list_elements_are_checked_one_by_one():
    from pipelines.params import type_ok

    assert type_ok([1, 2.5, np.float64(3.0), np.int32(4)], list[float])
    assert not type_ok([1.0, True], list[float])  # bools are not numbers here
    assert not type_ok([1.0, "2"], list[float])
    assert type_ok([1, np.int64(2)], list[int]) and not type_ok([1, 2.0], list[int])
    assert type_ok((0.5,), list[float] | None) and type_ok(None, list[float] | None)
    assert not type_ok("abc", list[str])
