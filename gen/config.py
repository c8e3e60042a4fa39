"""The configuration of a generation job (`GenerationConfig`: every key, validated, with its default) and `key=value`
overrides. See docs/generation.md for each key."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import yaml

from gen.jobplan import PLAN_CHANGES
from gen.pairing import TASKS
from pipelines.masks import MASK_METHODS
from pipelines.runtime import ATTENTION_BACKENDS, PRECISIONS

JOB_FOLDER = ".job"  # hidden, so that `datasets` ImageFolder sees only the manifest
NOT_DECISIVE = ("out", "limit", "batch_size", "attention", "compile", "plan_change")  # keys that never change an image


@dataclass
class GenerationConfig:
    """Everything a generation job needs; see docs/generation.md for each key.

    `models`: None (the real hub models of ZeSTConfig's defaults), a ZeSTConfig mapping (any subset of its keys), or
    "tiny" (tiny random-weight models built once into `$OODFORGE_CACHE/tiny_zest`, default ~/.cache/oodforge).
    `name` is the output's `ood_set` (default: the task). `limit` keeps the first planned items (raise it later and
    rerun to extend the same job). `mask_method` makes the masks of targets without a given mask (auto = rembg when
    installed, else OpenCV with a warning). `attention` (auto/sdpa/xformers) and `compile` only change speed;
    `plan_change` (refuse/extend) says what a rerun does when the input folders changed (gen.jobplan). The pipeline
    call parameters default to ZeST's (REFERENCE.md).
    """

    task: str
    targets: str
    materials: str
    out: str
    models: Any = None
    name: str | None = None
    resolution: int = 1024
    num_inference_steps: int = 30
    batch_size: int = 1
    seed: int = 42
    precision: str = "auto"
    limit: int | None = None
    per_target: int = 1
    inherit: str | None = None
    masks: str | None = None
    mask_method: str = "auto"
    resize: str = "squash"
    composite: bool = False
    strength: float = 0.9999
    guidance_scale: float = 5.0
    controlnet_conditioning_scale: float = 0.9
    ip_adapter_scale: float = 1.0
    attention: str = "auto"
    compile: bool = False
    plan_change: str = "refuse"

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"config 'task' must be one of {TASKS}, got {self.task!r}")
        for key in ("targets", "materials", "out"):
            if not isinstance(getattr(self, key), (str, os.PathLike)) or not str(getattr(self, key)):
                raise ValueError(f"config {key!r} must be a folder path, got {getattr(self, key)!r}")
        for key in ("resolution", "num_inference_steps", "batch_size", "per_target"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"config {key!r} must be a positive integer, got {value!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"config 'seed' must be an integer, got {self.seed!r}")
        if self.limit is not None and (isinstance(self.limit, bool) or not isinstance(self.limit, int) or self.limit < 0):
            raise ValueError(f"config 'limit' must be a non-negative integer or null, got {self.limit!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"config 'precision' must be one of {PRECISIONS}, got {self.precision!r}")
        if not (self.models is None or self.models == "tiny" or isinstance(self.models, dict)):
            raise ValueError(f"config 'models' must be null, 'tiny' or a mapping of ZeSTConfig keys, got {self.models!r}")
        for key in ("composite", "compile"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"config {key!r} must be true or false, got {getattr(self, key)!r}")
        for key, allowed in (("mask_method", MASK_METHODS), ("attention", ATTENTION_BACKENDS),
                             ("plan_change", PLAN_CHANGES)):
            if getattr(self, key) not in allowed:
                raise ValueError(f"config {key!r} must be one of {allowed}, got {getattr(self, key)!r}")
        for key in ("strength", "guidance_scale", "controlnet_conditioning_scale", "ip_adapter_scale"):
            if isinstance(getattr(self, key), bool) or not isinstance(getattr(self, key), (int, float)):
                raise ValueError(f"config {key!r} must be a number, got {getattr(self, key)!r}")

    @classmethod
    def keys(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "GenerationConfig":
        """Build from a mapping; unknown keys raise a `ValueError` that lists them and the known ones."""
        if not isinstance(values, dict):
            raise ValueError(f"a generation config is a mapping, got {type(values).__name__}")
        unknown = sorted(set(values) - set(cls.keys()))
        if unknown:
            raise ValueError(f"unknown generation config keys {unknown}; known keys: {cls.keys()}")
        missing = [k for k in ("task", "targets", "materials", "out") if values.get(k) in (None, "")]
        if missing:
            raise ValueError(f"generation config is missing required keys {missing}")
        return cls(**values)

    @classmethod
    def from_yaml(cls, path: str | os.PathLike, overrides: Sequence[str] = ()) -> "GenerationConfig":
        """Read a YAML config and apply `key=value` overrides (values parsed as YAML; `models.depth=DIR` sets a
        nested key)."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"generation config not found: {path}")
        values = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        if not isinstance(values, dict):
            raise ValueError(f"{path}: a generation config is a YAML mapping")
        return cls.from_dict(apply_overrides(values, overrides))

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.keys()}

    def call_params(self) -> dict[str, Any]:
        """The ZeSTPipeline call parameters (recorded in each output's provenance)."""
        return {
            "num_inference_steps": self.num_inference_steps, "strength": self.strength,
            "guidance_scale": self.guidance_scale, "controlnet_conditioning_scale": self.controlnet_conditioning_scale,
            "ip_adapter_scale": self.ip_adapter_scale, "resolution": self.resolution, "resize": self.resize,
            "composite": self.composite, "precision": self.precision, "mask_method": self.mask_method,
        }

    def decisive(self) -> dict[str, Any]:
        """The keys that decide the outputs (all but `NOT_DECISIVE`)."""
        return {k: v for k, v in self.to_dict().items() if k not in NOT_DECISIVE}

    def fingerprint(self) -> str:
        """Hash of `decisive()`: a resumed job must match it."""
        return hashlib.sha256(json.dumps(self.decisive(), sort_keys=True, default=str).encode()).hexdigest()[:16]


def apply_overrides(values: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Apply `key=value` strings (value parsed as YAML, dotted keys reach into mappings) to a copy of `values`."""
    values = json.loads(json.dumps(values))
    for text in overrides:
        if "=" not in text:
            raise ValueError(f"override {text!r} is not of the form key=value")
        key, raw = text.split("=", 1)
        parts = key.strip().split(".")
        node = values
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[parts[-1]] = yaml.safe_load(raw) if raw.strip() else None
    return values
