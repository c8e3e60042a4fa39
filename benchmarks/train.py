#!/usr/bin/env python
"""Classifier training and feature extraction speed against minimal hand-written PyTorch loops (same process, same
model, same images): `python -m benchmarks.train` -> benchmarks/train.json.

    nice python -m benchmarks.train                       # CPU: tiny ResNet-50 stand-in, small images
    python -m benchmarks.train --size full --images 2048 --batch-size 256 --side 256 --workers 8   # on a GPU

Reports images/s of `finetune` (recipe transforms, accelerate loop) and of `extract_features`, each with its ratio to
the hand-written loop (goal >= 1.0), the data loader's capacity, the share of time decoding images and peak RSS.
"""
from __future__ import annotations

import json
import platform
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from pipelines.cli import parser, run_main
from pipelines.io import atomic_write_json


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__, out=True)
    p.add_argument("--size", choices=("tiny", "full"), default="tiny", help="ResNet-50 stand-in size (random weights)")
    p.add_argument("--images", type=int, default=96)
    p.add_argument("--side", type=int, default=96, help="side of the synthetic JPEG images")
    p.add_argument("--image-size", type=int, default=64, help="training crop / model input size")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--precision", default="auto")
    p.add_argument("--repeats", type=int, default=2, help="interleaved runs of each loop; the best time counts")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    args = p.parse_args(argv)
    out = Path(args.out or Path(__file__).with_suffix(".json"))
    from benchmarks.cases.train import measure, synthetic_manifest
    from pipelines.runtime import resolve_device

    device = resolve_device()
    if args.threads:
        torch.set_num_threads(args.threads)
    classifier = _classifier(args.size, args.image_size)
    with tempfile.TemporaryDirectory() as scratch:
        manifest = synthetic_manifest(Path(scratch), args.images, args.side)
        numbers = measure(classifier, manifest, epochs=args.epochs, batch_size=args.batch_size,
                          num_workers=args.workers,
                          precision=args.precision, channels_last=device.type == "cuda", device=device,
                          repeats=args.repeats)
    write_result(out, "train", device, args, numbers)
    return 0


def write_result(out: Path, benchmark: str, device: torch.device, args: Any, numbers: dict[str, Any]) -> None:
    """benchmarks/<name>.json: what ran where (device, torch, threads, the stand-in's size, the settings) and the
    numbers; the numbers printed."""
    result = {"benchmark": benchmark, "created": datetime.now(UTC).isoformat(timespec="seconds"),
              "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
              "torch": torch.__version__, "threads": torch.get_num_threads(),
              "model": f"microsoft/resnet-50 ({args.size})",
              "settings": {k: v for k, v in vars(args).items() if k not in ("out", "debug")}, **numbers}
    atomic_write_json(out, result)
    print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in numbers.items()}, indent=1))
    print(f"wrote {out}")


def _classifier(size: str, image_size: int):
    """A random-weight ResNet-50 (real config, or the tiny stand-in) with 4 classes and its processor at image_size."""
    from transformers import AutoImageProcessor

    from pipelines.classifier import ImageClassifier
    from pipelines.tiny import RESNET_ID, build_model, full_config, tiny_config

    config = (tiny_config if size == "tiny" else full_config)(RESNET_ID)
    config = {k: v for k, v in config.items() if k != "num_labels"}
    config = {**config, "id2label": {str(i): f"c{i}" for i in range(4)}, "label2id": {f"c{i}": i for i in range(4)}}
    torch.manual_seed(0)
    model = build_model(config)
    with tempfile.TemporaryDirectory() as scratch:
        processor_config = {**full_config(RESNET_ID, "preprocessor_config.json"), "size": {"shortest_edge": image_size}}
        (Path(scratch) / "preprocessor_config.json").write_text(json.dumps(processor_config))
        processor = AutoImageProcessor.from_pretrained(scratch)
    return ImageClassifier.from_model(model, processor, f"resnet-50-{size}")


if __name__ == "__main__":
    sys.exit(run_main(main, doc="README.md, section 'Commands'"))
