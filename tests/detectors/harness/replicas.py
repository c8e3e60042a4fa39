"""Scaled synthetic replicas of the benchmarks' data, for protocol tests: same set names and groups, tiny sizes.

Images come from the embedded digits data (pipelines.toydata): ID digits 0-5 subsampled per class, and OOD sets
filled round-robin from the digits OOD pool (digits 6-9, sketches, textures).
"""
from __future__ import annotations

import shutil
from pathlib import Path

from pipelines.data import make_row, read_manifest, write_manifest


def subsample_id(id_dir: Path, out: Path, per_class: dict[str, int]) -> Path:
    """An ID manifest with at most `per_class[split]` images of each class and split, images copied."""
    rows, counts = [], {}
    manifest = read_manifest(id_dir)
    for row in manifest.rows:
        key = (row["split"], row["label"])
        if counts.get(key, 0) >= per_class[row["split"]]:
            continue
        counts[key] = counts.get(key, 0) + 1
        target = out / row["file_name"]
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(manifest.path(row), target)
        rows.append(row)
    write_manifest(out, rows)
    return out


def ood_sets(ood_dir: Path, out: Path, groups: dict[str, str], per_set: int, split: str = "test") -> dict[str, Path]:
    """One manifest folder per set name (`out/<set>`), each with `per_set` images taken in turn from the pool."""
    pool = read_manifest(ood_dir)
    by_source: dict[str, list[dict]] = {}
    for row in pool.rows:
        by_source.setdefault(row["ood_set"], []).append(row)
    sources = sorted(by_source)
    folders, used = {}, {s: 0 for s in sources}
    for i, (name, group) in enumerate(groups.items()):
        source = sources[i % len(sources)]
        rows = []
        for _ in range(per_set):
            row = by_source[source][used[source] % len(by_source[source])]
            used[source] += 1
            file_name = f"{name}_{used[source]:04d}.png"
            (out / name).mkdir(parents=True, exist_ok=True)
            shutil.copy(pool.path(row), out / name / file_name)
            rows.append(make_row(file_name, split=split, role="ood", ood_set=name, group=group))
        write_manifest(out / name, rows)
        folders[name] = out / name
    return folders
