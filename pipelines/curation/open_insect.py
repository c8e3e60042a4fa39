"""The released Open-Insect benchmark (Chen et al.; RolnickLab/Open-Insect) as manifests in make-splits' layout.

Three sources hold the same rows (`identifier` = the image URL, `image_path`, `label`, -1 for OOD), one table per
released split:
- a folder in `download.py`'s layout: `images/<image_path>` and the OpenOOD image lists
  `metadata/<region>/<split>.txt` (`<image_path> <label>` a line, split at the first space as OpenOOD's
  `ImglistDataset` does); the BCI field set as `metadata/c-america/test_ood_bci.txt` (`bci/<image_path> -1`);
- the Hugging Face dataset id (`HUB_ID`, a config per region; `BCI_HUB_ID`, split `test`), read with
  `datasets.load_dataset` (imported only then; its offline cache is honoured);
- the dataset repository's own files on disk (a local copy of the hub repository): the `configs:` / `data_files` of
  its README.md when present, else `<region>/<split>.{csv,parquet,arrow}` (sharded `-00000-of-0000N` names and the
  parquet conversion's `<region>/<split>/0000.parquet` too).
Released split names vary between the repository's revisions (`val_aux`, `test_ood_non_local` on the hub's README);
`ALIASES` maps them to download.py's. `RELEASE_SPLITS` gives each its manifest split, role, OOD set and group: the
values `make-splits` writes (gen.insects.manifests.SET_FIELDS; a test holds them equal).

A bad row (a path leaving the image root, a label outside the category map or not -1 in an OOD split, a repeated
image) is one `OpenInsectError` naming the file and line; an image that is not there is counted and listed (as the
reference's download log does), never an error.
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pipelines.errors import UserInputError

REGIONS = ("ne-america", "w-europe", "c-america")
HUB_ID = "yuyan-chen/open-insect"
BCI_HUB_ID = "yuyan-chen/open-insect-bci"
BCI_REGION = "c-america"
BCI_SPLIT = "test_ood_bci"
BCI_IMAGES = "bci"
"""download_bci.py writes the field set's images to `images/bci/` and lists them as `bci/<image_path>`."""
RELEASE_SPLITS: dict[str, tuple[str, str, str | None, str | None]] = {
    "train_id": ("train", "id", None, None), "val_id": ("val", "id", None, None), "test_id": ("test", "id", None, None),
    "test_ood_local": ("test", "ood", "local", "near"), "test_ood_non-local": ("test", "ood", "non_local", "far"),
    "test_ood_non-moth": ("test", "ood", "non_target", "far"), "train_aux": ("train", "ood", "auxiliary", None),
    "val_ood": ("val", "ood", "auxiliary", None),
}
"""Released split -> (split, role, ood_set, group) of its manifest rows (non_target: `non_target_name`)."""
FIELD_SPLIT = ("test", "ood", "bci", None)
"""The BCI field set's rows: the field source of configs/species_c-america.yaml (`ood_set` bci)."""
ALIASES = {"test_ood_non_local": "test_ood_non-local", "test_ood_non_moth": "test_ood_non-moth",
           "val_aux": "val_ood", "test": BCI_SPLIT}
COLUMNS = ("identifier", "image_path", "label")
TABLE_SUFFIXES = (".csv", ".parquet", ".arrow")
RESERVED = ("file_name", "split", "role", "ood_set", "group", "label", "species", "release_split", "url")
"""Manifest fields the importer sets; a released column of one of these names is kept as `release_<name>`."""


class OpenInsectError(UserInputError):
    """A released file or row that cannot be imported as it is (the message names the file and line)."""

    doc = "docs/species.md"


@dataclass
class ReleasedSplit:
    """One released split: its rows (`image_path`, `label`, `line`, and `identifier` / `image` / other columns when
    the source has them) and where they were read (a file, or the hub id and split)."""

    name: str
    rows: pd.DataFrame
    where: str


@dataclass
class Release:
    """The released splits of one region (or the BCI field set) and the folder their images are under."""

    region: str
    kind: str  # download | hub | files
    splits: dict[str, ReleasedSplit]
    image_root: Path | None  # the download folder's images/ (None: the images come with the rows or by URL)
    absent: list[str] = field(default_factory=list)  # released split names the source does not hold


def split_name(name: str) -> str:
    """A released split's name as download.py writes it (`ALIASES` applied)."""
    return ALIASES.get(name, name)


def wanted(bci: bool) -> tuple[str, ...]:
    return (BCI_SPLIT,) if bci else tuple(RELEASE_SPLITS)


def _labelled(name: str, frame: pd.DataFrame) -> pd.DataFrame:
    """The BCI dataset has no label column: download_bci.py lists every image with -1."""
    return frame.assign(label=-1) if name == BCI_SPLIT and "label" not in frame.columns else frame


# -- reading ------------------------------------------------------------------------------------------------------

def source_kind(source: str, region: str) -> str:
    """`download` (a folder holding download.py's `metadata/<region>/`; download.sh writes it into the repository
    checkout, beside its README.md and data/), `files` (another folder: a local copy of the dataset repository) or
    `hub` (an id)."""
    path = Path(source).expanduser()
    if path.is_dir():
        return "download" if (path / "metadata" / region).is_dir() else "files"
    if path.exists():
        raise OpenInsectError(f"{source}: a folder or a Hugging Face dataset id, not a file")
    if re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", source):
        return "hub"
    raise OpenInsectError(f"{source}: no such folder, and not a Hugging Face dataset id (owner/name, e.g. {HUB_ID})")


def read_release(source: str, region: str, bci: bool = False) -> Release:
    """The released splits of `region` (or, `bci`, the field set) from any of the three sources."""
    kind = source_kind(source, region)
    reader: Callable[[str, str, bool], Release] = {"download": read_download, "files": read_files,
                                                   "hub": read_hub}[kind]
    return reader(source, region, bci)


def read_download(source: str, region: str, bci: bool = False) -> Release:
    """download.py's folder: `metadata/<region>/<split>.txt` image lists over `images/`."""
    root = Path(source).expanduser()
    folder = root / "metadata" / region
    splits, absent = {}, []
    for name in wanted(bci):
        path = folder / f"{name}.txt"
        if path.is_file():
            splits[name] = ReleasedSplit(name, read_image_list(path), str(path))
        else:
            absent.append(name)
    if not splits:
        lists = ", ".join(f"{n}.txt" for n in wanted(bci))
        raise OpenInsectError(f"{folder}: none of the released image lists ({lists})")
    return Release(region, "download", splits, root / "images", absent)


def read_image_list(path: Path) -> pd.DataFrame:
    """An OpenOOD image list: `<image_path> <label>` a line, split at the first space (OpenOOD's ImglistDataset);
    a line without a label keeps it None (`check_rows` names it)."""
    paths, labels, lines = [], [], []
    with open(path, encoding="utf-8", errors="replace") as handle:
        for number, text in enumerate(handle, start=1):
            text = text.rstrip("\r\n")
            if not text.strip():
                continue
            image, _, label = text.partition(" ")
            paths.append(image)
            labels.append(label.strip() or None)
            lines.append(number)
    return pd.DataFrame({"image_path": paths, "label": labels, "line": lines})


def read_files(source: str, region: str, bci: bool = False) -> Release:
    """A local copy of the dataset repository: the tables its README's `configs` name, else found by name."""
    root = Path(source).expanduser()
    files = _readme_files(root, "default" if bci else region) or _found_files(root, None if bci else region)
    splits, absent = {}, []
    for name in wanted(bci):
        paths = files.get(name, [])
        if paths:
            frame = pd.concat([read_table(p) for p in paths], ignore_index=True) if len(paths) > 1 else \
                read_table(paths[0])
            splits[name] = ReleasedSplit(name, _labelled(name, frame), str(paths[0]) if len(paths) == 1 else
                                         f"{paths[0].parent}/{{{','.join(p.name for p in paths)}}}")
        else:
            absent.append(name)
    if not splits:
        what = "the BCI test split" if bci else f"the {region} splits"
        raise OpenInsectError(f"{root}: neither download.py's metadata/{region}/ nor a table of {what} (the "
                              f"dataset repository's README.md configs, or {'' if bci else region + '/'}<split>.csv / "
                              ".parquet / .arrow)")
    return Release(region, "files", splits, None, absent)


def _readme_files(root: Path, config: str) -> dict[str, list[Path]]:
    """Split -> files from the repository card's YAML front matter (`configs: [{config_name, data_files: [{split,
    path}]}]`), the way the hub reads a repository; {} without one."""
    import yaml

    card = root / "README.md"
    if not card.is_file():
        return {}
    text = card.read_text(encoding="utf-8", errors="replace")
    match = re.match(r"---\s*\n(.*?)\n---\s*(\n|$)", text, re.S)
    try:
        meta = yaml.safe_load(match.group(1)) if match else None
    except yaml.YAMLError as err:
        raise OpenInsectError(f"{card}: its YAML front matter does not parse ({err})".replace("\n", " ")) from None
    configs = meta.get("configs") if isinstance(meta, dict) else None
    if not isinstance(configs, list):
        return {}
    for entry in configs:
        if isinstance(entry, dict) and entry.get("config_name") == config:
            files: dict[str, list[Path]] = {}
            for item in entry.get("data_files") or []:
                if not isinstance(item, dict) or "split" not in item:
                    continue
                patterns = item.get("path")
                for pattern in patterns if isinstance(patterns, list) else [patterns]:
                    files.setdefault(split_name(str(item["split"])), []).extend(
                        sorted(p for p in root.glob(str(pattern)) if _inside(p, root)))
            return files
    return {}


def _found_files(root: Path, region: str | None) -> dict[str, list[Path]]:
    """Split -> files under `root/<region>/` (or `root/`, `root/data/` for the single-config BCI repository): a
    file's stem names its split (a shard suffix `-00000-of-00003` dropped), or its folder does (the parquet
    conversion's `<split>/0000.parquet`)."""
    folders = [root / region] if region else [root, root / "data", root / "default"]
    files: dict[str, list[Path]] = {}
    for folder in folders:
        if not folder.is_dir():
            continue
        for path in sorted(folder.rglob("*")):
            if path.suffix not in TABLE_SUFFIXES or not path.is_file() or not _inside(path, root):
                continue
            stem = re.sub(r"-\d{5}-of-\d{5}$", "", path.stem)
            name = stem if path.parent == folder else path.parent.name
            files.setdefault(split_name(name), []).append(path)
    return files


def _inside(path: Path, root: Path) -> bool:
    return os.path.realpath(path).startswith(os.path.realpath(root).rstrip(os.sep) + os.sep)


def read_table(path: Path) -> pd.DataFrame:
    """A released table (CSV, Parquet, or Arrow as `datasets` writes it) with its rows' `line` (CSV: the line in the
    file, the header being line 1; else the row number)."""
    try:
        if path.suffix == ".csv":
            frame = pd.read_csv(path, dtype={"image_path": str, "identifier": str}, keep_default_na=False,
                                na_values=[""])
            return frame.assign(line=np.arange(2, len(frame) + 2))
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            frame = pq.read_table(path).to_pandas()
        else:
            frame = _read_arrow(path)
    except (OSError, ValueError, pd.errors.ParserError) as err:
        raise OpenInsectError(f"{path}: not a readable {path.suffix[1:]} table ({err})".replace("\n", " ")) from None
    return frame.assign(line=np.arange(1, len(frame) + 1))


def _read_arrow(path: Path) -> pd.DataFrame:
    """An Arrow IPC file: the stream format `datasets` caches, else the file format."""
    import pyarrow as pa

    with pa.memory_map(str(path)) as source:
        try:
            return pa.ipc.open_stream(source).read_all().to_pandas()
        except pa.ArrowInvalid:
            source.seek(0)
            return pa.ipc.open_file(source).read_all().to_pandas()


def read_hub(source: str, region: str, bci: bool = False) -> Release:
    """The hub dataset through `datasets.load_dataset` (its cache; `HF_DATASETS_OFFLINE=1` reads only the cache).
    `--bci` with the region dataset's id reads `BCI_HUB_ID`."""
    try:
        from datasets import load_dataset
    except ImportError:
        raise OpenInsectError(f"reading {source} from the Hugging Face hub needs the `datasets` package: pip install "
                              "datasets (or pass a local copy: huggingface-cli download REPO --repo-type dataset "
                              "--local-dir DIR)") from None
    if bci:
        source = BCI_HUB_ID if source == HUB_ID else source
        loaded = {BCI_SPLIT: load_dataset(source, split="test")}
    else:
        loaded = {split_name(str(k)): v for k, v in load_dataset(source, region).items()}
    splits, absent = {}, []
    for name in wanted(bci):
        if name in loaded:
            frame = _labelled(name, loaded[name].to_pandas())
            splits[name] = ReleasedSplit(name, frame.assign(line=np.arange(1, len(frame) + 1)),
                                         f"{source} ({region if not bci else 'test'}/{name})")
        else:
            absent.append(name)
    if not splits:
        raise OpenInsectError(f"{source}: none of the released splits ({', '.join(wanted(bci))}) in config "
                              f"{region}; it has {', '.join(map(str, loaded)) or 'none'}")
    return Release(region, "hub", splits, None, absent)


def read_category_map(path: str | os.PathLike) -> list[str]:
    """`data/<region>_category_map.json` (GBIF speciesKey -> label index) as the name of each label."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise OpenInsectError(f"{path}: not a readable JSON category map ({err})") from None
    if not isinstance(raw, dict) or not raw or not all(isinstance(v, int) and not isinstance(v, bool)
                                                       for v in raw.values()):
        raise OpenInsectError(f"{path}: expected a JSON object {{speciesKey: label index}} "
                              "(RolnickLab/Open-Insect data/<region>_category_map.json)")
    names: list[str | None] = [None] * len(raw)
    for key, label in raw.items():
        if not 0 <= label < len(raw) or names[label] is not None:
            raise OpenInsectError(f"{path}: the label indices must be 0..{len(raw) - 1}, each once; {key!r} has "
                                  f"{label}")
        names[label] = str(key)
    return [str(n) for n in names]


# -- checking -----------------------------------------------------------------------------------------------------

SPECIES_KEY = "speciesKey"
"""The hub tables' GBIF species column: the species of every row (the category map's key of an ID label)."""


def species_keys(frame: pd.DataFrame) -> list[str | None]:
    """Each row's GBIF speciesKey as text (`1732901`, never `1732901.0`), None where the release has none."""
    if SPECIES_KEY not in frame.columns:
        return [None] * len(frame)
    out = []
    for value in frame[SPECIES_KEY].tolist():
        if value is None or (isinstance(value, float) and np.isnan(value)) or str(value).strip() == "":
            out.append(None)
        elif isinstance(value, (float, np.floating)) and float(value).is_integer():
            out.append(str(int(value)))
        else:
            out.append(str(value).strip())
    return out


def check_rows(release: Release, species: list[str] | None) -> None:
    """Every released row's path and label, and no image twice: all faults counted, the first named (file and
    line) in one OpenInsectError. `species`: the category map's names (ID labels must lie below its size, and a
    row's speciesKey, where the release has one, must be its label's)."""
    classes = len(species) if species is not None else None
    problems: list[str] = []
    seen: dict[str, tuple[str, int]] = {}
    for part in release.splits.values():
        frame = part.rows
        missing = [c for c in ("image_path", "label") if c not in frame.columns]
        if missing:
            raise OpenInsectError(f"{part.where}: no {' or '.join(missing)} column (the release has "
                                  f"{', '.join(COLUMNS)}); columns: {', '.join(map(str, frame.columns[:20]))}")
        role = RELEASE_SPLITS.get(part.name, FIELD_SPLIT)[1]
        labels = pd.to_numeric(frame["label"], errors="coerce").to_numpy(dtype=np.float64)
        bad_label = _bad_labels(labels, role, classes)
        if species is not None and role == "id":
            problems += _species_key_problems(part, labels, bad_label, species)
        problems += _label_problems(part, bad_label, role, classes)
        problems += _path_problems(part, seen)
    if problems:
        others = len(problems) - 1
        more = f" (and {others} more bad line{'s' if others > 1 else ''})" if others else ""
        raise OpenInsectError(problems[0] + more)


def _bad_labels(labels: np.ndarray, role: str, classes: int | None) -> np.ndarray:
    """Which labels are no integer, or not -1 in an OOD split, or outside 0..classes-1 in the others."""
    bad_label = ~np.isfinite(labels) | (labels != np.round(labels))
    if role == "ood":
        bad_label |= labels != -1
    else:
        bad_label |= labels < 0
        if classes is not None:
            bad_label |= labels >= classes
    return bad_label


def _species_key_problems(part: ReleasedSplit, labels: np.ndarray, bad_label: np.ndarray,
                          species: list[str]) -> list[str]:
    """An ID split's rows whose speciesKey is not their label's species in the category map."""
    frame = part.rows
    paths, lines = frame["image_path"].tolist(), frame["line"].tolist()
    problems = []
    for i, key in enumerate(species_keys(frame)):
        if key is not None and not bad_label[i] and species[int(labels[i])] != key:
            problems.append(f"{part.where}:{lines[i]}: speciesKey {key} of {paths[i]!r} is not "
                            f"label {int(labels[i])}'s in the category map ({species[int(labels[i])]})")
    return problems


def _label_problems(part: ReleasedSplit, bad_label: np.ndarray, role: str, classes: int | None) -> list[str]:
    """One line per bad label: a blank one, or the value and what was expected."""
    frame = part.rows
    paths, lines = frame["image_path"].tolist(), frame["line"].tolist()
    problems = []
    for i in np.flatnonzero(bad_label):
        value, here = frame["label"].iloc[i], f"{part.where}:{lines[i]}"
        if value is None or (isinstance(value, float) and np.isnan(value)):
            problems.append(f"{here}: {paths[i]!r} has no label (a line is `<image_path> <label>`)")
            continue
        want = "-1 (OOD)" if role == "ood" else (f"a label 0..{classes - 1} of the category map" if classes
                                                 else "a class index >= 0")
        problems.append(f"{here}: label {value!r} of {paths[i]!r}: expected {want}")
    return problems


def _path_problems(part: ReleasedSplit, seen: dict[str, tuple[str, int]]) -> list[str]:
    """One line per image_path that cannot be taken (`path_fault`) or that an earlier row holds (`seen`, updated)."""
    frame = part.rows
    paths, lines = frame["image_path"].tolist(), frame["line"].tolist()
    problems = []
    for i, path in enumerate(paths):
        reason = path_fault(path)
        if reason is not None:
            problems.append(f"{part.where}:{lines[i]}: image_path {path!r} {reason}")
        elif path in seen:
            first = "{}:{}".format(*seen[path])
            problems.append(f"{part.where}:{lines[i]}: image_path {path!r} is also at {first} (one image, one "
                            "row)")
        else:
            seen[path] = (part.where, lines[i])
    return problems


DRIVE = re.compile(r"[A-Za-z]:")
SEPARATORS = re.compile(r"[\\/]")


def path_fault(path: Any) -> str | None:
    """Why an image_path cannot be taken (None: it can): blank, absolute, or leaving the image root."""
    if not isinstance(path, str) or not path.strip():
        return "is blank"
    if "\0" in path:
        return "holds a NUL byte"
    if path.startswith(("/", "\\")) or DRIVE.match(path):
        return "is absolute (it must lie under the image root)"
    if ".." in path and ".." in SEPARATORS.split(path):
        return "leaves the image root ('..')"
    return None


# -- rows ---------------------------------------------------------------------------------------------------------

def manifest_rows(part: ReleasedSplit, prefix: str, species: list[str] | None,
                  non_target_name: str) -> list[dict[str, Any]]:
    """The manifest rows of one released split: file_name (`prefix` + image_path, relative to the image root), its
    split, role, set and group (`RELEASE_SPLITS`), label, species (the category map's speciesKey, ID rows),
    `release_split`, `url` (the identifier) and every other released column. A row's species: its label's in the
    category map (ID rows), else its speciesKey where the release has one."""
    split, role, ood_set, group = RELEASE_SPLITS.get(part.name, FIELD_SPLIT)
    if ood_set == "non_target":
        ood_set = non_target_name
    frame = part.rows
    extra = [c for c in frame.columns if c not in ("image_path", "label", "line", "identifier", "image")]
    renamed = {c: f"release_{c}" if c in RESERVED else str(c) for c in extra}
    labels = pd.to_numeric(frame["label"]).astype(np.int64).tolist()
    urls = frame["identifier"].tolist() if "identifier" in frame.columns else [None] * len(frame)
    columns = {renamed[c]: _plain(frame[c]) for c in extra}
    keys = species_keys(frame)
    rows = []
    for i, (path, label, url) in enumerate(zip(frame["image_path"].tolist(), labels, urls)):
        row = {"file_name": prefix + path, "split": split, "role": role, "ood_set": ood_set, "group": group,
               "label": label if role == "id" else -1,
               "species": species[label] if species is not None and role == "id" else keys[i],
               "release_split": part.name, "url": url if isinstance(url, str) and url else None}
        row.update({name: values[i] for name, values in columns.items()})
        rows.append(row)
    return rows


def _plain(column: pd.Series) -> list[Any]:
    """A column's values as JSON-ready scalars (missing as None; a value that is not a scalar as its text)."""
    values = column.astype(object).where(column.notna(), None).tolist()
    out = []
    for value in values:
        if isinstance(value, np.generic):
            value = value.item()
        out.append(value if value is None or isinstance(value, (str, int, float, bool)) else str(value))
    return out


def counts(release: Release, rows: dict[str, list[dict[str, Any]]] | None = None,
           non_target_name: str = "non_target") -> pd.DataFrame:
    """Table 1's counts per released split: its manifest split, role and set, the released rows, the ID classes
    (distinct labels) and, with `rows` (split -> the rows kept), the images imported and those missing."""
    table = []
    for name, part in release.splits.items():
        split, role, ood_set, _ = RELEASE_SPLITS.get(name, FIELD_SPLIT)
        labels = pd.to_numeric(part.rows["label"], errors="coerce")
        entry = {"release_split": name, "split": split, "role": role,
                 "set": "id" if role == "id" else (non_target_name if ood_set == "non_target" else ood_set),
                 "released": len(part.rows), "classes": int(labels[labels >= 0].nunique()) if role == "id" else None}
        if rows is not None:
            entry["images"] = len(rows.get(name, []))
            entry["missing"] = len(part.rows) - entry["images"]
        table.append(entry)
    return pd.DataFrame(table).astype({"classes": "Int64"})
