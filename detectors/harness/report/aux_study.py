"""Open-Insects Figure 4: OOD AUROC against the number of auxiliary species at a fixed auxiliary image budget.

`subsample` draws, deterministically, `count` species of the auxiliary rows and `budget` images spread evenly over
them (the paper fixes 80,000 images and varies the species); `write_subsample` writes them as a manifest whose
`image_root` is the source's and whose `aux_label`s are renumbered 0..count-1 (Extended's second head has one class per
auxiliary species). `scripts/aux_study.py` runs the evaluation once per count, `open_insects.study_table` reads the
runs back and `study_figure` draws Figure 4.
"""
from __future__ import annotations

import hashlib
import json
import os
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from pipelines.data import MANIFEST_INFO, Manifest, read_manifest, write_manifest
from pipelines.errors import UserInputError
from pipelines.io import atomic_write_json


def aux_rows(folder: str | os.PathLike, split: str = "train") -> Manifest:
    """The auxiliary rows (those with an `aux_label`) of split `split` of a manifest."""
    manifest = read_manifest(folder)
    rows = [r for r in manifest.rows if r.get("split") == split and r.get("aux_label") is not None]
    if not rows:
        raise UserInputError(f"aux study: {folder} has no auxiliary rows (with aux_label) in split {split!r}")
    return Manifest(manifest.root, rows)


def _order(values: Sequence[str], seed: int) -> list[str]:
    """`values` in a seeded pseudo-random order that does not depend on the other values (crc32 of seed and value)."""
    return sorted(values, key=lambda v: (zlib.crc32(f"{seed}:{v}".encode()), v))


def subsample(rows: Sequence[dict[str, Any]], count: int, budget: int, seed: int = 0) -> list[dict[str, Any]]:
    """`count` species (seeded order: a smaller count's species are among a larger count's) and up to `budget` images,
    `budget // count` per species (the first `budget % count` species one more), each species' images in seeded order;
    a species with fewer images gives all it has. `aux_label` is renumbered 0..count-1 in species order."""
    by_species: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_species.setdefault(str(row.get("species", row["aux_label"])), []).append(row)
    if count < 1 or count > len(by_species):
        raise UserInputError(f"aux study: {count} species asked for; the auxiliary set has {len(by_species)}")
    if budget < count:
        raise UserInputError(f"aux study: a budget of {budget} images cannot cover {count} species")
    chosen = _order(list(by_species), seed)[:count]
    out = []
    for i, species in enumerate(chosen):
        images = {r["file_name"]: r for r in by_species[species]}
        take = budget // count + (1 if i < budget % count else 0)
        out += [{**images[name], "aux_label": i} for name in _order(list(images), seed)[:take]]
    return out


def subsample_digest(source: Manifest, rows: list[dict[str, Any]]) -> str:
    """The hash of a subsample's content: the source's image root and the rows."""
    text = "".join(json.dumps(r, sort_keys=True, default=str) + "\n" for r in rows)
    return hashlib.sha256((str(Path(source.root).resolve()) + "\n" + text).encode()).hexdigest()


def write_subsample(source: Manifest, rows: list[dict[str, Any]], folder: str | os.PathLike) -> str:
    """`rows` as a manifest in `folder` (images stay where they are: `image_root` is the source's); rewritten only when
    its content changes, so a finished run on it stays valid. Returns the content's hash."""
    folder = Path(folder)
    digest = subsample_digest(source, rows)
    stamp = folder / "subsample.json"
    if stamp.is_file() and json.loads(stamp.read_text(encoding="utf-8")).get("sha256") == digest:
        return digest
    write_manifest(folder, rows)
    atomic_write_json(folder / MANIFEST_INFO, {"image_root": str(Path(source.root).resolve())})
    atomic_write_json(stamp, {"sha256": digest, "images": len(rows),
                              "species": len({r["aux_label"] for r in rows})})
    return digest


NUDGE = 1.08
"""Figure 4: each OOD set's points sit this factor apart on the log x axis (and carry their own markers), so that
sets with equal AUROC (three lines at 100) stay visible."""


def study_title(table: pd.DataFrame) -> str:
    """`NovelBranch + MSP: AUROC vs auxiliary species (80000 images)`, in the paper's names."""
    from detectors.harness.report.names import OPEN_INSECTS, method_label

    methods = ", ".join(method_label(m, OPEN_INSECTS) for m in dict.fromkeys(table["method"]))
    images = sorted({int(v) for v in pd.to_numeric(table["images"], errors="coerce").dropna()})
    budget = f" ({images[0]} images)" if len(images) == 1 else ""
    return f"{methods}: AUROC vs auxiliary species{budget}"


def study_figure(table: pd.DataFrame, title: str) -> Any:
    """AUROC per OOD set against the number of auxiliary species (log x), one style per set, the sets nudged apart by
    `NUDGE` with its own marker and line style (the legend says so), display names."""
    from detectors.harness.report.figures import LINESTYLES, grid_figure, styles
    from detectors.harness.report.names import set_label, set_short

    figure, grid = grid_figure(1, 1, (5.0, 3.0), margins=(0.7, 0.2, 0.45, 0.55))
    axes = grid[0, 0]
    sets = list(dict.fromkeys(table["ood_set"]))
    for k, (style, ood_set) in enumerate(zip(styles(len(sets)), sets)):
        part = table[table["ood_set"] == ood_set].sort_values("species")
        factor = NUDGE ** (k - (len(sets) - 1) / 2)
        name = set_label(ood_set) + (f" ({set_short(ood_set)})" if set_short(ood_set) != set_label(ood_set) else "")
        axes.plot(part["species"] * factor, part["auroc"], color=style.color, marker=style.marker,
                  linestyle=LINESTYLES[k % len(LINESTYLES)], linewidth=1.5, markersize=6,
                  markerfacecolor="none" if k % 2 else style.color, label=name)
    counts = sorted(table["species"].unique())
    axes.set_xscale("log")
    axes.set_xticks(counts, [str(c) for c in counts])
    axes.minorticks_off()
    axes.set(xlabel="auxiliary species (log scale; fixed image budget)", ylabel="AUROC (%)", ylim=(-2, 102),
             xlim=(min(counts) / 1.3, max(counts) * 1.3))
    axes.set_title(title, fontsize="medium")
    axes.legend(fontsize="small", title=f"OOD set (nudged x{NUDGE:g} apart)", title_fontsize="x-small",
                loc="lower right")
    return figure


__all__ = ["aux_rows", "subsample", "write_subsample", "NUDGE", "study_title", "study_figure"]
