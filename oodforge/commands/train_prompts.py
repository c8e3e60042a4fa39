"""Train learned-prompt CLIP detectors (LoCoOp, ID-like) for each shots x seed and save each as a detector folder
(`config.json` + `model.safetensors`) that `Detector.from_pretrained(folder, model=...)` reloads.

    oodforge train-prompts --config configs/clip_prompts.yaml
    oodforge train-prompts --config configs/clip_prompts.yaml --shots 1 16 --seeds 1 2 3 --epochs 50 --lr 0.002
    oodforge train-prompts --config configs/clip_prompts.yaml shots=[1] methods.locoop.epochs=5 --dry-run
"""
from __future__ import annotations

from typing import Any

from detectors.clip.fewshot import DEFAULT_METHODS, runs_of, train_prompt_detectors
from oodforge.args import command_parser
from pipelines.cli import README_SECTIONS, check_keys
from pipelines.configfile import load_yaml

DOC = README_SECTIONS["prompts"]
CONFIG_KEYS = ("model", "manifest", "class_names", "class_names_file", "methods", "shots", "seeds", "out_dir",
               "train_split", "test_split", "device", "cache_dir")


def build_parser():
    p = command_parser(__name__, __doc__, config="required", out=True, dry_run=True)
    p.add_argument("--shots", type=int, nargs="+", help="override `shots`")
    p.add_argument("--seeds", type=int, nargs="+", help="override `seeds`")
    p.add_argument("--epochs", type=int, help="override every method's epochs")
    p.add_argument("--lr", type=float, help="override every method's learning rate")
    return p


def sweep_config(argv: list[str] | None) -> tuple[dict[str, Any], bool]:
    """The config after the overrides (`key=value`, then the flags) and whether this is a dry run."""
    args = build_parser().parse_args(argv)
    config = check_keys(load_yaml(args.config, args.overrides), CONFIG_KEYS, str(args.config), DOC)
    config.update({k: v for k, v in (("shots", args.shots), ("seeds", args.seeds), ("out_dir", args.out)) if v})
    if config.get("out_dir") is not None:
        config["out_dir"] = str(config["out_dir"])
    methods = {name: dict(params or {}) for name, params in (config.get("methods") or DEFAULT_METHODS).items()}
    for params in methods.values():
        params.update({k: v for k, v in (("epochs", args.epochs), ("lr", args.lr)) if v is not None})
    config["methods"] = methods
    return config, args.dry_run


def main(argv: list[str] | None = None) -> None:
    config, dry_run = sweep_config(argv)
    if dry_run:
        runs = runs_of(config)
        print(f"{len(runs)} run(s) -> {config.get('out_dir')}")
        for method, overrides, shots, seed in runs:
            print(f"  {method} shots={shots} seed={seed} {overrides}")
        return
    for folder in train_prompt_detectors(config):
        print(folder)
