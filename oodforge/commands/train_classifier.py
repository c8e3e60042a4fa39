"""Train an image classifier on an ID manifest: `oodforge train-classifier --config train.yaml [key=value ...]`.

    oodforge train-classifier --config configs/own_data_train.yaml epochs=30
    accelerate launch --num_processes 8 -m oodforge train-classifier --config train.yaml recipe=open-insects-scratch

Keys: id (manifest), out, model (hub id, folder or torchvision ResNet-50 .pth; default microsoft/resnet-50), pretrained,
recipe (open-insects-scratch | open-insects-imagenet | multi-granularity), protocol (open-insects | exact), epochs,
batch_size (global), lr, weight_decay, warmup_epochs, schedule, drop_last, augment, image_size, pre_size, levels, seed,
precision, num_workers, compile, channels_last, sync_bn, cache_hash (docs/training.md).
Writes a model folder that `model:` in eval configs loads, with class_names.json, metrics.json and training.png. A
killed run resumes from its last finished epoch when rerun; a finished one rerun does nothing. `--dry-run` runs every
check the run makes before it loads the model and prints the plan (rows, classes, schedule, new / resumes / up to date)
and its cost: hours of data loading at the measured per-core loader rate, of the model's steps on the device the run
uses (on the CPU one step of the architecture, random weights, timed here), disk (pipelines.training.cost).
"""
from __future__ import annotations

import json

from oodforge.args import command_parser, load_config

DOC = 'docs/training.md'
"""Where the command's inputs are documented (named in its one-line errors)."""
FLAGS = {"--out": "out"}
"""The command's flags as shorthands of its config's keys (docs/cli.md)."""


def build_parser():
    return command_parser(__name__, __doc__, config="required", out=True, dry_run=True)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from pipelines.training.classify import METRICS, check_training, train_classifier
    from pipelines.training.recipes import TrainConfig

    config = load_config(TrainConfig, args, FLAGS)
    if args.dry_run:  # every check the run makes before it loads the model; nothing written
        plan = check_training(config)
        from pipelines.training.cost import training_cost

        print(plan.describe(config) + "\n" + training_cost(config, plan))
        return 0
    out = train_classifier(config)
    from pipelines.runtime import partial_state

    if partial_state().is_main_process:
        top1 = json.loads((out / METRICS).read_text())["top1"]
        print(f"top-1 on ID val {top1['val']}, ID test {top1['test']}")
        print(f"model folder {out} (model, class_names.json, {METRICS}, training.png)")
    return 0
