#!/usr/bin/env python
"""Tiny random-weight stand-ins for a CPU run, the same the tests use (`pipelines.tiny`): `python scripts/make_tiny.py KIND --out DIR`.

    python scripts/make_tiny.py classifier --out models/tiny_resnet --labels 3   # model: / train_classifier model:
    python scripts/make_tiny.py clip --out models/tiny_clip                      # CLIP detectors' model:, --clip
    python scripts/make_tiny.py zest --out models/tiny_zest                      # generate.py models.base=... (printed)
    python scripts/make_tiny.py diffguard-unet --out models/tiny_unet            # diffguard params unet_id:

Each is the real hub model's configuration (microsoft/resnet-50, openai/clip-vit-base-patch16, the SDXL / ControlNet /
IP-Adapter / DPT set of ZeST) with only its sizes shrunk, random weights, saved in the real folder layout: every
folder loads wherever the real id or a local folder is accepted. Their scores and images mean nothing; they make
the whole pipeline run in seconds on a CPU. `zest` prints the `models.*` overrides of a generation config
(`models.base=DIR/sdxl models.controlnet=DIR/controlnet models.ip_adapter=DIR/ip_adapter models.depth=DIR/depth`).
`--labels N`: the classifier's number of outputs (default: the tiny config's).
"""
from __future__ import annotations

import sys
from pathlib import Path

from pipelines.cli import parser, run_main
from pipelines.io import umask_modes

KINDS = ("classifier", "clip", "zest", "diffguard-unet")


def make(kind: str, out: Path, labels: int | None = None, seed: int = 0) -> str:
    """Write the stand-in `kind` into `out`; returns how to use it (one line)."""
    from pipelines import tiny

    if kind == "classifier":
        tiny.save_tiny_model(out, tiny.RESNET_ID, seed=seed, labels=labels)
        return f"model: {out}   (evaluate / train_classifier, `pretrained: false` to train from its config)"
    if kind == "clip":
        tiny.save_tiny_clip(out, seed=seed)
        return f"model: {out}   (CLIP detectors; curate_containers.py --clip {out})"
    if kind == "zest":
        zest = tiny.save_tiny_zest(out, seed=seed)
        parts = ("base", "controlnet", "ip_adapter", "depth")
        return " ".join(f"models.{k}={getattr(zest, k)}" for k in parts) + "   (generate.py overrides)"
    tiny.save_tiny_pixel_unet(out, seed=seed)
    return f"unet_id: {out}   (diffguard params, backend pixel)"


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__, out=True)
    p.add_argument("kind", choices=KINDS, help="which stand-in")
    p.add_argument("--labels", type=int, default=None, help="classifier: number of outputs")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")
    args = p.parse_args(argv)
    if args.out is None:
        p.error("--out is required")
    if args.labels is not None and (args.kind != "classifier" or args.labels < 1):
        p.error("--labels takes a positive number and belongs to the classifier")
    with umask_modes(args.out):  # the libraries' own writers make weights 0600: the umask decides
        usage = make(args.kind, args.out, args.labels, args.seed)
    print(f"wrote {args.kind} stand-in {args.out}: {usage}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, doc="README.md, section 'Your own data'"))
