"""Feature maps of the data types (ShiftedBronzes Figure 2(c)):
`oodforge feature-map --id data/id --ood data/ood --model runs/clf --clip openai/clip-vit-base-patch16 --out fmap`.

Samples `--images` random images (seeded) of the ID test rows and of each OOD set, takes the features of each model (an
image classifier folder's penultimate layer with `--model`, CLIP's image embedding with `--clip`), embeds them together
in 2-D (t-SNE; `--embedding opentsne` or `umap` when installed) and writes one PNG and one CSV of coordinates per model.
Features are cached by content under `--cache-dir` and reused on the next run. Model paths and the embedding's package
are checked before any work; a model that cannot be loaded is reported and the others go on (exit 1). `--dry-run`
runs the checks, samples the sets and prints them; no model is loaded.
"""
from __future__ import annotations

import sys
from pathlib import Path

from detectors.harness.report.feature_map import (
    EMBEDDINGS,
    check_embedding,
    classifier_features,
    clip_features,
    feature_map,
    plot_feature_map,
    sample_sets,
)
from oodforge.args import command_parser, deprecated, parse
from pipelines.cli import comma_list
from pipelines.errors import UserInputError
from pipelines.io import safe_name
from pipelines.runtime import check_model_ref

DOC = "docs/report.md"
"""Where the command's inputs are documented (named in its one-line errors)."""


def build_parser():
    p = command_parser(__name__, __doc__, dry_run=True)
    p.add_argument("--id", required=True, type=Path, help="manifest with the ID rows")
    p.add_argument("--ood", action="append", type=Path, default=[], help="manifest with OOD sets (repeatable)")
    p.add_argument("--sets", type=comma_list, default=None, help="comma-separated OOD sets to map (default: all)")
    p.add_argument("--model", action="append", default=[], help="image classifier folder, e.g. the run's (repeatable)")
    p.add_argument("--clip", action="append", default=[], help="CLIP hub id or folder (repeatable)")
    p.add_argument("--out", required=True, type=Path, help="output folder")
    p.add_argument("--images", type=int, default=200, help="random images per set (default 200, as the paper)")
    p.add_argument("--seed", type=int, default=0, help="sampling and embedding seed (default 0)")
    p.add_argument("--split", default="test", help="manifest split to sample (default test)")
    p.add_argument("--embedding", default="tsne", choices=EMBEDDINGS, help="2-D embedding (default tsne: scikit-learn)")
    p.add_argument("--perplexity", type=float, default=30.0, help="t-SNE perplexity (default 30)")
    p.add_argument("--cache-dir", type=Path, default=None, help="feature cache (default OUT/cache)")
    p.add_argument("--batch-size", type=int, default=64, help="images per model batch (default 64)")
    p.add_argument("--device", default=None, help="torch device (default: the accelerate device)")
    deprecated(p, "--n", "--images")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parse(build_parser(), argv)
    if not args.model and not args.clip:
        raise UserInputError("feature map: give at least one --model (classifier folder) or --clip (CLIP model)")
    if args.images < 2:
        raise UserInputError(f"--images: at least 2 images per set, got {args.images}")
    for flag, values in (("--model", args.model), ("--clip", args.clip)):
        for value in values:
            check_model_ref(value, flag)
    check_embedding(args.embedding)
    samples = sample_sets(args.id, args.ood, args.images, args.seed, args.split, args.sets)
    print("sets: " + ", ".join(f"{s.name} ({len(s.manifest)})" for s in samples))
    models = ([("classifier", m, classifier_features) for m in args.model]
              + [("clip", m, clip_features) for m in args.clip])
    if args.dry_run:
        print(f"models: {', '.join(f'{kind} {model}' for kind, model, _ in models)}; embedding {args.embedding}")
        print("dry run: every check passed; no model loaded, nothing written")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    cache = args.cache_dir or args.out / "cache"
    failed = []
    for kind, model, extract in models:
        try:
            features = extract(model, samples, cache / kind, args.batch_size, args.device)
        except UserInputError as err:  # this model is the user's fault (say, not cached offline): the others go on
            failed.append(f"{kind} {model}: {err}")
            print(f"feature map: {kind} {model} failed: {err}; the other models go on", file=sys.stderr)
            continue
        points = feature_map(samples, features, args.embedding, args.seed, args.perplexity)
        stem = args.out / f"feature_map_{kind}_{safe_name(Path(model).name)}"
        points.to_csv(stem.with_suffix(".csv"), index=False)
        label = {"tsne": "t-SNE", "opentsne": "t-SNE (openTSNE)", "umap": "UMAP"}[args.embedding]
        title = f"{label} of {kind} features: {Path(model).name} ({args.images} images per set)"
        print(f"wrote {plot_feature_map(points, title, stem.with_suffix('.png'))}")
    if failed:
        print(f"error: {len(failed)} of {len(models)} model(s) failed; the maps of the others are written",
              file=sys.stderr)
        return 1
    return 0
