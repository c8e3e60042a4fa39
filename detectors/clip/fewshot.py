"""Few-shot training of the learned-prompt detectors: each (method, shots, seed) of a config trains on a few shots per
class of the ID rows and saves its detector folder (`train_prompt_detectors`, the train-prompts command); the sweep that
scores them and plots the metrics against shots is the harness's (`detectors.harness.fewshot`).

Config (a dict, e.g. the `fewshot:` section of an evaluation YAML):
    model: openai/clip-vit-base-patch16     # hub id or folder
    manifest: data/bronzes                  # ImageFolder manifest (split, role, ood_set, group, label)
    class_names: [ding, gui, ...]           # or class_names_file: one name per line (index = label)
    train_split: train                      # ID rows of this split are the training pool
    test_split: test                        # ID and OOD rows of this split are scored
    methods: {locoop: {}, idlike: {}}       # detector name -> parameter overrides
    shots: [1, 2, 4, 8, 16]
    seeds: [1, 2, 3]
    out_dir: results/fewshot                # optional: trained detector folders and fewshot.csv
    cache_dir: null                         # optional: CLIP feature cache folder (default ~/.cache/oodforge/clip)
    device: null                            # optional: e.g. cuda:0 (default: GPU when present)
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

DEFAULT_SHOTS = (1, 2, 4, 8, 16)
DEFAULT_METHODS = {"locoop": {}, "idlike": {}}


def class_names_from(config: dict[str, Any]) -> list[str]:
    """`class_names`, else the lines of `class_names_file`."""
    if config.get("class_names"):
        return list(config["class_names"])
    if config.get("class_names_file"):
        from detectors.clip.neglabel import read_words

        return read_words(config["class_names_file"])
    raise ValueError("fewshot config needs `class_names` or `class_names_file`")


def runs_of(config: dict[str, Any], default_shots: Any = DEFAULT_SHOTS) -> list[tuple[str, dict[str, Any], int, int]]:
    """(method, overrides, shots, seed) of every run of a sweep config, in order."""
    return [(method, dict(overrides or {}), int(shots), int(seed))
            for method, overrides in (config.get("methods") or DEFAULT_METHODS).items()
            for shots in config.get("shots", default_shots) for seed in config.get("seeds", (1,))]


def prefetch_train_features(backbone: Any, train: Any, runs: list[tuple[str, dict[str, Any], int, int]],
                            cache_dir: Any = None, batch_size: int = 64) -> list[int]:
    """One image-tower pass over the union of the few-shot subsets that feature-reading methods (LoCoOp) train on;
    each run then slices its subset from it. Returns the rows embedded (sorted)."""
    from detectors.clip.common import few_shot_indices, labels_of
    from detectors.clip.features import image_features
    from detectors.registry import detector_class

    labels = None
    rows: set[int] = set()
    for method, _overrides, shots, seed in runs:
        if getattr(detector_class(method), "reads_train_features", False):
            labels = labels_of(train, method).numpy() if labels is None else labels
            rows.update(few_shot_indices(labels, shots, seed))
    if rows:
        image_features(backbone, train, cache_dir, batch_size, rows=sorted(rows))
    return sorted(rows)


def train_prompt_detectors(config: dict[str, Any]) -> list[Path]:
    """Train every (method, shots, seed) of `config` (keys as the sweep's; `out_dir` required) on the manifest's
    ID `train_split` rows and save each detector folder `out_dir/<method>-<shots>shot-seed<seed>`."""
    import detectors
    from detectors.base import ImageSet
    from detectors.clip.backbone import DEFAULT_CLIP, ClipBackbone
    from pipelines.data import read_manifest

    for key in ("manifest", "out_dir"):
        if not config.get(key):
            raise ValueError(f"train_prompts config needs `{key}`")
    class_names = class_names_from(config)
    backbone = ClipBackbone.load(config.get("model", DEFAULT_CLIP), device=config.get("device"))
    train = ImageSet.from_manifest(read_manifest(config["manifest"]), split=config.get("train_split", "train"),
                                   role="id")
    if not len(train):
        raise ValueError(f"train_prompts: no ID rows in split {config.get('train_split', 'train')!r} of "
                         f"{config['manifest']}")
    runs = runs_of(config, default_shots=(16,))
    prefetch_train_features(backbone, train, runs, config.get("cache_dir"))
    folders = []
    for method, overrides, shots, seed in runs:
        det = detectors.build(method, model=backbone, class_names=class_names, cache_dir=config.get("cache_dir"),
                              **{**overrides, "shots": shots, "seed": seed})
        folders.append(det.fit(train).save_pretrained(Path(config["out_dir"]) / f"{method}-{shots}shot-seed{seed}"))
    return folders
