"""Few-shot sweep of the learned-prompt detectors: train for each (method, shots, seed), score the test split of a
manifest per OOD set with `detectors.metrics.evaluate`, report ID accuracy; plot the metrics against shots.

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

import time
from pathlib import Path
from typing import Any

import numpy as np

from detectors.metrics import METRICS

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


def sweep(config: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows (method, family, shots, seed, ood_set, group, metrics in percent, id_acc, n_id, n_ood, seconds).

    ID train / ID test / OOD sets all come from the one `manifest` of the config (see `sweep_sets` for separate ones).
    """
    from detectors.base import ImageSet
    from pipelines.data import read_manifest

    if "manifest" not in config:
        raise ValueError("fewshot config needs `manifest` (a manifest folder)")
    manifest = read_manifest(config["manifest"])
    train = ImageSet.from_manifest(manifest, split=config.get("train_split", "train"), role="id")
    test = config.get("test_split", "test")
    id_test = ImageSet.from_manifest(manifest, split=test, role="id")
    ood_sets = {name: ImageSet.from_manifest(manifest, split=test, role="ood", ood_set=name)
                for name in manifest.select(split=test).ood_sets()}
    groups = {r["ood_set"]: r.get("group") for r in manifest.rows if r["role"] == "ood"}
    if not len(train) or not len(id_test) or not ood_sets:
        raise ValueError(f"fewshot: manifest {config['manifest']} needs ID train rows and ID + OOD rows in split "
                         f"{test!r}")
    return sweep_sets(config, train, id_test, ood_sets, groups, class_names_from(config))


def sweep_sets(config: dict[str, Any], train: Any, id_test: Any, ood_sets: dict[str, Any],
               groups: dict[str, str | None], class_names: list[str]) -> list[dict[str, Any]]:
    """The sweep on given ImageSets (the evaluation runner passes its ID and OOD splits)."""
    import detectors
    from detectors.clip.backbone import DEFAULT_CLIP, ClipBackbone
    from detectors.metrics import evaluate

    backbone = ClipBackbone.load(config.get("model", DEFAULT_CLIP), device=config.get("device"))
    out_dir = Path(config["out_dir"]) if config.get("out_dir") else None
    runs = runs_of(config)
    prefetch_train_features(backbone, train, runs, config.get("cache_dir"))  # one image-tower pass for all runs
    rows = []
    for method, overrides, shots, seed in runs:
        start = time.perf_counter()
        det = detectors.build(method, model=backbone, class_names=class_names, cache_dir=config.get("cache_dir"),
                              **{**overrides, "shots": shots, "seed": seed})
        det.fit(train)
        id_scores = det.score(id_test)
        id_acc = float(np.mean(det.predict(id_test) == id_test.labels))
        if out_dir is not None:
            det.save_pretrained(out_dir / f"{method}-{shots}shot-seed{seed}")
        for name, ood in ood_sets.items():
            metrics = evaluate(id_scores, det.score(ood))
            rows.append({"method": method, "family": det.family, "shots": shots, "seed": seed,
                         "ood_set": name, "group": groups.get(name), **{k: 100 * metrics[k] for k in METRICS},
                         "id_acc": 100 * id_acc, "n_id": len(id_test), "n_ood": len(ood),
                         "seconds": time.perf_counter() - start})
    if out_dir is not None:
        import pandas as pd

        from pipelines.io import atomic_write_text

        atomic_write_text(out_dir / "fewshot.csv", pd.DataFrame(rows).to_csv(index=False))
    return rows


def plot_fewshot(rows: list[dict[str, Any]], out_png: str, metrics: tuple[str, ...] = ("auroc", "fpr95")) -> Path:
    """One figure, a row per OOD set: ID accuracy (first panel), then each metric, against shots (mean +- std over
    seeds) per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    from pipelines.io import atomic_path

    frame = pd.DataFrame(rows)
    ood_sets = list(dict.fromkeys(frame["ood_set"]))
    shots = sorted(frame["shots"].unique())
    fig, axes = plt.subplots(len(ood_sets), len(metrics) + 1, figsize=(3.2 * (len(metrics) + 1), 2.8 * len(ood_sets)),
                             squeeze=False)
    panels = [(axes[0][0], "id_acc", None)] + [(axes[r][c + 1], m, s) for r, s in enumerate(ood_sets)
                                               for c, m in enumerate(metrics)]
    for ax in axes[1:, 0]:
        ax.axis("off")
    for ax, metric, ood_set in panels:
        data = (frame.drop_duplicates(["method", "shots", "seed"]) if ood_set is None
                else frame[frame["ood_set"] == ood_set])
        for method, part in data.groupby("method", sort=False):
            stats = part.groupby("shots")[metric].agg(["mean", "std"]).fillna(0.0)
            ax.errorbar(stats.index, stats["mean"], yerr=stats["std"], marker="o", capsize=3, label=method)
        ax.set_xscale("log", base=2)
        ax.set_xticks(shots, [str(s) for s in shots])
        ax.set_xlabel("shots per class")
        ax.set_title("ID accuracy" if ood_set is None else f"{metric} ({ood_set})", fontsize=9)
        ax.set_ylabel("%")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    out = Path(out_png)
    with atomic_path(out) as tmp:
        fig.savefig(tmp, dpi=120, format="png")
    plt.close(fig)
    return out
