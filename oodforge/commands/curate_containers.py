"""ShiftedBronzes' container set from ImageNet-21K folders: `oodforge curate-containers --imagenet21k ROOT --out DIR`.

    oodforge curate-containers --imagenet21k /data/imagenet21k --out data/containers --dry-run
    oodforge curate-containers --imagenet21k /data/imagenet21k --out data/containers --filter
    oodforge curate-containers --imagenet21k /data/imagenet21k --out data/containers \\
        --roots vessel.n.03,dish.n.01,cup.n.01,glass.n.02 --filter --threshold 0.6 --clip /models/clip

ROOT holds one folder per wnid (`n03147509/*.jpg`). Categories: the wnids under `--roots` by WordNet 3.0 hyponymy
(default vessel.n.03, dish.n.01, cup.n.01, glass.n.02, basket.n.01: 224 synsets; container.n.01 would add every
wheeled vehicle, which WordNet files under container) or exactly
`--categories` (wnids, senses such as cup.n.01, or nouns), minus ImageNet-1K's 1,000 categories (`--keep-imagenet1k`
keeps them). `--filter` drops the images where the container is a secondary instance: CLIP zero-shot, "a photo of a
{}." against "a photo of a person holding a {}." and each other `--secondary` prompt; an image whose smallest two-way
softmax share of the main prompt is below `--threshold` (default 0.5: every secondary prompt loses) is dropped. Writes
DIR/metadata.jsonl (ood_set container, group hard; images stay in ROOT), categories.csv, categories.png (Figure 2(b)),
dropped.csv and curation.json. WordNet: Debian's wordnet-base (`--wordnet-dir`).
"""
from __future__ import annotations

from typing import Any

from oodforge.args import command_parser, load_config
from pipelines.cli import comma_list

DOC = "README.md, section 'Your own data'"
"""Where the command's inputs are documented (named in its one-line errors)."""


def clip_scorer(model: str):
    """The filter's CLIP through the project's one CLIP path (`ClipBackbone`)."""
    import torch

    from detectors.clip.backbone import ClipBackbone
    from pipelines.curation.containers import ClipScorer

    backbone = ClipBackbone.load(model)

    def encode_images(images: list[Any]):
        with torch.inference_mode(), backbone.autocast():
            embedded, _ = backbone.image_embeddings(backbone.preprocess(images), local=False)
        return torch.nn.functional.normalize(embedded.float(), dim=-1).cpu().numpy()

    return ClipScorer(encode_images, lambda texts: backbone.encode_texts(texts).cpu().numpy(), backbone.logit_scale,
                      backbone.model_id)


FILTER = {"--clip": "filter.model", "--threshold": "filter.threshold", "--main": "filter.main",
          "--secondary": "filter.secondary", "--batch-size": "filter.batch_size"}
"""The secondary-instance filter's flags (with --filter only)."""
FLAGS = {"--imagenet21k": "imagenet21k", "--roots": "roots", "--categories": "categories",
         "--keep-imagenet1k": "keep_imagenet1k", "--wordnet-dir": "wordnet_dir", "--ood-set": "ood_set",
         "--filter": "filter", **FILTER}
"""The command's flags as shorthands of its config's keys (docs/cli.md); --out is the run's, not the config's."""


def build_parser():
    p = command_parser(__name__, __doc__, out=True, dry_run=True)
    p.add_argument("--imagenet21k", default=None, help="ImageNet-21K folder: one folder per wnid")
    p.add_argument("--roots", type=comma_list, default=None,
                   help="comma-separated root synsets (default vessel.n.03,dish.n.01,cup.n.01,glass.n.02,basket.n.01)")
    p.add_argument("--categories", type=comma_list, default=None, help="comma-separated categories instead of --roots")
    p.add_argument("--keep-imagenet1k", action="store_true", default=None, help="keep ImageNet-1K's categories")
    p.add_argument("--wordnet-dir", default=None, help="WordNet 3.0 database folder (default: the system's)")
    p.add_argument("--ood-set", default=None, help="ood_set of the rows (default container)")
    p.add_argument("--filter", action="store_true", default=None,
                   help="drop images where the container is a secondary instance")
    p.add_argument("--clip", default=None,
                   help="the filter's CLIP model, hub id or folder (default openai/clip-vit-base-patch16)")
    p.add_argument("--threshold", type=float, default=None,
                   help="least two-way share of the main prompt against each secondary one (default 0.5)")
    p.add_argument("--main", default=None, help="main prompt, '{}' = the category (default 'a photo of a {}.')")
    p.add_argument("--secondary", action="append", default=None,
                   help="a secondary prompt (repeatable; replaces the defaults)")
    p.add_argument("--batch-size", type=int, default=None, help="images per CLIP batch (default 64)")
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if args.out is None:
        p.error("--out is required")
    from pipelines.curation.containers import ContainerCuration, choose_categories, curate, tree_wnids
    from pipelines.curation.wordnet import Nouns

    if not args.filter and any(getattr(args, f.lstrip("-").replace("-", "_")) is not None for f in FILTER):
        p.error("--clip, --threshold, --main, --secondary and --batch-size belong to --filter")
    cfg = load_config(ContainerCuration, args, FLAGS, {"--filter": lambda on: {}})
    if args.dry_run:
        from pathlib import Path

        chosen, record = choose_categories(cfg, Nouns.load(cfg.wordnet_dir), tree_wnids(Path(cfg.imagenet21k)))
        print(f"{len(chosen)} categories ({record['in_tree']} in the tree, {len(record['imagenet1k_removed'])} "
              f"ImageNet-1K ones removed): {' '.join(chosen)}")
        return 0
    record = curate(cfg, args.out, clip_scorer(cfg.filter.model) if cfg.filter is not None else None)
    print(f"{record['images_kept']} images in {record['chosen']} categories ({record['images_dropped']} dropped, "
          f"{len(record['imagenet1k_removed'])} ImageNet-1K categories removed) -> {args.out}")
    return 0
