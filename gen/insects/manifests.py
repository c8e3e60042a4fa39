"""The species splits as manifests: one `metadata.jsonl` + `manifest_info.json` per region (written column by column
when the vectorised checks vouch for every row), a summary table, and `make_splits`, the whole path from tables to
folders."""
from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Iterator
from json.encoder import encode_basestring_ascii
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gen.insects.occurrences import GBIF_ID_COLUMNS, OCCURRENCE_COLUMNS, SPLIT_COLUMNS, TableError, read_id_species
from gen.insects.splits import MIN_IMAGES, SETS, SplitConfig, Splits, build_splits, check_region_names
from pipelines.curation.gbif import (
    BLANK_SPECIES,
    DUPLICATE_URL,
    MISSING_FILE,
    NO_COORDINATES,
    NO_FILE_NAME,
    TAXON_FILTER,
    TableLimits,
    TaxonFilter,
    clean,
    is_archive,
    normalise,
    read_occurrences,
)
from pipelines.data import MANIFEST_INFO, METADATA, Manifest, ManifestError, check_manifest_rows, read_manifest
from pipelines.io import atomic_path, atomic_write_json, atomic_write_text
from pipelines.jsonl import column_texts, encode_lines, join_lines
from pipelines.schema import table_certainly_valid
from pipelines.shards import SHARD_FOLDER
from pipelines.store import ROW_FIELDS, STORE_FILE, MemberPath, store_members

SET_FIELDS = {  # set -> (split, role, ood_set, group)
    "id_train": ("train", "id", None, None), "id_val": ("val", "id", None, None), "id_test": ("test", "id", None, None),
    "local_test": ("test", "ood", "local", "near"), "local_val": ("val", "ood", "local", "near"),
    "non_local_test": ("test", "ood", "non_local", "far"), "non_local_val": ("val", "ood", "non_local", "far"),
    "non_target_test": ("test", "ood", "non_target", "far"), "non_target_val": ("val", "ood", "non_target", "far"),
    "aux_train": ("train", "ood", "auxiliary", None), "aux_val": ("val", "ood", "auxiliary", None),
}


def manifest_rows(frame: pd.DataFrame, non_target_name: str = "non_target") -> list[dict[str, Any]]:
    """Schema-complete manifest rows (README: Data formats) for one region's frame."""
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
        "ood_set": frame["set"].map({k: (non_target_name if v[2] == "non_target" else v[2])
                                     for k, v in SET_FIELDS.items()}),
        "group": frame["set"].map({k: v[3] for k, v in SET_FIELDS.items()}),
        "label": frame["label"].astype(np.int64),
        "species": frame["species"], "genus": frame["genus"], "family": frame["family"],
        "hop": frame["hop"].astype(np.int64), "lat": frame["lat"], "lon": frame["lon"],
        **{c: frame[c] for c in GBIF_ID_COLUMNS if c in frame.columns},
        **{c: frame[c] for c in ROW_FIELDS if c in frame.columns},  # the image's shard member (`with_members`)
    })


def _aux_labels(frame: pd.DataFrame, table: pd.DataFrame) -> list[tuple[int, int]]:
    """(row position, aux_label) of the auxiliary rows."""
    if "aux_label" not in frame.columns:
        return []
    aux = np.flatnonzero((table["ood_set"] == "auxiliary").to_numpy())
    return list(zip(aux.tolist(), frame["aux_label"].fillna(-1).to_numpy()[aux].astype(np.int64).tolist()))


MANIFEST_CHUNK_ROWS = 100_000
"""Rows encoded at a time: the JSON text of a chunk is built in memory, never a whole region's (millions of rows)."""


def _manifest_bytes(frame: pd.DataFrame, non_target_name: str) -> bytes | None:
    """metadata.jsonl bytes of manifest_rows(frame) (json.dumps(row, default=str) per line), built column by column;
    None when `pipelines.schema.table_certainly_valid` cannot vouch for every row (`region_manifest` then names the
    bad line)."""
    chunks = _manifest_chunks(frame, non_target_name)
    return None if chunks is None else b"".join(chunks)


def _manifest_chunks(frame: pd.DataFrame, non_target_name: str) -> Iterator[bytes] | None:
    """`_manifest_bytes` as chunks of `MANIFEST_CHUNK_ROWS` lines, or None (the table is checked whole first)."""
    table = manifest_table(frame, non_target_name)
    if not table_certainly_valid(table):
        return None
    aux = dict(_aux_labels(frame, table))

    def encode(start: int) -> bytes | None:
        part = table.iloc[start:start + MANIFEST_CHUNK_ROWS]
        pieces: list[Any] = []
        for number, name in enumerate(part.columns):
            texts = column_texts(part[name])
            if texts is None:
                return None
            pieces += [("{" if number == 0 else ", ") + encode_basestring_ascii(name) + ": ", texts]
        tail = [f', "aux_label": {aux[i]}' if i in aux else "" for i in range(start, start + len(part))]
        return join_lines(pieces + [tail, "}\n"])

    first = encode(0) if len(table) else b""
    if first is None:
        return None

    def chunks() -> Iterator[bytes]:
        yield first
        for start in range(MANIFEST_CHUNK_ROWS, len(table), MANIFEST_CHUNK_ROWS):
            text = encode(start)
            if text is None:  # a later chunk holds a value the column encoder cannot vouch for
                yield from _row_chunks(frame.iloc[start:], non_target_name)
                return
            yield text

    return chunks()


def _row_chunks(frame: pd.DataFrame, non_target_name: str) -> Iterator[bytes]:
    for start in range(0, len(frame), MANIFEST_CHUNK_ROWS):
        yield encode_lines(manifest_rows(frame.iloc[start:start + MANIFEST_CHUNK_ROWS],
                                         non_target_name)).encode("utf-8")


def region_manifest_chunks(folder: Path, frame: pd.DataFrame, non_target_name: str) -> Iterator[bytes]:
    """A region's checked metadata.jsonl bytes, in chunks: built column by column (`_manifest_chunks`), or, where
    that cannot vouch for every row, row by row with `check_manifest_rows` (a bad row is a ManifestError naming its
    line); every check runs before the first chunk is returned."""
    chunks = _manifest_chunks(frame, non_target_name)
    if chunks is not None:
        return chunks
    check_manifest_rows(folder, manifest_rows(frame, non_target_name))
    return _row_chunks(frame, non_target_name)


def region_manifest(folder: Path, frame: pd.DataFrame, non_target_name: str) -> bytes:
    """A region's checked metadata.jsonl bytes (`region_manifest_chunks` joined)."""
    return b"".join(region_manifest_chunks(folder, frame, non_target_name))


def write_region(folder: Path, frame: pd.DataFrame, splits: Splits, region: str, image_root: str | os.PathLike,
                 dry_run: bool = False) -> int:
    """The one place a region's manifest is written: `folder/metadata.jsonl` (streamed, atomic) and
    `manifest_info.json`; returns the bytes written (a dry run builds and checks the same bytes, writes nothing)."""
    chunks = region_manifest_chunks(folder, frame, splits.config.non_target_name)
    if dry_run:
        return sum(map(len, chunks))
    size = 0
    with atomic_path(folder / METADATA) as tmp, open(tmp, "wb") as handle:
        for chunk in chunks:
            handle.write(chunk)
            size += len(chunk)
    atomic_write_json(folder / MANIFEST_INFO, {
        "image_root": str(Path(image_root).expanduser().resolve()), "region": region,
        "missing_id_species": splits.missing_id_species.get(region, []), "config": splits.config.to_dict(),
        **({"store": "shards"} if "shard_file" in frame.columns else {}),
    })
    return size


def fetched_store(image_root: str | os.PathLike | None) -> Path | None:
    """The shard store `fetch_images --store shards` wrote under `image_root` (`<image_root>/shards/store.json`), or
    None for a plain folder."""
    if image_root is None:
        return None
    store = Path(image_root) / SHARD_FOLDER
    return store if (store / STORE_FILE).is_file() else None


def with_members(frame: pd.DataFrame, members: dict[str, MemberPath]) -> pd.DataFrame:
    """`frame` with each row's shard member (`pipelines.store.ROW_FIELDS`, the shard relative to the store, which
    is then the manifest's image root), looked up by file_name; every file_name must have one (`read_input` dropped
    the others)."""
    found = [members[name] for name in frame["file_name"]]
    return frame.assign(shard_file=[m.shard.name for m in found], shard_member=[m.member for m in found],
                        shard_offset=np.array([m.offset for m in found], dtype=np.int64),
                        shard_bytes=np.array([m.size for m in found], dtype=np.int64))


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


DROP_ORDER = (TAXON_FILTER, BLANK_SPECIES, NO_COORDINATES, DUPLICATE_URL, NO_FILE_NAME, MISSING_FILE, MIN_IMAGES)


def summary_record(splits: Splits, dropped: dict[str, int] | None = None) -> dict[str, Any]:
    """The machine-readable summary (`summary.json`): per (region, set) its name ("id" or the ood_set), role, split,
    species and images, and the same per hop; the rows dropped by reason; the shortfalls."""
    sets = []
    for region, frame in splits.regions.items():
        for name in SETS:
            rows = frame[frame["set"] == name]
            if rows.empty:
                continue
            split, role, ood_set, _ = SET_FIELDS[name]
            if ood_set == "non_target":
                ood_set = splits.config.non_target_name
            hops = rows.groupby("hop").agg(species=("species", "nunique"), images=("file_name", "size"))
            sets.append({"region": region, "set": name, "name": ood_set or "id", "role": role, "split": split,
                         "species": int(rows["species"].nunique()), "images": int(len(rows)),
                         "hops": [{"hop": int(h), "species": int(r.species), "images": int(r.images)}
                                  for h, r in hops.iterrows()]})
    counts = Counter(dropped or {}) + Counter(splits.dropped)
    ordered = {reason: int(counts[reason]) for reason in DROP_ORDER if counts[reason]}
    ordered.update({k: int(v) for k, v in counts.items() if k not in ordered and v})
    return {"sets": sets, "dropped": ordered, "shortfalls": splits.shortfalls,
            "missing_id_species": {region: list(names) for region, names in splits.missing_id_species.items() if names}}


def write_splits(splits: Splits, out_dir: str | os.PathLike, image_root: str | os.PathLike,
                 dropped: dict[str, int] | None = None) -> dict[str, Path]:
    """Write `out_dir/<region>/metadata.jsonl` + `manifest_info.json` (image root, parameters) per region and
    `out_dir/summary.{csv,md,json}` (`dropped`: rows dropped before the builder, by reason)."""
    out_dir = Path(out_dir)
    check_region_names(splits.regions, "regions")
    written = {}
    for region, frame in splits.regions.items():
        write_region(out_dir / region, frame, splits, region, image_root)
        written[region] = out_dir / region
    summary = summarize(splits)
    record = summary_record(splits, dropped)
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_dir / "summary.csv", summary.to_csv(index=False))
    atomic_write_json(out_dir / "summary.json", record)
    atomic_write_text(out_dir / "summary.md", _markdown(summary) + _dropped_markdown(record))
    return written


def _markdown(table: pd.DataFrame) -> str:
    header = "| " + " | ".join(table.columns) + " |\n|" + "---|" * len(table.columns) + "\n"
    return header + "".join("| " + " | ".join(str(v) for v in row) + " |\n" for row in table.itertuples(index=False))


def _dropped_markdown(record: dict[str, Any]) -> str:
    text = "\n## Rows dropped\n\n" + (_markdown(pd.DataFrame(
        {"reason": list(record["dropped"]), "rows": list(record["dropped"].values())})) if record["dropped"]
        else "none\n")
    text += "\n## Shortfalls\n\n"
    if not record["shortfalls"]:
        return text + "none\n"
    return text + _markdown(pd.DataFrame(record["shortfalls"])[["region", "what", "requested", "found"]])


def shortfall_lines(record: dict[str, Any]) -> list[str]:
    """One warning line per shortfall."""
    return [f"warning: {s['region']}: {s['requested']} {s['what']} requested, {s['found']} found"
            for s in record["shortfalls"]]


def load_region(folder: str | os.PathLike, image_root: str | os.PathLike | None = None) -> Manifest:
    """A region's manifest rooted at its image root (from `manifest_info.json` unless `image_root` is given)."""
    folder = Path(folder)
    if image_root is None and not (folder / MANIFEST_INFO).is_file():
        raise ManifestError(folder / MANIFEST_INFO, None, None, f"no {MANIFEST_INFO}: pass image_root explicitly")
    return read_manifest(folder, image_root=image_root)


def read_input(occurrences: str | os.PathLike | pd.DataFrame, taxa: TaxonFilter | None = None,
               image_root: str | os.PathLike | None = None, check_files: bool | None = None,
               limits: TableLimits | None = None,
               members: dict[str, MemberPath] | None = None) -> tuple[pd.DataFrame, Counter]:
    """An occurrence table (a frame, a table file or a GBIF archive) cleaned for the splits, and the rows dropped by
    reason (`pipelines.curation.gbif.clean`). `check_files` (default: on for archives) drops rows whose image is not
    under `image_root`; with a shard store's `members` (file_name -> member), rows whose image is not in the store
    are always dropped (a dictionary lookup; "missing file"). Only the columns the split builder reads are kept
    (`SPLIT_COLUMNS`)."""
    if isinstance(occurrences, pd.DataFrame):
        frame, source, archive = normalise(occurrences), "occurrence table", False
    else:
        frame, source, archive = (read_occurrences(occurrences, limits), f"occurrence table {occurrences}",
                                  is_archive(occurrences))
    missing = [c for c in OCCURRENCE_COLUMNS if c not in frame.columns]
    if missing:
        raise TableError(f"occurrence table: missing column(s) {missing}; needs {list(OCCURRENCE_COLUMNS)} (GBIF names "
                         f"such as decimalLatitude are mapped; {source.removeprefix('occurrence table ')})")
    check = archive if check_files is None else check_files
    ranks = taxa.columns if taxa is not None and taxa.active else set()
    if ranks <= set(frame.columns):  # else clean names the missing rank among all the table's columns
        used = {*SPLIT_COLUMNS, "lat", "lon", *ranks}
        frame = frame[[c for c in frame.columns if c in used]]  # the splits never read the other columns
    occ, dropped = clean(frame, taxa, source=source, image_root=image_root if check and members is None else None)
    if members is not None:
        absent = ~np.fromiter((name in members for name in occ["file_name"]), bool, len(occ))
        if absent.any():
            dropped[MISSING_FILE] += int(absent.sum())
            occ = occ.loc[~absent].reset_index(drop=True)
    return occ[[c for c in occ.columns if c in SPLIT_COLUMNS]], dropped


def make_splits(occurrences: str | os.PathLike | pd.DataFrame, id_species: str | os.PathLike | pd.DataFrame,
                out_dir: str | os.PathLike, image_root: str | os.PathLike, config: SplitConfig | None = None,
                non_target: str | os.PathLike | pd.DataFrame | None = None, taxa: TaxonFilter | None = None,
                check_files: bool | None = None, dry_run: bool = False, timings: dict[str, Any] | None = None,
                limits: TableLimits | None = None) -> tuple[dict[str, Path], pd.DataFrame, dict[str, Any]]:
    """Read the tables (frames, files or GBIF archives), build the splits, write the manifests; returns (folders,
    summary table, summary record). `dry_run` runs every check, manifest rows included, and writes nothing (the
    folders returned are those a run would write). `timings`, when given, receives the seconds of each stage
    (`read`, `build`, `manifests`), the rows read and the manifest bytes (`gen.insects.cost` estimates a run from
    them). When `image_root` holds fetch's shard store (`fetched_store`), every row points at its image's member
    (looked up by file_name in the store's indexes, each shard checked against its record first) and the manifests'
    image root is the store, so training and evaluation read the shards with no pack step."""
    timings = {} if timings is None else timings
    start = time.perf_counter()
    store = fetched_store(image_root)
    members = store_members(store) if store is not None else None
    occ, dropped = read_input(occurrences, taxa, image_root, check_files, limits, members)
    extra = non_target if non_target is None or isinstance(non_target, pd.DataFrame) else \
        read_occurrences(non_target, limits)
    timings.update(read=time.perf_counter() - start, rows=len(occ) + sum(dropped.values()))
    start = time.perf_counter()
    splits = build_splits(occ, read_id_species(id_species), config, non_target=extra)
    del occ, extra
    if members is not None:  # the rows' image root is the store (its store.json keys the run)
        splits.regions = {region: with_members(frame, members) for region, frame in splits.regions.items()}
        image_root = store
    timings["build"] = time.perf_counter() - start
    start = time.perf_counter()
    if dry_run:
        folders = {region: Path(out_dir) / region for region in splits.regions}
        check_region_names(splits.regions, "regions")
        timings["bytes"] = sum(write_region(folders[region], frame, splits, region, image_root, dry_run=True)
                               for region, frame in splits.regions.items())  # built and checked, not written
    else:
        folders = write_splits(splits, out_dir, image_root, dropped)
        timings["bytes"] = sum((folder / METADATA).stat().st_size for folder in folders.values())
    timings.update(manifests=time.perf_counter() - start, manifest_rows=sum(map(len, splits.regions.values())))
    return folders, summarize(splits), summary_record(splits, dropped)
