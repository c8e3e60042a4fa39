"""Tiny random-weight stand-ins for a CPU run, the same the tests use (`pipelines.tiny`): `oodforge make-tiny KIND --out
DIR`.

    oodforge make-tiny classifier --out models/tiny_resnet --labels 3   # model: of evaluate / train-classifier
    oodforge make-tiny clip --out models/tiny_clip                      # CLIP detectors' model:, --clip
    oodforge make-tiny zest --out models/tiny_zest                      # oodforge generate models.base=... (printed)
    oodforge make-tiny diffguard-unet --out models/tiny_unet            # diffguard params unet_id:

Each is the real hub model's configuration (microsoft/resnet-50, openai/clip-vit-base-patch16, the SDXL / ControlNet /
IP-Adapter / DPT set of ZeST) with only its sizes shrunk, random weights, saved in the real folder layout: every
folder loads wherever the real id or a local folder is accepted. Their scores and images mean nothing; they make
the whole pipeline run in seconds on a CPU. `zest` prints the `models.*` overrides of a generation config
(`models.base=DIR/sdxl models.controlnet=DIR/controlnet models.ip_adapter=DIR/ip_adapter models.depth=DIR/depth`).
`--labels N`: the classifier's number of outputs (default: the tiny config's).
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal

from oodforge.args import command_parser, load_config, parse
from pipelines.io import umask_modes
from pipelines.params import REQUIRED, Config, config, param

DOC = "README.md, section 'Your own data'"
"""Where the command's inputs are documented (named in its one-line errors)."""

KINDS = ("classifier", "clip", "zest", "diffguard-unet")


@config
class MakeTinyConfig(Config):
    """Which stand-in `oodforge make-tiny` writes; every key has its flag or argument (`FLAGS`)."""

    DOC = DOC

    kind: Literal[KINDS] = param(REQUIRED, "which stand-in")  # type: ignore[valid-type]
    out: str = param(REQUIRED, "output folder")
    labels: int | None = param(None, "classifier: number of outputs; null: the tiny config's")
    seed: int = param(0, "seed of the random weights")


FLAGS = {"KIND": "kind", "--out": "out", "--labels": "labels", "--seed": "seed"}
"""The command's flags (and its argument KIND) as shorthands of its config's keys (docs/cli.md)."""


def make(kind: str, out: Path, labels: int | None = None, seed: int = 0) -> str:
    """Write the stand-in `kind` into `out`; returns how to use it (one line)."""
    from pipelines import tiny

    if kind == "classifier":
        tiny.save_tiny_model(out, tiny.RESNET_ID, seed=seed, labels=labels)
        return f"model: {out}   (oodforge evaluate / train-classifier, `pretrained: false` to train from its config)"
    if kind == "clip":
        tiny.save_tiny_clip(out, seed=seed)
        return f"model: {out}   (CLIP detectors; oodforge curate-containers --clip {out})"
    if kind == "zest":
        from gen.tiny_zest import save_tiny_zest

        zest = save_tiny_zest(out, seed=seed)
        parts = ("base", "controlnet", "ip_adapter", "depth")
        return " ".join(f"models.{k}={getattr(zest, k)}" for k in parts) + "   (oodforge generate overrides)"
    tiny.save_tiny_pixel_unet(out, seed=seed)
    return f"unet_id: {out}   (diffguard params, backend pixel)"


def build_parser():
    p = command_parser(__name__, __doc__, out=True)
    p.add_argument("kind", nargs="?", choices=KINDS, help="which stand-in")
    p.add_argument("--labels", type=int, default=None, help="classifier: number of outputs")
    p.add_argument("--seed", type=int, default=None, help="seed of the random weights (default 0)")
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = load_config(MakeTinyConfig, parse(p, argv, intermixed=True), FLAGS)
    if args.labels is not None and (args.kind != "classifier" or args.labels < 1):
        p.error("--labels takes a positive number and belongs to the classifier")
    out = Path(args.out)
    with umask_modes(out):  # the libraries' own writers make weights 0600: the umask decides
        usage = make(args.kind, out, args.labels, args.seed)
    print(f"wrote {args.kind} stand-in {args.out}: {usage}")
    return 0
