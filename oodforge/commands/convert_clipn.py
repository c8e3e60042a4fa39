"""Convert a released CLIPN checkpoint (open_clip layout with the "no" text tower) to a transformers CLIPModel
folder (`OUT/clip`) plus a `clipn` detector folder (`OUT`) loadable with `Detector.from_pretrained(OUT)`.

    oodforge convert-clipn CLIPN_ATD_Repeat2_epoch_10.pt --out out/clipn --processor openai/clip-vit-base-patch16
"""
from __future__ import annotations

from pathlib import Path

from oodforge.args import command_parser, parse
from pipelines.cli import README_SECTIONS

DOC = README_SECTIONS["prompts"]
"""Where the command's inputs are documented (named in its one-line errors)."""


def build_parser():
    p = command_parser(__name__, __doc__)
    p.add_argument("checkpoint", type=Path,
                   help="CLIPN .pt checkpoint (a state dict or {'state_dict': ...}, DDP prefixes ok)")
    p.add_argument("--out", type=Path, required=True, help="output folder (the detector; the CLIP model in OUT/clip)")
    p.add_argument("--processor",
                   help="CLIPProcessor hub id or folder to save beside the model (the tokenizer is CLIP's BPE)")
    p.add_argument("--head-width", type=int, default=64, help="attention head width (open_clip: 64)")
    p.add_argument("--quick-gelu", action="store_true",
                   help="the checkpoint was trained with QuickGELU (OpenAI weights)")
    p.add_argument("--class-names-file", type=Path, help="ID class names, one per line, stored in the detector config")
    return p


def main(argv: list[str] | None = None) -> None:
    args = parse(build_parser(), argv, intermixed=True)
    if not args.checkpoint.is_file():
        raise FileNotFoundError(f"{args.checkpoint}: no such checkpoint file")
    from detectors.clip.clipn_convert import convert_clipn

    class_names = None
    if args.class_names_file:
        from detectors.clip.neglabel import read_words

        class_names = read_words(args.class_names_file)
    print(convert_clipn(str(args.checkpoint), str(args.out), args.processor, args.head_width, args.quick_gelu,
                        class_names))
