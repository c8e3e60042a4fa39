"""Convert a released CLIPN checkpoint (open_clip layout with the "no" text tower) to a transformers CLIPModel
folder (`OUT/clip`) plus a `clipn` detector folder (`OUT`) loadable with `Detector.from_pretrained(OUT)`.

    python scripts/convert_clipn.py CLIPN_ATD_Repeat2_epoch_10.pt out/clipn --processor openai/clip-vit-base-patch16
"""
from __future__ import annotations

import argparse

from detectors.clip.clipn_convert import convert_clipn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", help="CLIPN .pt checkpoint (a state dict or {'state_dict': ...}, DDP prefixes ok)")
    parser.add_argument("out_dir")
    parser.add_argument("--processor", help="CLIPProcessor hub id or folder to save beside the model (the tokenizer is CLIP's BPE)")
    parser.add_argument("--head-width", type=int, default=64, help="attention head width (open_clip: 64)")
    parser.add_argument("--quick-gelu", action="store_true", help="the checkpoint was trained with QuickGELU (OpenAI weights)")
    parser.add_argument("--class-names-file", help="ID class names, one per line, stored in the detector config")
    args = parser.parse_args()
    class_names = None
    if args.class_names_file:
        from detectors.clip.neglabel import read_words

        class_names = read_words(args.class_names_file)
    print(convert_clipn(args.checkpoint, args.out_dir, args.processor, args.head_width, args.quick_gelu, class_names))


if __name__ == "__main__":
    main()
