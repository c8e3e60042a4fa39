"""The input of the species splits: occurrence tables (GBIF archives, CSV / TSV / Parquet: pipelines.curation.gbif), the
ID species of each region, taxon names compared as strings, region boxes, and a synthetic occurrence table of realistic
shape."""
from __future__ import annotations

import dataclasses
import os
import re
from typing import Any

import numpy as np
import pandas as pd

from pipelines.curation.gbif import TableError, read_table, row_name
from pipelines.curation.paths import blank_names, leaving_names
from pipelines.errors import ConfigError
from pipelines.params import REQUIRED, Config, param

OCCURRENCE_COLUMNS = ("species", "genus", "family", "lat", "lon", "file_name")
GBIF_ID_COLUMNS = ("gbifID", "speciesKey", "genusKey", "familyKey", "url")
"""Kept on every manifest row when the occurrence table has them (GBIF downloads do)."""


@dataclasses.dataclass(frozen=True)
class Box(Config):
    """A latitude/longitude box; `contains` is strict on every edge. A config value may be a mapping, a list of four
    numbers or the text `lat_min,lat_max,lon_min,lon_max`."""

    lat_min: float = param(REQUIRED, "southern edge (degrees)")
    lat_max: float = param(REQUIRED, "northern edge (degrees)")
    lon_min: float = param(REQUIRED, "western edge (degrees)")
    lon_max: float = param(REQUIRED, "eastern edge (degrees)")

    def check(self, dims: dict[str, int] | None = None) -> None:
        super().check(dims)
        if not (self.lat_min < self.lat_max and self.lon_min < self.lon_max):
            raise TableError(f"a box needs lat_min < lat_max and lon_min < lon_max, got "
                             f"{self.lat_min},{self.lat_max},{self.lon_min},{self.lon_max}")

    @classmethod
    def from_value(cls, value: Any, where: str) -> Box:
        if isinstance(value, str):
            try:
                return cls.parse(value)
            except TableError as err:
                raise ConfigError(f"{where}: {err}") from None
        if isinstance(value, (list, tuple)):
            return cls.from_dict(dict(zip(("lat_min", "lat_max", "lon_min", "lon_max"), value)), where) \
                if len(value) == 4 else cls.from_value(",".join(map(str, value)), where)
        return super().from_value(value, where)

    def padded(self, lat: float, lon: float) -> Box:
        return Box(self.lat_min - lat, self.lat_max + lat, self.lon_min - lon, self.lon_max + lon)

    def contains(self, lat: np.ndarray, lon: np.ndarray) -> np.ndarray:
        return (lat > self.lat_min) & (lat < self.lat_max) & (lon > self.lon_min) & (lon < self.lon_max)

    @classmethod
    def parse(cls, text: str) -> Box:
        """`lat_min,lat_max,lon_min,lon_max`."""
        try:
            values = [float(v) for v in text.split(",")]
        except ValueError:
            values = []
        if len(values) != 4:
            raise TableError(f"a box is 'lat_min,lat_max,lon_min,lon_max', got {text!r}")
        return cls(*values)


REGIONS = {
    "ne-america": Box(42, 63, -80, -57),
    "w-europe": Box(49, 61, -9, 16),
    "c-america": Box(7, 10, -83, -77),
}
AUSTRALIA = Box(-44, -10, 113, 154)


SPLIT_COLUMNS = (*OCCURRENCE_COLUMNS, *GBIF_ID_COLUMNS, "split", "taxon", "_non_target")
"""The columns the split builder reads (the others are left behind when the table is checked)."""


def check_occurrences(occ: pd.DataFrame, source: str = "occurrence table") -> pd.DataFrame:
    """Validate the columns and file names (each a relative path inside the image root, no blank, no repeat); the
    columns the builder reads (`SPLIT_COLUMNS`), taxonomy categorical, coordinates float64."""
    missing = [c for c in OCCURRENCE_COLUMNS if c not in occ.columns]
    if missing:
        raise TableError(f"{source}: missing column(s) {missing}; needs {list(OCCURRENCE_COLUMNS)}")
    names = occ["file_name"]
    for bad, what in ((blank_names(names), "a blank file_name"),
                      (leaving_names(names), "a file_name that leads outside the image root (a relative path "
                                             "without '..' is needed)")):
        if bad.any():
            first = int(np.flatnonzero(bad)[0])
            raise TableError(f"{source}: {row_name(occ, first)}: {what}, got {names.iloc[first]!r}")
    dup = names.duplicated()
    if dup.any():
        raise TableError(f"{source}: {int(dup.sum())} duplicate file_name value(s), e.g. "
                         f"{occ.loc[dup, 'file_name'].iloc[0]!r}")
    occ = occ[[c for c in SPLIT_COLUMNS if c in occ.columns]].reset_index(drop=True)
    for col in ("species", "genus", "family"):  # names compare as strings (numeric keys too)
        occ[col] = key_strings(occ[col])
    for col in ("lat", "lon"):
        occ[col] = pd.to_numeric(occ[col], errors="coerce").astype(np.float64)
    for col in GBIF_ID_COLUMNS[:-1]:  # keys as text ("1001", never 1001.0)
        if col in occ.columns and not _plain_keys(occ[col]):
            occ[col] = pd.Series(np.asarray(key_strings(occ[col]), dtype=object),
                                 index=occ.index).where(occ[col].notna())
    return occ


def _plain_keys(column: pd.Series) -> bool:
    """True for a pandas text column none of whose values is a float-rendered key (`key_strings` would keep it as it
    is: a GBIF archive's ids, millions of distinct values, stay Arrow text instead of becoming Python objects)."""
    return (isinstance(column.dtype, pd.StringDtype)
            and not bool(column.str.match(_FLOAT_KEY.pattern).fillna(False).any()))


def read_id_species(path_or_frame: str | os.PathLike | pd.DataFrame) -> dict[str, list[str]]:
    """`region, species` rows -> {region: sorted species}."""
    frame = path_or_frame if isinstance(path_or_frame, pd.DataFrame) else read_table(path_or_frame)
    missing = [c for c in ("region", "species") if c not in frame.columns]
    if missing:
        raise TableError(f"ID species table: missing column(s) {missing}; needs region, species")
    frame = frame.dropna(subset=["region", "species"])
    species = pd.Series(np.asarray(key_strings(frame["species"])), index=frame.index)
    return {str(region): sorted(set(species[group.index])) for region, group in frame.groupby("region", sort=True)}


_FLOAT_KEY = re.compile(r"^(-?\d+)\.0+$")


def _key_name(value: Any) -> str:
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return str(int(value))
    text = str(value)
    match = _FLOAT_KEY.match(text)  # "1001.0": a float-rendered integer key (e.g. a CSV written from a float column)
    return match.group(1) if match else text


def key_strings(values: Any) -> pd.Categorical:
    """Taxon names / keys as a categorical of strings, whatever the column's dtype: integral floats and their text
    form lose their ".0" (a numeric key column with one blank is read as float, 1001 -> 1001.0, and must still match
    "1001"); missing values stay missing."""
    cat = pd.Categorical(values)
    names = np.array([_key_name(v) for v in cat.categories], dtype=object).astype(str)
    unique, inverse = np.unique(names, return_inverse=True)
    codes = np.where(cat.codes >= 0, inverse[np.maximum(cat.codes, 0)] if len(inverse) else -1, -1)
    return pd.Categorical.from_codes(codes.astype(np.int64), categories=unique)


def synthetic_occurrences(n_rows: int, *, n_species: int | None = None, seed: int = 0,
                          non_target_share: float = 0.02, id_min_images: int = 5) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A synthetic occurrence table and ID species table with a realistic shape (vectorised; 3M rows in seconds).

    Species belong to genera of 1-8 species and families of about 10 genera; each species lives around a home point
    (a third in one of the built-in regions, a tenth in Australia, the rest anywhere), with long-tailed image counts.
    About `non_target_share` of the other species are another taxon (`taxon` = "other"; the target is "moth"). Each
    region's ID species are half of the species living in it with at least `id_min_images` images (the recipe drops
    smaller ones).
    """
    rng = np.random.default_rng(seed)
    n_species = n_species or max(20, n_rows // 150)
    genus_of = np.cumsum(rng.random(n_species) < 0.3)
    family_of = genus_of // 10
    homes = np.column_stack([rng.uniform(-60, 70, n_species), rng.uniform(-180, 180, n_species)])
    boxes = [*REGIONS.values(), AUSTRALIA]
    where = rng.choice(len(boxes) + 1, size=n_species, p=[0.11, 0.11, 0.11, 0.1, 0.57])
    for b, box in enumerate(boxes):
        pick = where == b
        homes[pick, 0] = rng.uniform(box.lat_min + 0.5, box.lat_max - 0.5, pick.sum())
        homes[pick, 1] = rng.uniform(box.lon_min + 0.5, box.lon_max - 0.5, pick.sum())
    weights = rng.pareto(1.2, n_species) + 1
    species = rng.choice(n_species, size=n_rows, p=weights / weights.sum())
    lat = np.clip(homes[species, 0] + rng.normal(0, 1.5, n_rows), -89.9, 89.9)
    lon = (homes[species, 1] + rng.normal(0, 2.5, n_rows) + 180) % 360 - 180
    other = rng.random(n_species) < non_target_share
    other[where < len(boxes)] = False  # species living in a region or in Australia are all targets
    taxon = np.where(other[species], "other", "moth")
    occ = pd.DataFrame({
        "species": pd.Categorical.from_codes(species, [f"sp{i:06d}" for i in range(n_species)]),
        "genus": pd.Categorical.from_codes(genus_of[species], [f"gen{i:05d}" for i in range(genus_of.max() + 1)]),
        "family": pd.Categorical.from_codes(family_of[species], [f"fam{i:04d}" for i in range(family_of.max() + 1)]),
        "lat": lat, "lon": lon, "taxon": taxon,
    })
    index = pd.Series(np.arange(n_rows))
    occ["file_name"] = "images/" + (index // 1000).astype(str) + "/" + index.astype(str) + ".jpg"
    ids = []
    counts = np.bincount(species, minlength=n_species)
    for b, name in enumerate(REGIONS):
        living = np.flatnonzero((where == b) & (counts >= id_min_images))
        chosen = living[rng.random(len(living)) < 0.5]
        ids.append(pd.DataFrame({"region": name, "species": [f"sp{i:06d}" for i in chosen]}))
    return occ, pd.concat(ids, ignore_index=True)

