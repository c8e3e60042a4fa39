"""The few-shot sweep of the learned-prompt detectors: train each (method, shots, seed) of a config
(`detectors.clip.fewshot.runs_of`), score ID test and every OOD set with `detectors.metrics.evaluate`, report ID
accuracy; plot the metrics against shots. The evaluation runner's `fewshot` unit runs it on the run's splits
(`fewshot_unit`); `sweep` runs it on one manifest. Config keys: `detectors.clip.fewshot`.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from detectors.clip.fewshot import class_names_from, prefetch_train_features, runs_of
from detectors.harness.prepare import ID_TEST, ID_TRAIN, PreparedRun
from detectors.harness.runconfig import ConfigError
from detectors.metrics import METRICS


def fewshot_unit(run: PreparedRun, writes: bool) -> None:
    """The sweep on the run's ID train, ID test and OOD splits -> fewshot.csv and fewshot.png (`writes`: this process
    writes them; the sweep runs on every rank together). Config keys: model, methods, shots, seeds, device, plot."""
    import pandas as pd

    from detectors.harness.outputs import write_csv

    plan = run.plan
    out = plan.out
    given_keys = {k: v for k, v in plan.fewshot.to_dict().items() if v is not None}
    sweep_config = {"out_dir": str(out / "fewshot"), "cache_dir": str(plan.cache_dir / "clip"), **given_keys}
    given = sweep_config.get("class_names") or sweep_config.get("class_names_file")
    names = class_names_from(sweep_config) if given else (list(plan.class_names) if plan.class_names else None)
    if not names:
        raise ConfigError("fewshot: class names are needed (config `class_names`, or `class_name` fields in the ID "
                          "manifest)")
    ood = plan.of_role("ood")
    rows = sweep_sets(sweep_config, run.plain_images(ID_TRAIN), run.plain_images(ID_TEST),
                      {s.name: run.plain_images(s.id) for s in ood}, {s.name: s.group for s in ood}, names)
    if writes:
        write_csv(pd.DataFrame(rows), out / "fewshot.csv")
        plot_fewshot(rows, str(sweep_config.get("plot", out / "fewshot.png")))


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
