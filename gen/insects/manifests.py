"""The species splits as manifests: one `metadata.jsonl` + `manifest_info.json` per region (written column by column
when the vectorised checks vouch for every row), a summary table, and `make_splits`, the whole path from tables to
folders."""
from __future__ import annotations

import os
from json.encoder import encode_basestring_ascii
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gen.insects.occurrences import read_id_species, read_table
from gen.insects.splits import SETS, SplitConfig, Splits, build_splits
from pipelines.data import MANIFEST_INFO, METADATA, Manifest, ManifestError, read_manifest, write_manifest
from pipelines.io import atomic_write_bytes, atomic_write_json, atomic_write_text
from pipelines.jsonl import column_texts, join_lines
from pipelines.schema import table_certainly_valid

SET_FIELDS = {  # set -> (split, role, ood_set, group)
    "id_train": ("train", "id", None, None), "id_val": ("val", "id", None, None), "id_test": ("test", "id", None, None),
    "local_test": ("test", "ood", "local", "near"), "local_val": ("val", "ood", "local", "near"),
    "non_local_test": ("test", "ood", "non_local", "far"), "non_local_val": ("val", "ood", "non_local", "far"),
    "non_target_test": ("test", "ood", "non_target", "far"), "non_target_val": ("val", "ood", "non_target", "far"),
    "aux_train": ("train", "ood", "auxiliary", None), "aux_val": ("val", "ood", "auxiliary", None),
}


def manifest_rows(frame: pd.DataFrame, non_target_name: str = "non_target") -> list[dict[str, Any]]:
    """Schema-complete manifest rows (DESIGN.md) for one region's frame."""
    from itertools import repeat

    table = manifest_table(frame, non_target_name)
    columns = object_columns(table)
    names = list(columns)
    rows = list(map(dict, map(zip, repeat(names), zip(*columns.values()))))
    for i, value in _aux_labels(frame, table):  # only auxiliary rows carry an aux_label (last key)
        rows[i]["aux_label"] = value
    return rows


def object_columns(table: pd.DataFrame) -> dict[str, list[Any]]:
    """Each column as a list of Python values, missing values as None."""
    columns = {}
    for name in table.columns:
        values = table[name].to_numpy(dtype=object)
        missing = pd.isna(table[name]).to_numpy()
        if missing.any():
            values[missing] = None
        columns[name] = values.tolist()
    return columns


def manifest_table(frame: pd.DataFrame, non_target_name: str) -> pd.DataFrame:
    """One region's frame as the manifest's columns (split, role, ood_set, group from the set; metadata kept)."""
    return pd.DataFrame({
        "file_name": frame["file_name"].astype(str),
        "split": frame["set"].map({k: v[0] for k, v in SET_FIELDS.items()}),
        "role": frame["set"].map({k: v[1] for k, v in SET_FIELDS.items()}),
        "ood_set": frame["set"].map({k: (non_target_name if v[2] == "non_target" else v[2]) for k, v in SET_FIELDS.items()}),
        "group": frame["set"].map({k: v[3] for k, v in SET_FIELDS.items()}),
        "label": frame["label"].astype(np.int64),
        "species": frame["species"], "genus": frame["genus"], "family": frame["family"],
        "hop": frame["hop"].astype(np.int64), "lat": frame["lat"], "lon": frame["lon"],
    })


def _aux_labels(frame: pd.DataFrame, table: pd.DataFrame) -> list[tuple[int, int]]:
    """(row position, aux_label) of the auxiliary rows."""
    if "aux_label" not in frame.columns:
        return []
    aux = np.flatnonzero((table["ood_set"] == "auxiliary").to_numpy())
    return list(zip(aux.tolist(), frame["aux_label"].fillna(-1).to_numpy()[aux].astype(np.int64).tolist()))


def _manifest_bytes(frame: pd.DataFrame, non_target_name: str) -> bytes | None:
    """metadata.jsonl bytes of manifest_rows(frame) (json.dumps(row, default=str) per line), built column by column;
    None when `pipelines.schema.table_certainly_valid` cannot vouch for every row (write_manifest then names the bad
    line)."""
    table = manifest_table(frame, non_target_name)
    if not table_certainly_valid(table):
        return None
    pieces: list[Any] = []
    for number, name in enumerate(table.columns):
        texts = column_texts(table[name])
        if texts is None:
            return None
        pieces += [("{" if number == 0 else ", ") + encode_basestring_ascii(name) + ": ", texts]
    aux = [""] * len(table)
    for i, value in _aux_labels(frame, table):
        aux[i] = f', "aux_label": {value}'
    return join_lines(pieces + [aux, "}\n"])


def summarize(splits: Splits) -> pd.DataFrame:
    """Species and images per (region, set), with image counts per hop."""
    parts = []
    for region, frame in splits.regions.items():
        counts = frame.groupby("set").agg(species=("species", "nunique"), images=("file_name", "size"))
        hops = pd.crosstab(frame["set"], frame["hop"]).reindex(columns=[0, 1, 2, 3], fill_value=0)
        hops.columns = [f"hop{h}" for h in hops.columns]
        table = counts.join(hops).reindex([s for s in SETS if s in counts.index]).reset_index()
        table.insert(0, "region", region)
        parts.append(table)
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def write_splits(splits: Splits, out_dir: str | os.PathLike, image_root: str | os.PathLike) -> dict[str, Path]:
    """Write `out_dir/<region>/metadata.jsonl` + `manifest_info.json` (image root, parameters) per region and `out_dir/summary.{csv,md}`."""
    out_dir = Path(out_dir)
    written = {}
    for region, frame in splits.regions.items():
        folder = out_dir / region
        text = _manifest_bytes(frame, splits.config.non_target_name)
        if text is None:  # validates row by row and names the bad line
            write_manifest(folder, manifest_rows(frame, splits.config.non_target_name))
        else:
            atomic_write_bytes(folder / METADATA, text)
        atomic_write_json(folder / MANIFEST_INFO, {
            "image_root": str(Path(image_root).expanduser().resolve()), "region": region,
            "missing_id_species": splits.missing_id_species.get(region, []), "config": splits.config.to_dict(),
        })
        written[region] = folder
    summary = summarize(splits)
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_dir / "summary.csv", summary.to_csv(index=False))
    atomic_write_text(out_dir / "summary.md", _markdown(summary))
    return written


def _markdown(table: pd.DataFrame) -> str:
    header = "| " + " | ".join(table.columns) + " |\n|" + "---|" * len(table.columns) + "\n"
    return header + "".join("| " + " | ".join(str(v) for v in row) + " |\n" for row in table.itertuples(index=False))


def load_region(folder: str | os.PathLike, image_root: str | os.PathLike | None = None) -> Manifest:
    """A region's manifest rooted at its image root (from `manifest_info.json` unless `image_root` is given)."""
    folder = Path(folder)
    if image_root is None and not (folder / MANIFEST_INFO).is_file():
        raise ManifestError(folder / MANIFEST_INFO, None, None, f"no {MANIFEST_INFO}: pass image_root explicitly")
    return read_manifest(folder, image_root=image_root)


def make_splits(occurrences: str | os.PathLike | pd.DataFrame, id_species: str | os.PathLike | pd.DataFrame,
                out_dir: str | os.PathLike, image_root: str | os.PathLike, config: SplitConfig | None = None,
                non_target: str | os.PathLike | pd.DataFrame | None = None) -> tuple[dict[str, Path], pd.DataFrame]:
    """Read the tables (paths or frames), build the splits, write the manifests; returns (folders, summary table)."""
    occ = occurrences if isinstance(occurrences, pd.DataFrame) else read_table(occurrences)
    extra = non_target if non_target is None or isinstance(non_target, pd.DataFrame) else read_table(non_target)
    splits = build_splits(occ, read_id_species(id_species), config, non_target=extra)
    return write_splits(splits, out_dir, image_root), summarize(splits)
