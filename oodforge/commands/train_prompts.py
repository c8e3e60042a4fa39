"""Train learned-prompt CLIP detectors (LoCoOp, ID-like) for each shots x seed and save each as a detector folder
(`config.json` + `model.safetensors`) that `Detector.from_pretrained(folder, model=...)` reloads.

    oodforge train-prompts --config configs/clip_prompts.yaml
    oodforge train-prompts --config configs/clip_prompts.yaml --shots 1 16 --seeds 1 2 3 --epochs 50 --lr 0.002
    oodforge train-prompts --config configs/clip_prompts.yaml shots=[1] methods.locoop.epochs=5 --dry-run
"""
from __future__ import annotations

from typing import Any

from detectors.clip.fewshot import DEFAULT_METHODS, runs_of, train_prompt_detectors
from oodforge.args import command_parser, load_config
from pipelines.cli import README_SECTIONS
from pipelines.params import REQUIRED, Config, config, param

DOC = README_SECTIONS["prompts"]
"""Where the command's inputs are documented (named in its one-line errors)."""


@config
class TrainPromptsConfig(Config):
    """The prompt-training sweep: every key typed; `sweep()` is the mapping `detectors.clip.fewshot` trains from."""

    DOC = DOC

    manifest: str = param(REQUIRED, "the manifest whose ID rows of `train_split` train the prompts")
    out_dir: str = param(REQUIRED, "where each detector folder <method>-<shots>shot-seed<seed> is saved")
    model: str | None = param(None, "the CLIP model (hub id or folder); null: the CLIP default")
    class_names: list[str] | None = param(None, "class names of the prompts; null: class_names_file or the manifest's")
    class_names_file: str | None = param(None, "a file with one class name a line")
    methods: dict[str, dict[str, Any]] | None = param(None, "method -> parameter overrides; null: locoop and idlike")
    shots: list[int] | None = param(None, "shots per class; null: 16")
    seeds: list[int] | None = param(None, "seeds of each shots value; null: [1]")
    epochs: int | None = param(None, "every method's epochs (over `methods`); null: each method's")
    lr: float | None = param(None, "every method's learning rate (over `methods`); null: each method's")
    train_split: str = param("train", "the split whose ID rows train")
    test_split: str = param("test", "the split the sweep tests on")
    device: str | None = param(None, "torch device (cpu, cuda, cuda:N); null: auto", runtime=True)
    cache_dir: str | None = param(None, "the CLIP feature cache; null: none", runtime=True)

    def sweep(self) -> dict[str, Any]:
        """The sweep's mapping for `detectors.clip.fewshot`: the keys set (null ones left to its defaults), `epochs`
        and `lr` laid over every method's parameters."""
        common = {k: v for k, v in (("epochs", self.epochs), ("lr", self.lr)) if v is not None}
        methods = {name: {**(params or {}), **common} for name, params in (self.methods or DEFAULT_METHODS).items()}
        plain = {k: v for k, v in self.to_dict().items() if v is not None and k not in ("epochs", "lr")}
        return {**plain, "methods": methods}


FLAGS = {"--shots": "shots", "--seeds": "seeds", "--epochs": "epochs", "--lr": "lr", "--out": "out_dir"}
"""The command's flags as shorthands of its config's keys (docs/cli.md)."""


def build_parser():
    p = command_parser(__name__, __doc__, config="required", out=True, dry_run=True)
    p.add_argument("--shots", type=int, nargs="+", help="override `shots`")
    p.add_argument("--seeds", type=int, nargs="+", help="override `seeds`")
    p.add_argument("--epochs", type=int, help="override every method's epochs")
    p.add_argument("--lr", type=float, help="override every method's learning rate")
    return p


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    sweep = load_config(TrainPromptsConfig, args, FLAGS).sweep()
    if args.dry_run:
        runs = runs_of(sweep)
        print(f"{len(runs)} run(s) -> {sweep['out_dir']}")
        for method, overrides, shots, seed in runs:
            print(f"  {method} shots={shots} seed={seed} {overrides}")
        return
    for folder in train_prompt_detectors(sweep):
        print(folder)
