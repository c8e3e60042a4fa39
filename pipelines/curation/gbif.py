"""GBIF occurrence data as one table of images: Darwin Core Archives (a GBIF download zip or its unpacked folder) and
plain CSV / TSV / Parquet tables, GBIF column names mapped, taxon filters, and rows dropped by counted reasons.

A Darwin Core Archive is read through its `meta.xml` (`pipelines.curation.dwca`, as the DwC-A text guide describes
it): the core data file (`occurrence.txt`) joined with the multimedia extension (`multimedia.txt`, GBIF's
`identifier` = the image URL, or Audubon Core's `accessURI`) on the core id, one row per still image. Only the
columns this project reads are kept (`KEEP`), streamed straight from the zip member (nothing is extracted) through
pyarrow's CSV reader (`pipelines.curation.delimited`), within `TableLimits`. Text tables have their delimiter
detected from the header line (tab, comma, semicolon or bar; tab-separated files are read unquoted, as GBIF writes
them). Every value is read as text; coordinates become numbers in `clean`.

`normalise` maps the GBIF names (`decimalLatitude` -> `lat`, `decimalLongitude` -> `lon`, `identifier` -> `url` when
it holds http(s) URLs)
and derives `file_name` from the URL (`image_file_name`, the layout `fetch_images` writes) where the table has none.
"""
from __future__ import annotations

import hashlib
import os
import re
import zipfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Literal
from urllib.parse import urlsplit

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.curation.delimited import (
    Dialect,
    TableError,
    TableLimits,
    first_lines,
    read_delimited,
    sniff_delimiter,
    split_line,
    stat_regular,
)
from pipelines.curation.dwca import (
    ID,
    MAX_META_BYTES,
    META,
    Members,
    parse_meta,
    read_data_file,
    star_rows,
    take_columns,
)
from pipelines.curation.parquet import read_parquet
from pipelines.curation.paths import blank_names, files_under, leaving_names, real_target
from pipelines.errors import ConfigError
from pipelines.params import Config, config, param

# GBIF name -> this project's name (other columns keep their GBIF names: speciesKey, taxonRank, basisOfRecord, ...)
RENAME = {"decimalLatitude": "lat", "decimalLongitude": "lon", "identifier": "url", "accessURI": "url"}
KEEP = ("gbifID", "id", "coreid", "kingdom", "phylum", "class", "order", "family", "genus", "species", "scientificName",
        "taxonKey", "speciesKey", "genusKey", "familyKey", "orderKey", "taxonRank", "taxonomicStatus", "basisOfRecord",
        "lifeStage", "datasetKey", "countryCode", "decimalLatitude", "decimalLongitude", "lat", "lon",
        "type", "format", "identifier", "accessURI", "license", "rightsHolder", "file_name", "url", "split", "taxon")
"""The archive columns read (GBIF's occurrence.txt has some 250); a plain table keeps all its columns."""
USED = frozenset({*RENAME, *RENAME.values(), *KEEP})
"""The columns read from a plain table: one holding lists or structs is refused (`pipelines.curation.parquet`)."""
MULTIMEDIA_TYPES = ("http://rs.gbif.org/terms/1.0/Multimedia", "http://rs.tdwg.org/ac/terms/Multimedia")
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".gif", ".tif", ".tiff", ".bmp")
CHUNK_ROWS = 100_000
"""Rows handled at a time where a column is built in Python (file names from URLs)."""
STILL_IMAGE = r"(?:^|/)(?:stillimage|image)$"
"""A multimedia `type` kept (casefolded, trimmed; its last path part: GBIF's StillImage, DCMI's .../StillImage)."""

# drop reasons, counted in splits/summary.md and fetch_images' summary
TAXON_FILTER, BLANK_SPECIES, NO_COORDINATES = "taxon filter", "blank species", "no coordinates"
DUPLICATE_URL, NO_FILE_NAME, MISSING_FILE = "duplicate URL", "no file name", "missing file"

BUTTERFLY_FAMILIES = ("Papilionidae", "Hesperiidae", "Pieridae", "Riodinidae", "Lycaenidae", "Nymphalidae", "Hedylidae")
"""Open-Insects' moths (Appendix A.2): Lepidoptera minus these families; taxonomic status accepted; species rank."""


# -- reading ----------------------------------------------------------------------------------------------------

def is_archive(path: str | os.PathLike) -> bool:
    """A Darwin Core Archive: a zip, or a folder holding `meta.xml`."""
    path = Path(path)
    return (path.is_dir() and (path / META).exists()) or (path.is_file() and zipfile.is_zipfile(path))


def read_occurrences(path: str | os.PathLike, limits: TableLimits | None = None) -> pd.DataFrame:
    """A Darwin Core Archive (zip or folder) or a CSV / TSV / Parquet table, GBIF names mapped (`normalise`)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"occurrence table or archive not found: {path}")
    limits = limits or TableLimits()
    return normalise(read_archive(path, limits) if is_archive(path) else read_table(path, limits), str(path))


def read_table(path: str | os.PathLike, limits: TableLimits | None = None) -> pd.DataFrame:
    """A Parquet table, or a text table with its delimiter detected; every text value as a string."""
    path, limits = Path(path), limits or TableLimits()
    if path.is_dir():
        raise TableError(f"{path}: a folder without meta.xml (not a Darwin Core Archive); give a table or an archive")
    if not path.is_file():
        raise FileNotFoundError(f"table not found: {path}")
    size = stat_regular(path).st_size
    if path.suffix.lower() in (".parquet", ".pq"):
        return _read_parquet(path, limits)
    return _to_pandas(_read_text_table(lambda: open(path, "rb"), limits, str(path), size))


def _read_parquet(path: Path, limits: TableLimits) -> pd.DataFrame:
    import pyarrow.parquet as pq

    try:
        rows = pq.ParquetFile(path).metadata.num_rows
        if rows > limits.max_rows:
            raise TableError(f"{path}: {rows:,} rows, more than {limits.describe('max_rows')} (TableLimits)",
                             doc=TableLimits.DOC)
        return read_parquet(path, USED)
    except (pa.ArrowException, OSError, ValueError) as err:
        if isinstance(err, TableError):
            raise
        raise TableError(f"{path}: not a readable table ({' '.join(str(err).split())[:200]})") from None


def _read_text_table(opener, limits: TableLimits, source: str, size: int | None) -> pa.Table:
    """A text table: the header line names the columns, its delimiter detected (tab: never quoted, as GBIF writes)."""
    header = first_lines(opener, Dialect(), 1, limits, source)
    if not header or not header[0].strip():
        raise TableError(f"{source}: not a readable table (no header line)")
    sep = sniff_delimiter(header[0])
    dialect = Dialect(sep=sep, quote=None if sep == "\t" else '"', header_lines=1)
    names = [name if name else f"Unnamed: {i}" for i, name in enumerate(split_line(header[0], dialect))]
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise TableError(f"{source}: the header names column {name!r} twice")
        seen.add(name)
    return read_delimited(opener, dialect, None, limits, source, names=names, size=size)


def _to_pandas(table: pa.Table) -> pd.DataFrame:
    """Text columns as pandas' own string dtype (pandas 3: Arrow-backed, no copy into Python objects), each column
    one contiguous chunk (pandas takes rows from a many-chunked column slowly), converted column by column."""
    columns = {name: table.column(name) for name in table.column_names}
    del table
    for name in list(columns):
        column = columns.pop(name)
        if pa.types.is_string(column.type):
            column = column.cast(pa.large_string())
        columns[name] = column.combine_chunks() if column.num_chunks > 1 else column
    return pa.table(columns).to_pandas(self_destruct=True, split_blocks=True)


def read_archive(path: str | os.PathLike, limits: TableLimits | None = None) -> pd.DataFrame:
    """Core joined with the multimedia extension on the core id, one row per still image (the core alone when the
    archive has no multimedia extension). The core's gbifID field, else its id column, is named `gbifID`. A zip
    without meta.xml holding one file (GBIF's SIMPLE_CSV download) is that table."""
    return _to_pandas(read_archive_table(Path(path), limits or TableLimits()))


def read_archive_table(path: Path, limits: TableLimits) -> pa.Table:
    """`read_archive` as an Arrow table of text columns."""
    with Members(path) as members:
        try:
            text = members.read_text(META, MAX_META_BYTES)
        except KeyError:
            return _single_table(members, limits)
        core_file, extensions = parse_meta(text, str(path))
        media = [d for d in extensions if d.row_type in MULTIMEDIA_TYPES]
        if not media:
            return _gbif_id(read_data_file(members, core_file, KEEP.__contains__, limits))
        if core_file.id_index is None:
            raise TableError(f"{path}: meta.xml's <core> has no <id index=...>, which its multimedia extension needs "
                             "to link images to occurrences")
        # the image's own terms win: GBIF's occurrence.txt has dcterms identifier / type / license columns of its own
        own = {f.name for f in media[0].fields if f.name in KEEP and f.name != "gbifID"}
        core = _gbif_id(read_data_file(members, core_file, lambda name: name in KEEP and name not in own, limits),
                        keep_id=True)
        ext = read_data_file(members, media[0], own.__contains__, limits, keep_rows=_still_images)
    core_rows, ext_rows = star_rows(core.column(ID), ext.column(ID), members.source(core_file.locations[0]))
    left = {name: core.column(name) for name in core.column_names if name != ID}
    right = {name: ext.column(name) for name in ext.column_names if name != ID}
    del core, ext  # from here each column is freed once taken
    joined = {**take_columns(left, core_rows), **take_columns(right, ext_rows)}
    return pa.table(joined)


def _gbif_id(table: pa.Table, keep_id: bool = False) -> pa.Table:
    """The core's id column as `gbifID` unless the core declares a gbifID field (then the id column is dropped, or
    kept for the join with `keep_id`)."""
    if ID not in table.column_names:
        return table
    if "gbifID" not in table.column_names:
        at = table.column_names.index(ID)
        table = table.add_column(at, "gbifID", table.column(ID))
    return table if keep_id else table.drop_columns([ID])


def _still_images(batch: pa.RecordBatch) -> pa.Array | bool:
    """GBIF: StillImage / MovingImage / Sound; a blank type is kept."""
    if "type" not in batch.schema.names:
        return pa.array(np.ones(batch.num_rows, dtype=bool))
    kind = pc.utf8_lower(pc.utf8_trim_whitespace(batch.column("type")))
    return pc.or_kleene(pc.is_null(kind), pc.match_substring_regex(kind, STILL_IMAGE)).fill_null(True)


def _single_table(members: Members, limits: TableLimits) -> pa.Table:
    """The one table of a zip without meta.xml (GBIF's SIMPLE_CSV download: one tab-separated file)."""
    names = members.files()
    if len(names) != 1:
        raise TableError(f"{members.path}: no meta.xml (not a Darwin Core Archive) and {len(names)} files, not one "
                         "table; give occurrence.txt itself or the whole GBIF download")
    opener, size = members.locate(names[0])
    return _read_text_table(opener, limits, members.source(names[0]), size)


# -- GBIF names, file names ------------------------------------------------------------------------------------

def normalise(frame: pd.DataFrame, source: str = "occurrence table") -> pd.DataFrame:
    """GBIF names mapped (`RENAME`, a column already named so wins; identifier only when it holds URLs) and
    `file_name` derived from `url` when absent."""
    rename = {k: v for k, v in RENAME.items() if k in frame.columns and v not in frame.columns
              and (v != "url" or _urls(frame[k]))}
    frame = frame.rename(columns=rename)
    if frame.columns.duplicated().any():
        frame = frame.loc[:, ~frame.columns.duplicated()]
    if "file_name" not in frame.columns and "url" in frame.columns:
        urls = frame["url"]
        chunks = [pa.array([image_file_name(u) if isinstance(u, str) and u else None
                            for u in urls.iloc[start:start + CHUNK_ROWS].to_numpy(dtype=object)], pa.string())
                  for start in range(0, len(urls), CHUNK_ROWS)]  # chunked: no list of millions of str objects
        frame = frame.assign(file_name=text_series(chunks, frame.index))
    return frame


def text_series(chunks: list[pa.Array], index: pd.Index) -> pd.Series:
    """Text chunks as one column of the dtype the readers give text (pandas 3: Arrow-backed `str`)."""
    column = pa.chunked_array(chunks, pa.string()) if chunks else pa.chunked_array([], pa.string())
    return _to_pandas(pa.table({"_": column}))["_"].set_axis(index)


def _urls(column: pd.Series) -> bool:
    """True when every non-blank value is an http(s) URL (occurrence.txt's own dcterms identifier is not)."""
    values = column.dropna().astype(str)
    return bool(len(values)) and bool(values.str.match(r"https?://").all())


def image_file_name(url: str) -> str:
    """Where an image URL's file lives under an image root: `images/<h[:2]>/<h>.<suffix>`, h a hash of the URL and
    the suffix the URL's own when it is an image suffix (else .jpg). `fetch_images` writes exactly there."""
    digest = hashlib.sha256(url.encode("utf-8")).hexdigest()[:24]
    suffix = url_suffix(url).lower()
    return f"images/{digest[:2]}/{digest}{suffix if suffix in IMAGE_SUFFIXES else '.jpg'}"


_PLAIN_URL = re.compile(r"https?://[^/?#\[\]\x00-\x20\x7f]*(/[^?#\x00-\x20\x7f]*)?(?:[?#][^\x00-\x20\x7f]*)?")


def url_suffix(url: str) -> str:
    """`PurePosixPath(urlsplit(url).path).suffix`, computed by string operations for a plain http(s) URL (5x
    faster: millions of rows); any other URL goes through urlsplit itself."""
    match = _PLAIN_URL.fullmatch(url)
    name = (match.group(1) or "").rstrip("/").rpartition("/")[2] if match else ""
    if name in ("", ".", ".."):
        return PurePosixPath(urlsplit(url).path).suffix
    dot = name.rfind(".")
    return name[dot:] if 0 < dot < len(name) - 1 else ""


# -- taxon filters ---------------------------------------------------------------------------------------------

def _check_rules(rules: list[str], key: str) -> None:
    for rule in rules:
        rank, found, values = rule.partition("=")
        if not found or not rank.strip() or not [v for v in values.split(",") if v.strip()]:
            raise ConfigError(f"{key}: a rule is RANK=VALUE[,VALUE...] (e.g. family=Noctuidae), got {rule!r}")


def parse_rules(rules: list[str]) -> dict[str, set[str]]:
    """['family=Noctuidae,Erebidae', 'genus=X'] -> {'family': {'noctuidae', 'erebidae'}, 'genus': {'x'}}
    (casefolded)."""
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

    def rules(self) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
        """(include, exclude): column -> casefolded values, the preset's rules merged in."""
        include, exclude = parse_rules(self.include), parse_rules(self.exclude)
        if self.preset == "moths":
            include.setdefault("order", set()).add("lepidoptera")
            include.setdefault("taxonomicStatus", set()).add("accepted")
            include.setdefault("taxonRank", set()).add("species")
            exclude.setdefault("family", set()).update(f.casefold() for f in BUTTERFLY_FAMILIES)
        return include, exclude

    @property
    def columns(self) -> set[str]:
        """The columns the filter reads."""
        include, exclude = self.rules()
        return {*include, *exclude}

    def keep(self, frame: pd.DataFrame, source: str = "occurrence table") -> np.ndarray:
        """Boolean mask of the rows the filter keeps; a rank that is no column of the table is one TableError."""
        include, exclude = self.rules()
        missing = sorted({*include, *exclude} - set(frame.columns))
        if missing:
            raise TableError(f"{source}: the taxon filter needs column(s) {missing}, which the table lacks "
                             f"(columns: {', '.join(map(str, frame.columns[:30]))})", doc=self.DOC)
        keep = np.ones(len(frame), dtype=bool)
        for rank, values in include.items():
            keep &= _folded_in(frame[rank], values)
        for rank, values in exclude.items():
            keep &= ~_folded_in(frame[rank], values)
        return keep


def _folded_in(column: pd.Series, values: set[str]) -> np.ndarray:
    """True where the value, as trimmed casefolded text, is one of `values` (missing: False); each distinct value is
    folded once (millions of rows, a few thousand names)."""
    codes, uniques = pd.factorize(column, use_na_sentinel=True)
    folded = pd.Series(uniques).astype("string").str.strip().str.casefold()
    hit = np.append(folded.isin(values).fillna(False).to_numpy(bool), False)  # code -1 (missing) -> the last: False
    return hit[codes]


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
    """The rows the splits can use and the count of every row dropped, by reason, in this order: the taxon filter,
    no coordinates (blank lat or lon), a duplicate URL (the first row kept), no file name, a missing image file under
    `image_root` (when given). Each reason counts the rows the earlier ones left; the table is copied once, at the
    end. A file name that leads outside the image root (absolute, `..`, a symlink out of it) is one TableError."""
    dropped: Counter = Counter()
    alive = np.ones(len(frame), dtype=bool)

    def drop(mask: np.ndarray, reason: str) -> None:
        mask = mask & alive
        if mask.any():
            dropped[reason] += int(mask.sum())
            alive[mask] = False

    if taxa is not None and taxa.active:
        drop(~taxa.keep(frame, source), TAXON_FILTER)
    for column in ("lat", "lon"):
        if column not in frame.columns:
            raise TableError(f"{source}: no {column} column (nor GBIF's decimalLatitude / decimalLongitude)")
    rows = np.flatnonzero(alive)
    named = [c for c in ("gbifID", "file_name", "lat", "lon") if c in frame.columns]
    lat = np.full(len(frame), np.nan)
    lon = np.full(len(frame), np.nan)
    lat[rows], lon[rows] = coordinates(frame[named].iloc[rows], source)  # checked on the rows the filter keeps
    drop(np.isnan(lat) | np.isnan(lon), NO_COORDINATES)
    if "url" in frame.columns:
        rows = np.flatnonzero(alive)
        urls = frame["url"].iloc[rows]
        drop(_at(len(frame), rows, (urls.duplicated() & urls.notna()).to_numpy()), DUPLICATE_URL)
    if "file_name" in frame.columns:
        _drop_file_names(frame, named, alive, drop, source, image_root)
    keep = np.flatnonzero(alive)
    return frame.iloc[keep].assign(lat=lat[keep], lon=lon[keep]).reset_index(drop=True), dropped


def _drop_file_names(frame: pd.DataFrame, named: list[str], alive: np.ndarray, drop: Callable[[np.ndarray, str], None],
                     source: str, image_root: str | os.PathLike | None) -> None:
    """`clean`'s file-name steps: blank names dropped; a name leading outside the image root raises; with an image
    root, a name resolving outside it raises and a missing file is dropped."""
    drop(blank_names(frame["file_name"]), NO_FILE_NAME)
    rows = np.flatnonzero(alive)
    names = frame["file_name"].iloc[rows]
    leaving = leaving_names(names)
    if leaving.any():
        first = int(np.flatnonzero(leaving)[0])
        raise TableError(f"{source}: {row_name(frame[named].iloc[rows], first)}: file_name "
                         f"{names.iloc[first]!r} leads outside the image root (a relative path without '..' "
                         "is needed)")
    if image_root is not None:
        present, escape = files_under(image_root, names.tolist())
        if escape is not None:
            raise TableError(f"{source}: {row_name(frame[named].iloc[rows], escape)}: file_name "
                             f"{names.iloc[escape]!r} resolves outside the image root "
                             f"({real_target(image_root, names.iloc[escape])})")
        drop(_at(len(frame), rows, ~present), MISSING_FILE)


def _at(n: int, rows: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """A mask over `n` rows, True at `rows[mask]`."""
    out = np.zeros(n, dtype=bool)
    out[rows[mask]] = True
    return out
