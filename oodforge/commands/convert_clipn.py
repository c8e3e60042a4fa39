"""Convert a released CLIPN checkpoint (open_clip layout with the "no" text tower) to a transformers CLIPModel
folder (`OUT/clip`) plus a `clipn` detector folder (`OUT`) loadable with `Detector.from_pretrained(OUT)`.

    oodforge convert-clipn CLIPN_ATD_Repeat2_epoch_10.pt --out out/clipn --processor openai/clip-vit-base-patch16
"""
from __future__ import annotations

from pathlib import Path

from oodforge.args import command_parser, load_config, parse
from pipelines.cli import README_SECTIONS
from pipelines.params import REQUIRED, Config, config, param

DOC = README_SECTIONS["prompts"]
"""Where the command's inputs are documented (named in its one-line errors)."""


@config
class ConvertClipnConfig(Config):
    """What `oodforge convert-clipn` converts; every key has its flag or argument (`FLAGS`)."""

    DOC = DOC

    checkpoint: str = param(REQUIRED, "CLIPN .pt checkpoint")
    out: str = param(REQUIRED, "output folder (the detector; the CLIP model in OUT/clip)")
    processor: str | None = param(None, "CLIPProcessor hub id or folder to save beside the model")
    head_width: int = param(64, "attention head width (open_clip: 64)")
    quick_gelu: bool = param(False, "the checkpoint was trained with QuickGELU (OpenAI weights)")
    class_names_file: str | None = param(None, "ID class names, one per line, stored in the detector config")


FLAGS = {"CHECKPOINT": "checkpoint", "--out": "out", "--processor": "processor", "--head-width": "head_width",
         "--quick-gelu": "quick_gelu", "--class-names-file": "class_names_file"}
"""The command's flags (and its argument CHECKPOINT) as shorthands of its config's keys (docs/cli.md)."""


def build_parser():
    p = command_parser(__name__, __doc__)
    p.add_argument("checkpoint", type=Path, nargs="?",
                   help="CLIPN .pt checkpoint (a state dict or {'state_dict': ...}, DDP prefixes ok)")
    p.add_argument("--out", type=Path, help="output folder (the detector; the CLIP model in OUT/clip)")
    p.add_argument("--processor",
                   help="CLIPProcessor hub id or folder to save beside the model (the tokenizer is CLIP's BPE)")
    p.add_argument("--head-width", type=int, default=None, help="attention head width (open_clip: 64)")
    p.add_argument("--quick-gelu", action="store_true", default=None,
                   help="the checkpoint was trained with QuickGELU (OpenAI weights)")
    p.add_argument("--class-names-file", type=Path, help="ID class names, one per line, stored in the detector config")
    return p


def main(argv: list[str] | None = None) -> None:
    args = load_config(ConvertClipnConfig, parse(build_parser(), argv, intermixed=True), FLAGS)
    if not Path(args.checkpoint).is_file():
        raise FileNotFoundError(f"{args.checkpoint}: no such checkpoint file")
    from detectors.clip.clipn_convert import convert_clipn

    class_names = None
    if args.class_names_file:
        from detectors.clip.neglabel import read_words

        class_names = read_words(args.class_names_file)
    print(convert_clipn(str(args.checkpoint), str(args.out), args.processor, args.head_width, args.quick_gelu,
                        class_names))
