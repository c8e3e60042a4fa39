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
from typing import Literal

from detectors.harness.report.feature_map import (
    EMBEDDINGS,
    check_embedding,
    classifier_features,
    clip_features,
    feature_map,
    plot_feature_map,
    sample_sets,
)
from oodforge.args import command_parser, load_config
from pipelines.cli import comma_list
from pipelines.errors import UserInputError
from pipelines.io import safe_name
from pipelines.params import REQUIRED, Config, config, param
from pipelines.runtime import check_model_ref

DOC = "docs/report.md"
"""Where the command's inputs are documented (named in its one-line errors)."""


@config
class FeatureMapConfig(Config):
    """What `oodforge feature-map` maps (docs/report.md); every key has its flag (`FLAGS`)."""

    DOC = DOC

    id: str = param(REQUIRED, "manifest with the ID rows")
    ood: list[str] = param([], "manifests with OOD sets")
    sets: list[str] | None = param(None, "OOD sets to map; null: all")
    model: list[str] = param([], "image classifier folders")
    clip: list[str] = param([], "CLIP hub ids or folders")
    out: str = param(REQUIRED, "output folder")
    images: int = param(200, "random images per set (the paper's 200)")
    seed: int = param(0, "sampling and embedding seed")
    split: str = param("test", "manifest split to sample")
    embedding: Literal[EMBEDDINGS] = param("tsne", "2-D embedding (tsne: scikit-learn)")  # type: ignore[valid-type]
    perplexity: float = param(30.0, "t-SNE perplexity")
    cache_dir: str | None = param(None, "feature cache; null: OUT/cache", runtime=True)
    batch_size: int = param(64, "images per model batch", runtime=True)
    device: str | None = param(None, "torch device; null: the accelerate device", runtime=True)


FLAGS = {"--" + name.replace("_", "-"): name for name in FeatureMapConfig.fields()}
"""The command's flags as shorthands of its config's keys, each the key with dashes (docs/cli.md)."""


def build_parser():
    p = command_parser(__name__, __doc__, dry_run=True)
    p.add_argument("--id", type=Path, help="manifest with the ID rows")
    p.add_argument("--ood", action="append", type=Path, default=None, help="manifest with OOD sets (repeatable)")
    p.add_argument("--sets", type=comma_list, default=None, help="comma-separated OOD sets to map (default: all)")
    p.add_argument("--model", action="append", default=None,
                   help="image classifier folder, e.g. the run's (repeatable)")
    p.add_argument("--clip", action="append", default=None, help="CLIP hub id or folder (repeatable)")
    p.add_argument("--out", type=Path, help="output folder")
    p.add_argument("--images", type=int, default=None, help="random images per set (default 200, as the paper)")
    p.add_argument("--seed", type=int, default=None, help="sampling and embedding seed (default 0)")
    p.add_argument("--split", default=None, help="manifest split to sample (default test)")
    p.add_argument("--embedding", default=None, choices=EMBEDDINGS, help="2-D embedding (default tsne: scikit-learn)")
    p.add_argument("--perplexity", type=float, default=None, help="t-SNE perplexity (default 30)")
    p.add_argument("--cache-dir", type=Path, default=None, help="feature cache (default OUT/cache)")
    p.add_argument("--batch-size", type=int, default=None, help="images per model batch (default 64)")
    p.add_argument("--device", default=None, help="torch device (default: the accelerate device)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    cfg = load_config(FeatureMapConfig, args, FLAGS)
    out = Path(cfg.out)
    if not cfg.model and not cfg.clip:
        raise UserInputError("feature map: give at least one --model (classifier folder) or --clip (CLIP model)")
    if cfg.images < 2:
        raise UserInputError(f"--images: at least 2 images per set, got {cfg.images}")
    for flag, values in (("--model", cfg.model), ("--clip", cfg.clip)):
        for value in values:
            check_model_ref(value, flag)
    check_embedding(cfg.embedding)
    samples = sample_sets(Path(cfg.id), [Path(m) for m in cfg.ood], cfg.images, cfg.seed, cfg.split, cfg.sets)
    print("sets: " + ", ".join(f"{s.name} ({len(s.manifest)})" for s in samples))
    models = ([("classifier", m, classifier_features) for m in cfg.model]
              + [("clip", m, clip_features) for m in cfg.clip])
    if args.dry_run:
        print(f"models: {', '.join(f'{kind} {model}' for kind, model, _ in models)}; embedding {cfg.embedding}")
        print("dry run: every check passed; no model loaded, nothing written")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    cache = Path(cfg.cache_dir) if cfg.cache_dir else out / "cache"
    failed = []
    for kind, model, extract in models:
        try:
            features = extract(model, samples, cache / kind, cfg.batch_size, cfg.device)
        except UserInputError as err:  # this model is the user's fault (say, not cached offline): the others go on
            failed.append(f"{kind} {model}: {err}")
            print(f"feature map: {kind} {model} failed: {err}; the other models go on", file=sys.stderr)
            continue
        points = feature_map(samples, features, cfg.embedding, cfg.seed, cfg.perplexity)
        stem = out / f"feature_map_{kind}_{safe_name(Path(model).name)}"
        points.to_csv(stem.with_suffix(".csv"), index=False)
        label = {"tsne": "t-SNE", "opentsne": "t-SNE (openTSNE)", "umap": "UMAP"}[cfg.embedding]
        title = f"{label} of {kind} features: {Path(model).name} ({cfg.images} images per set)"
        print(f"wrote {plot_feature_map(points, title, stem.with_suffix('.png'))}")
    if failed:
        print(f"error: {len(failed)} of {len(models)} model(s) failed; the maps of the others are written",
              file=sys.stderr)
        return 1
    return 0
