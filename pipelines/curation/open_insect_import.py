"""Import the released Open-Insect benchmark (`pipelines.curation.open_insect` reads it) into make-splits' layout:
`OUT/<region>/metadata.jsonl` + `manifest_info.json` (+ `class_names.json` from the category map) and
`OUT/summary.{json,csv,md}`, so `configs/species_<region>.yaml` runs on it unchanged; the BCI field set goes to
`OUT/field_bci/` (the config's field source).

Images: a download.py folder's stay where they are (`<source>/images/`); the hub's and the repository files' are
fetched by `fetch_images` (URL = `identifier`, to `OUT/images/<image_path>`, `resize: reference`, resumable, with
its ledger, per-host rate and contained paths), as download.py fetches them (no size or thumbnail filter, timeout
20 s: download.py:84); the BCI set's come inside its rows and are written to `OUT/images/bci/<image_path>` as
stored. A row whose image is missing is left out and listed in `<folder>/missing.csv`.
"""
from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pandas as pd

from pipelines.class_names import ClassNames, write_class_names
from pipelines.curation.fetch import FetchConfig, HostsThrottled, fetch_images, fetch_plan
from pipelines.curation.fetch_client import FetchFailure
from pipelines.curation.fetch_ledger import Paths
from pipelines.curation.open_insect import (
    BCI_IMAGES,
    BCI_REGION,
    REGIONS,
    RELEASE_SPLITS,
    Release,
    check_rows,
    counts,
    manifest_rows,
    read_category_map,
    read_release,
)
from pipelines.data import MANIFEST_INFO, Manifest, check_manifest_rows, missing_images, write_manifest
from pipelines.errors import ConfigError
from pipelines.io import atomic_write_bytes, atomic_write_json, atomic_write_text
from pipelines.params import REQUIRED, Config, config, param

FIELD_FOLDER = "field_bci"
"""The BCI field set's manifest folder under OUT (configs/species_c-america.yaml's `field` names data/field_bci)."""
IMAGES = "images"
DOWNLOAD_TIMEOUT = 20.0
"""download.py:84, `requests.get(url, timeout=20)`."""
SET_KEYS = {"local": "local", "non_local": "non_local", "non_target": "non_target", "auxiliary": "aux"}
"""ood_set -> the set name make-splits' summary uses (`<key>_<split>`)."""


def _check_region(value: str | None, key: str) -> None:
    if value is not None and value not in REGIONS:
        raise ConfigError(f"{key}: one of {', '.join(REGIONS)}, got {value!r}")


@config
class OpenInsectImport(Config):
    """What `import-open-insect` reads and where it writes; a fault is one ConfigError naming the key."""

    DOC = "docs/species.md"

    source: str = param(REQUIRED, "a folder in download.py's layout, the hub id yuyan-chen/open-insect, or a local "
                                  "copy of the dataset repository (CSV / Parquet / Arrow)")
    out: str = param(REQUIRED, "output folder: OUT/<region>/ as make-splits writes it (OUT/field_bci/ with bci)")
    region: str | None = param(None, "ne-america, w-europe or c-america (with bci: c-america)", check=_check_region)
    bci: bool = param(False, "import the BCI field set (download_bci.py's) instead of the region's splits")
    category_map: str | None = param(None, "RolnickLab/Open-Insect data/<region>_category_map.json: each label's "
                                           "GBIF speciesKey as its species (and the class count); None: "
                                           "SOURCE/data/<region>_category_map.json when there (download.sh writes "
                                           "into the repository checkout)")
    non_target_name: str = param("non_target", "ood_set name of the test_ood_non-moth rows (make-splits' default)")
    workers: int = param(32, "parallel downloads of the images fetched by URL", ge=1, runtime=True)
    rate: float | None = param(None, "requests a second per host at most (None: adaptive)", gt=0)
    timeout: float = param(DOWNLOAD_TIMEOUT, "seconds a request may take (download.py:84: 20)", gt=0)
    retries: int = param(3, "retries of a transient download failure (download.py: none)", ge=0)
    resize: Literal["reference", "keep_ratio", "none"] = param(
        "reference", "resize on fetch: reference = download.py --resize_size 224 (fetch-images' modes)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.bci and self.region not in (None, BCI_REGION):
            raise ConfigError(f"region: the BCI field set is {BCI_REGION}'s, got {self.region!r}")
        if not self.bci and self.region is None:
            raise ConfigError(f"region: required ({', '.join(REGIONS)})")

    @property
    def the_region(self) -> str:
        """The region imported (the BCI field set's is c-america)."""
        return self.region or BCI_REGION


@dataclass
class Imported:
    """What an import found and wrote: the folder, counts per released split (`open_insect.counts`), the missing
    images (release_split, image_path, url, reason), released splits absent from the source, the fetch plan of a
    dry run and the hosts given up on (their rows are missing; a rerun fetches them)."""

    folder: Path
    table: pd.DataFrame
    missing: pd.DataFrame
    absent: list[str]
    fetch: dict[str, Any] | None = None
    throttled: HostsThrottled | None = field(default=None, repr=False)


def import_open_insect(cfg: OpenInsectImport, dry_run: bool = False) -> Imported:
    """Read and check the release, bring its images (unless `dry_run`), write the manifests; see the module
    docstring. A dry run reads and checks every row, builds the manifest rows and writes nothing."""
    region = cfg.the_region
    release = read_release(cfg.source, region, cfg.bci)
    category_map = cfg.category_map or repository_map(cfg.source, region)
    species = read_category_map(category_map) if category_map else None
    check_rows(release, species)
    out = Path(cfg.out).expanduser()
    folder = out / (FIELD_FOLDER if cfg.bci else region)
    prefix = "" if release.kind == "download" or not cfg.bci else f"{BCI_IMAGES}/"
    rows = {name: manifest_rows(part, prefix, species, cfg.non_target_name) for name, part in release.splits.items()}
    aux_labels(rows)
    plan, throttled = None, None
    if release.kind == "download":
        image_root = release.image_root
        kept, missing = _present(image_root, rows)
    else:
        image_root = out / IMAGES
        kept, missing, plan, throttled = _bring(cfg, release, rows, out, dry_run)
    every = [row for name in release.splits for row in kept[name]]
    table = counts(release, kept, cfg.non_target_name)
    check_manifest_rows(folder, every)
    if not dry_run:
        _write(cfg, folder, every, image_root, release, category_map, species, table, missing)
        if not cfg.bci:
            write_summary(out, region, table, kept, len(missing))
    return Imported(folder, table, missing, release.absent, plan, throttled)


def repository_map(source: str, region: str) -> str | None:
    """`SOURCE/data/<region>_category_map.json`, the repository's own, when SOURCE is its checkout."""
    path = Path(source).expanduser() / "data" / f"{region}_category_map.json"
    return str(path) if path.is_file() else None


def aux_labels(rows: dict[str, list[dict[str, Any]]]) -> None:
    """Give the auxiliary rows (train_aux, val_ood) their species' index among the auxiliary species, sorted, as
    `aux_label` (what make-splits writes, Extended's class of an auxiliary row), in speciesKey order, where the
    release names their species (the hub tables' speciesKey); rows without one get -1, and none is added when no
    row has one (download.py's lists carry no species: Extended then says it needs auxiliary class indices)."""
    aux = [r for part in rows.values() for r in part if r["ood_set"] == "auxiliary"]
    vocab = sorted({r["species"] for r in aux if r["species"] is not None}, key=lambda v: (len(v), v))
    if not vocab:
        return
    index = {v: i for i, v in enumerate(vocab)}
    for row in aux:
        row["aux_label"] = index.get(row["species"], -1)


def _present(root: Path, rows: dict[str, list[dict[str, Any]]]) -> tuple[dict[str, list], pd.DataFrame]:
    """The rows whose image is under `root` (one directory listing a folder) and the missing ones."""
    kept, missing = {}, []
    for name, part in rows.items():
        absent = dict(missing_images(Manifest(root, part)))
        kept[name] = [r for i, r in enumerate(part) if i not in absent]
        missing += [_missing(r, "image not found") for i, r in enumerate(part) if i in absent]
    return kept, _missing_frame(missing)


def _missing(row: dict[str, Any], reason: str) -> dict[str, Any]:
    return {"release_split": row["release_split"], "image_path": row["file_name"], "url": row.get("url"),
            "reason": reason}


def _missing_frame(missing: list[dict[str, Any]]) -> pd.DataFrame:
    return pd.DataFrame(missing, columns=["release_split", "image_path", "url", "reason"])


def _bring(cfg: OpenInsectImport, release: Release, rows: dict[str, list[dict[str, Any]]], out: Path,
           dry_run: bool) -> tuple[dict[str, list], pd.DataFrame, dict[str, Any] | None, HostsThrottled | None]:
    """Images of the hub or the repository files: the rows' own image bytes written (the BCI set), the others fetched
    by URL; returns the rows kept, the missing ones, a dry run's fetch plan and the hosts given up on."""
    written, by_url = _write_own_images(release, rows, Paths(out), dry_run)
    plan, throttled = None, None
    if by_url:
        plan, throttled = _fetch_by_url(cfg, by_url, out, dry_run)
        if not dry_run:
            written.update(_fetched(out, [r["file_name"] for r in by_url]))
    kept, missing = {}, []
    for name, part in rows.items():
        kept[name] = []
        for row in part:
            reason = written.get(f"{IMAGES}/{row['file_name']}", "") if not dry_run else ""
            if reason:
                missing.append(_missing(row, reason))
            else:
                kept[name].append(row)
    return kept, _missing_frame(missing), plan, throttled


def _write_own_images(release: Release, rows: dict[str, list[dict[str, Any]]], paths: Paths,
                      dry_run: bool) -> tuple[dict[str, str], list[dict[str, str]]]:
    """The rows' own image bytes written (file_name under OUT -> "" or why not; nothing written on a dry run) and
    the fetch table's rows of the others (a row with neither bytes nor URL is recorded as missing)."""
    written: dict[str, str] = {}
    by_url = []
    for name, part in release.splits.items():
        images = part.rows["image"].tolist() if "image" in part.rows.columns else [None] * len(part.rows)
        for row, image in zip(rows[name], images):
            target = f"{IMAGES}/{row['file_name']}"
            data = image.get("bytes") if isinstance(image, dict) else image if isinstance(image, bytes) else None
            if data is not None:
                written[target] = "" if dry_run else _write_image(paths, target, data)
            elif row.get("url"):
                by_url.append({"url": row["url"], "species": str(row["label"]), "file_name": target})
            else:
                written[target] = "no image and no identifier (URL) in the row"
    return written, by_url


def _fetch_by_url(cfg: OpenInsectImport, by_url: list[dict[str, str]], out: Path,
                  dry_run: bool) -> tuple[dict[str, Any] | None, HostsThrottled | None]:
    """The URL rows through fetch-images (a temporary table; the import's fetch settings): a dry run's plan, or the
    hosts given up on (every other image is written)."""
    plan, throttled = None, None
    with tempfile.TemporaryDirectory() as tmp:
        table = Path(tmp) / "open_insect_urls.csv"
        pd.DataFrame(by_url).to_csv(table, index=False)
        fetch_cfg = FetchConfig.from_dict({
            "occurrences": str(table), "out": str(out), "per_species": None, "resize": cfg.resize,
            "min_bytes": 0, "min_side": 0, "thumbnail_pattern": None, "timeout": cfg.timeout,
            "retries": cfg.retries, "workers": cfg.workers, "rate": cfg.rate}, "fetch")
        if dry_run:
            plan = fetch_plan(fetch_cfg)
        else:
            try:
                fetch_images(fetch_cfg)
            except HostsThrottled as err:  # every other image is written: the manifests are too
                throttled = err
    return plan, throttled


def _write_image(paths: Paths, target: str, data: bytes) -> str:
    """Write an image that came inside its row (as stored) at `target` under OUT; "" or why it was not."""
    try:
        path = paths.resolve(target)
    except FetchFailure as failure:
        return failure.reason
    if not (path.is_file() and path.stat().st_size == len(data) and path.read_bytes() == data):
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, data)
    return ""


def _fetched(out: Path, targets: list[str]) -> dict[str, str]:
    """file_name -> "" for what fetch_images kept (its images.csv), else its failure's reason (failures.csv)."""
    done = set(pd.read_csv(out / "images.csv", dtype=str, usecols=["file_name"])["file_name"]) \
        if (out / "images.csv").stat().st_size > 1 else set()
    failures = pd.read_csv(out / "failures.csv", dtype=str)
    reasons = dict(zip(failures["file_name"], failures["reason"]))
    return {t: "" if t in done else reasons.get(t, "not fetched (its URL is another row's)") for t in targets}


def _write(cfg: OpenInsectImport, folder: Path, rows: list[dict[str, Any]], image_root: Path, release: Release,
           category_map: str | None, species: list[str] | None, table: pd.DataFrame, missing: pd.DataFrame) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    write_manifest(folder, rows)
    atomic_write_json(folder / MANIFEST_INFO, {
        "image_root": str(image_root.expanduser().resolve()), "region": cfg.the_region,
        "source": {"kind": release.kind, "path": cfg.source if release.kind == "hub" else
                   str(Path(cfg.source).expanduser().resolve()), "category_map": category_map,
                   "absent_splits": release.absent},
        "classes": len(species) if species is not None else None, "missing_images": int(len(missing)),
    })
    if species is not None:
        write_class_names(folder, ClassNames(species, "species"))
    atomic_write_text(folder / "missing.csv", missing.to_csv(index=False))
    atomic_write_json(folder / "import_summary.json", {"counts": json.loads(table.to_json(orient="records")),
                                                       "absent_splits": release.absent})


def write_summary(out: Path, region: str, table: pd.DataFrame, kept: dict[str, list[dict[str, Any]]],
                  missing: int) -> None:
    """`OUT/summary.{json,csv,md}` in make-splits' schema (a `sets` list per region and set: name, role, split,
    species, images; no hops, which the release does not carry); another region's entries are kept."""
    path = out / "summary.json"
    old = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    sets = [s for s in old.get("sets", []) if s.get("region") != region]
    for entry in table.itertuples(index=False):
        split, role, ood_set, _ = RELEASE_SPLITS[entry.release_split]
        rows = kept[entry.release_split]
        if role == "id":
            key, species = f"id_{split}", len({r["label"] for r in rows})
        else:
            key = f"{SET_KEYS[ood_set]}_{split}"
            keys = {r["species"] for r in rows} - {None}
            species = len(keys) if keys else None
        sets.append({"region": region, "set": key, "name": entry.set, "role": role, "split": split,
                     "species": species, "images": len(rows), "hops": [], "release_split": entry.release_split})
    dropped = {k: v for k, v in (old.get("dropped") or {}).items() if k != f"missing image ({region})"}
    if missing:
        dropped[f"missing image ({region})"] = missing
    record = {"sets": sets, "dropped": dropped, "shortfalls": old.get("shortfalls", []),
              "missing_id_species": old.get("missing_id_species", {})}
    out.mkdir(parents=True, exist_ok=True)
    frame = pd.DataFrame(sets, columns=["region", "set", "species", "images"]).astype({"species": "Int64"})
    atomic_write_json(path, record)
    atomic_write_text(out / "summary.csv", frame.to_csv(index=False))
    header = "| " + " | ".join(frame.columns) + " |\n|" + "---|" * len(frame.columns) + "\n"
    atomic_write_text(out / "summary.md", header + "".join(
        "| " + " | ".join("" if pd.isna(v) else str(v) for v in row) + " |\n"
        for row in frame.itertuples(index=False)))

