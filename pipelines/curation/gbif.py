"""GBIF occurrence data as one table of images: Darwin Core Archives (a GBIF download zip or its unpacked folder) and
plain CSV / TSV / Parquet tables, GBIF column names mapped, taxon filters, and rows dropped by counted reasons.

A Darwin Core Archive is read through its `meta.xml` (parsed by `python-dwca-reader`'s `ArchiveDescriptor`): the core
data file (`occurrence.txt`) joined with the multimedia extension (`multimedia.txt`, GBIF's `identifier` = the image
URL, or Audubon Core's `accessURI`) on the core id (`gbifID`), one row per still image. Only the columns this project
reads are loaded (`KEEP`), straight from the zip member (nothing is extracted). Text tables have their delimiter
detected from the header line (tab, comma, semicolon or bar; tab-separated files are read unquoted, as GBIF writes
them). Every value is read as text; coordinates become numbers in `clean`.

`normalise` maps the GBIF names (`decimalLatitude` -> `lat`, `decimalLongitude` -> `lon`, `identifier` -> `url` when
it holds http(s) URLs)
and derives `file_name` from the URL (`image_file_name`, the layout `fetch_images` writes) where the table has none.
"""
from __future__ import annotations

import csv
import hashlib
import io
import os
import zipfile
from collections import Counter
from pathlib import Path, PurePosixPath
from typing import Any, Literal
from urllib.parse import urlsplit

import numpy as np
import pandas as pd

from pipelines.errors import ConfigError, UserInputError
from pipelines.params import Config, config, param


class TableError(UserInputError):
    """A bad occurrence table or archive: the message names the file, column or value."""


# GBIF name -> this project's name (other columns keep their GBIF names: speciesKey, taxonRank, basisOfRecord, ...)
RENAME = {"decimalLatitude": "lat", "decimalLongitude": "lon", "identifier": "url", "accessURI": "url"}
KEEP = ("gbifID", "id", "coreid", "kingdom", "phylum", "class", "order", "family", "genus", "species", "scientificName",
        "taxonKey", "speciesKey", "genusKey", "familyKey", "orderKey", "taxonRank", "taxonomicStatus", "basisOfRecord",
        "lifeStage", "datasetKey", "countryCode", "decimalLatitude", "decimalLongitude", "lat", "lon",
        "type", "format", "identifier", "accessURI", "license", "rightsHolder", "file_name", "url", "split", "taxon")
"""The archive columns read (GBIF's occurrence.txt has some 250); a plain table keeps all its columns."""
MULTIMEDIA_TYPES = ("http://rs.gbif.org/terms/1.0/Multimedia", "http://rs.tdwg.org/ac/terms/Multimedia")
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".gif", ".tif", ".tiff", ".bmp")
DELIMITERS = ("\t", ",", ";", "|")

# drop reasons, counted in splits/summary.md and fetch_images' summary
TAXON_FILTER, BLANK_SPECIES, NO_COORDINATES = "taxon filter", "blank species", "no coordinates"
DUPLICATE_URL, MISSING_FILE = "duplicate URL", "missing file"

BUTTERFLY_FAMILIES = ("Papilionidae", "Hesperiidae", "Pieridae", "Riodinidae", "Lycaenidae", "Nymphalidae", "Hedylidae")
"""Open-Insects' moths (Appendix A.2): Lepidoptera minus these families; taxonomic status accepted; species rank."""


# -- reading ----------------------------------------------------------------------------------------------------

def is_archive(path: str | os.PathLike) -> bool:
    """A Darwin Core Archive: a zip, or a folder holding `meta.xml`."""
    path = Path(path)
    return (path.is_dir() and (path / "meta.xml").is_file()) or (path.is_file() and zipfile.is_zipfile(path))


def read_occurrences(path: str | os.PathLike) -> pd.DataFrame:
    """A Darwin Core Archive (zip or folder) or a CSV / TSV / Parquet table, GBIF names mapped (`normalise`)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"occurrence table or archive not found: {path}")
    return normalise(read_archive(path) if is_archive(path) else read_table(path), str(path))


def read_table(path: str | os.PathLike) -> pd.DataFrame:
    """A Parquet table, or a text table with its delimiter detected; every text value as a string."""
    path = Path(path)
    if path.is_dir():
        raise TableError(f"{path}: a folder without meta.xml (not a Darwin Core Archive); give a table or an archive")
    if not path.is_file():
        raise FileNotFoundError(f"table not found: {path}")
    try:
        if path.suffix.lower() in (".parquet", ".pq"):
            return pd.read_parquet(path)
        with open(path, encoding="utf-8-sig", newline="") as handle:
            return _read_text(handle, _delimiter(handle.readline()), 0, None)
    except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError, OSError, ValueError) as err:
        if isinstance(err, FileNotFoundError):
            raise
        raise TableError(f"{path}: not a readable table ({' '.join(str(err).split())[:200]})") from None


def _delimiter(header: str) -> str:
    counts = {d: header.count(d) for d in DELIMITERS}
    best = max(DELIMITERS, key=lambda d: counts[d])
    return best if counts[best] else ","


def _read_text(handle: Any, sep: str, skip: int, names: list[str] | None, usecols: Any = None) -> pd.DataFrame:
    handle.seek(0)
    quoting = csv.QUOTE_NONE if sep == "\t" else csv.QUOTE_MINIMAL  # GBIF (and TSV) fields are never quoted
    return pd.read_csv(handle, sep=sep, quoting=quoting, dtype=str, keep_default_na=False, na_values=[""],
                       skiprows=skip, header=None if names else 0, names=names, usecols=usecols, low_memory=False)


def read_archive(path: str | os.PathLike) -> pd.DataFrame:
    """Core joined with the multimedia extension on the core id, one row per still image (the core alone when the
    archive has no multimedia extension). The id column is named `gbifID`. A zip without meta.xml holding one file
    (GBIF's SIMPLE_CSV download) is that table."""
    from dwca.descriptors import ArchiveDescriptor

    path = Path(path)
    with _Members(path) as members:
        try:
            descriptor = ArchiveDescriptor(members.text("meta.xml"))
        except KeyError:
            return members.single_table()
        except Exception as err:  # noqa: BLE001 (the reader's XML and descriptor errors)
            raise TableError(f"{path}: meta.xml is not a Darwin Core Archive descriptor ({err})") from None
        core = _read_data_file(members, descriptor.core, "id", path)
        media = [d for d in descriptor.extensions if d.type in MULTIMEDIA_TYPES]
        if not media:
            return core
        ext = _read_data_file(members, media[0], "coreid", path)
    if "type" in ext.columns:  # GBIF: StillImage / MovingImage / Sound; a blank type is kept
        kind = ext["type"].astype("string").str.strip().str.casefold().str.rsplit("/", n=1).str[-1]
        ext = ext[ext["type"].isna() | kind.isin(["stillimage", "image"]).fillna(False).to_numpy(bool)]
    # the image's own terms win: GBIF's occurrence.txt has dcterms identifier / type / license columns of its own
    core = core.drop(columns=[c for c in ext.columns if c in core.columns and c != "gbifID"])
    return core.merge(ext, on="gbifID", how="inner", validate="one_to_many")


def _read_data_file(members: "_Members", descriptor: Any, id_name: str, path: Path) -> pd.DataFrame:
    location = descriptor.file_location
    names = descriptor.short_headers
    if len(set(names)) != len(names):
        raise TableError(f"{path}: meta.xml names a column twice in {location}")
    try:
        with members.open(location, descriptor.file_encoding or "utf-8") as handle:
            frame = _read_text(handle, descriptor.fields_terminated_by, descriptor.lines_to_ignore, names,
                               usecols=lambda c: c in KEEP)
    except KeyError:
        raise TableError(f"{path}: meta.xml names {location}, which the archive does not hold") from None
    except (pd.errors.ParserError, UnicodeDecodeError) as err:
        raise TableError(f"{path}: {location} is not readable ({' '.join(str(err).split())[:200]})") from None
    if "gbifID" not in frame.columns and id_name in frame.columns:
        frame = frame.rename(columns={id_name: "gbifID"})
    if "gbifID" not in frame.columns:
        raise TableError(f"{path}: {location} has no id column (meta.xml <{id_name} index=...>)")
    for field in descriptor.fields:  # a term with a default value and no column
        name = field["term"].rsplit("/", 1)[-1]
        if field.get("default") is not None and field.get("index") is None and name in KEEP:
            frame[name] = field["default"]
    return frame.drop(columns=[c for c in (id_name,) if c in frame.columns and c != "gbifID"])


class _Members:
    """The files of an archive, zipped or unpacked, read in place."""

    def __init__(self, path: Path):
        self.path = path
        self.zip = zipfile.ZipFile(path) if path.is_file() else None

    def __enter__(self) -> "_Members":
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.zip is not None:
            self.zip.close()

    def open(self, name: str, encoding: str) -> Any:
        if self.zip is None:
            if not (self.path / name).is_file():
                raise KeyError(name)
            return open(self.path / name, encoding=encoding, newline="")
        return io.TextIOWrapper(self.zip.open(name), encoding=encoding, newline="")

    def single_table(self) -> pd.DataFrame:
        """The one table of a zip without meta.xml (GBIF's SIMPLE_CSV download: one tab-separated file)."""
        names = [n for n in self.zip.namelist() if not n.endswith("/")] if self.zip is not None else []
        if len(names) != 1:
            raise TableError(f"{self.path}: no meta.xml (not a Darwin Core Archive) and {len(names)} files, not one "
                             "table; give occurrence.txt itself or the whole GBIF download")
        with self.open(names[0], "utf-8-sig") as handle:
            return _read_text(handle, _delimiter(handle.readline()), 0, None)

    def text(self, name: str) -> str:
        with self.open(name, "utf-8") as handle:
            return handle.read()


# -- GBIF names, file names ------------------------------------------------------------------------------------

def normalise(frame: pd.DataFrame, source: str = "occurrence table") -> pd.DataFrame:
    """GBIF names mapped (`RENAME`, a column already named so wins; identifier only when it holds URLs) and
    `file_name` derived from `url` when absent."""
    rename = {k: v for k, v in RENAME.items() if k in frame.columns and v not in frame.columns
              and (v != "url" or _urls(frame[k]))}
    frame = frame.rename(columns=rename)
    frame = frame.loc[:, ~frame.columns.duplicated()]
    if "file_name" not in frame.columns and "url" in frame.columns:
        frame["file_name"] = [image_file_name(u) if isinstance(u, str) and u else None for u in frame["url"]]
    return frame


def _urls(column: pd.Series) -> bool:
    """True when every non-blank value is an http(s) URL (occurrence.txt's own dcterms identifier is not)."""
    values = column.dropna().astype(str)
    return bool(len(values)) and bool(values.str.match(r"https?://").all())


def image_file_name(url: str) -> str:
    """Where an image URL's file lives under an image root: `images/<h[:2]>/<h>.<suffix>`, h a hash of the URL and
    the suffix the URL's own when it is an image suffix (else .jpg). `fetch_images` writes exactly there."""
    digest = hashlib.sha256(url.encode("utf-8")).hexdigest()[:24]
    suffix = PurePosixPath(urlsplit(url).path).suffix.lower()
    return f"images/{digest[:2]}/{digest}{suffix if suffix in IMAGE_SUFFIXES else '.jpg'}"


# -- taxon filters ---------------------------------------------------------------------------------------------

def _check_rules(rules: list[str], key: str) -> None:
    for rule in rules:
        rank, found, values = rule.partition("=")
        if not found or not rank.strip() or not [v for v in values.split(",") if v.strip()]:
            raise ConfigError(f"{key}: a rule is RANK=VALUE[,VALUE...] (e.g. family=Noctuidae), got {rule!r}")


def parse_rules(rules: list[str]) -> dict[str, set[str]]:
    """['family=Noctuidae,Erebidae', 'genus=X'] -> {'family': {'noctuidae', 'erebidae'}, 'genus': {'x'}} (casefolded)."""
    out: dict[str, set[str]] = {}
    for rule in rules:
        rank, _, values = rule.partition("=")
        out.setdefault(rank.strip(), set()).update(v.strip().casefold() for v in values.split(",") if v.strip())
    return out


@config
class TaxonFilter(Config):
    """Which taxa to keep: a named rule and include / exclude rules by any rank (any column of the table)."""

    DOC = "docs/species.md"

    preset: Literal["moths"] | None = param(None, "'moths': Lepidoptera minus the butterfly families, taxonomicStatus "
                                                  "ACCEPTED, taxonRank SPECIES (Open-Insects, Appendix A.2)")
    include: list[str] = param([], "RANK=VALUE[,VALUE]: keep only rows whose RANK column holds one of the values",
                               check=_check_rules)
    exclude: list[str] = param([], "RANK=VALUE[,VALUE]: drop rows whose RANK column holds one of the values",
                               check=_check_rules)

    @property
    def active(self) -> bool:
        return bool(self.preset or self.include or self.exclude)

    def keep(self, frame: pd.DataFrame, source: str = "occurrence table") -> np.ndarray:
        """Boolean mask of the rows the filter keeps; a rank that is no column of the table is one TableError."""
        include, exclude = parse_rules(self.include), parse_rules(self.exclude)
        if self.preset == "moths":
            include.setdefault("order", set()).add("lepidoptera")
            include.setdefault("taxonomicStatus", set()).add("accepted")
            include.setdefault("taxonRank", set()).add("species")
            exclude.setdefault("family", set()).update(f.casefold() for f in BUTTERFLY_FAMILIES)
        missing = sorted({*include, *exclude} - set(frame.columns))
        if missing:
            raise TableError(f"{source}: the taxon filter needs column(s) {missing}, which the table lacks "
                             f"(columns: {', '.join(map(str, frame.columns[:30]))})", doc=self.DOC)
        keep = np.ones(len(frame), dtype=bool)
        for rank, values in include.items():
            keep &= _folded(frame[rank]).isin(values).to_numpy()
        for rank, values in exclude.items():
            keep &= ~_folded(frame[rank]).isin(values).to_numpy()
        return keep


def _folded(column: pd.Series) -> pd.Series:
    return column.astype("string").str.strip().str.casefold()


# -- cleaning ----------------------------------------------------------------------------------------------------

def coordinates(frame: pd.DataFrame, source: str = "occurrence table") -> tuple[np.ndarray, np.ndarray]:
    """`lat`, `lon` as float64 (blank = NaN); a value that is not a number or is out of range is one TableError
    naming the row (a typo is refused, never kept as a blank)."""
    out = []
    for column, limit in (("lat", 90.0), ("lon", 180.0)):
        text = frame[column]
        values = pd.to_numeric(text, errors="coerce").to_numpy(dtype=np.float64)
        given = (text.astype("string").str.strip() != "").fillna(False).to_numpy(bool)  # blank: no coordinates
        bad = (np.isnan(values) & given) | (np.abs(values) > limit)
        if bad.any():
            first = int(np.flatnonzero(bad)[0])
            raise TableError(f"{source}: {row_name(frame, first)}: {column} {text.iloc[first]!r} is not a "
                             f"{'latitude' if column == 'lat' else 'longitude'} (a number in [-{limit:g}, {limit:g}])")
        out.append(values)
    return out[0], out[1]


def row_name(frame: pd.DataFrame, position: int) -> str:
    """How a message names a row: its gbifID, else its file_name, else its line in a text table (header = line 1)."""
    for column in ("gbifID", "file_name"):
        if column in frame.columns and pd.notna(frame[column].iloc[position]):
            return f"row {column}={frame[column].iloc[position]}"
    return f"line {int(frame.index[position]) + 2}"


def clean(frame: pd.DataFrame, taxa: TaxonFilter | None = None, *, source: str = "occurrence table",
          image_root: str | os.PathLike | None = None) -> tuple[pd.DataFrame, Counter]:
    """The rows the splits can use and the count of every row dropped, by reason: the taxon filter, no coordinates
    (blank lat or lon), a duplicate URL (the first row kept), a missing image file under `image_root` (when given)."""
    dropped: Counter = Counter()

    def drop(mask: np.ndarray, reason: str) -> None:
        nonlocal frame
        if mask.any():
            dropped[reason] += int(mask.sum())
            frame = frame.loc[~mask]

    if taxa is not None and taxa.active:
        drop(~taxa.keep(frame, source), TAXON_FILTER)
    for column in ("lat", "lon"):
        if column not in frame.columns:
            raise TableError(f"{source}: no {column} column (nor GBIF's decimalLatitude / decimalLongitude)")
    lat, lon = coordinates(frame, source)
    frame = frame.assign(lat=lat, lon=lon)
    drop(np.isnan(lat) | np.isnan(lon), NO_COORDINATES)
    if "url" in frame.columns:
        drop((frame["url"].duplicated() & frame["url"].notna()).to_numpy(), DUPLICATE_URL)
    if image_root is not None and "file_name" in frame.columns:
        root = Path(image_root)
        drop(np.array([not isinstance(f, str) or not (root / f).is_file() for f in frame["file_name"]], dtype=bool),
             MISSING_FILE)
    return frame.reset_index(drop=True), dropped
