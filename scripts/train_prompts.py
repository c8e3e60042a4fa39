"""Train learned-prompt CLIP detectors (LoCoOp, ID-like) for each shots x seed and save each as a detector folder
(`config.json` + `model.safetensors`) that `Detector.from_pretrained(folder, model=...)` reloads.

    python scripts/train_prompts.py --config configs/clip_prompts.yaml
    python scripts/train_prompts.py --config configs/clip_prompts.yaml --shots 1 16 --seeds 1 2 3 --epochs 50 --lr 0.002
"""
from __future__ import annotations

import argparse

import yaml

from detectors.clip.fewshot import train_prompt_detectors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="YAML: model, manifest, class_names(_file), methods, shots, seeds, out_dir")
    parser.add_argument("--shots", type=int, nargs="+", help="override `shots`")
    parser.add_argument("--seeds", type=int, nargs="+", help="override `seeds`")
    parser.add_argument("--epochs", type=int, help="override every method's epochs")
    parser.add_argument("--lr", type=float, help="override every method's learning rate")
    parser.add_argument("--out-dir", help="override `out_dir`")
    args = parser.parse_args()
    with open(args.config, encoding="utf-8") as f:
        config = yaml.safe_load(f) or {}
    config.update({k: v for k, v in (("shots", args.shots), ("seeds", args.seeds), ("out_dir", args.out_dir)) if v})
    methods = {name: dict(params or {}) for name, params in (config.get("methods") or {"locoop": {}, "idlike": {}}).items()}
    for params in methods.values():
        params.update({k: v for k, v in (("epochs", args.epochs), ("lr", args.lr)) if v is not None})
    config["methods"] = methods
    for folder in train_prompt_detectors(config):
        print(folder)


if __name__ == "__main__":
    main()
