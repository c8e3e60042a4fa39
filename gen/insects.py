"""Geographic open-set splits for species recognition (Open-Insects protocol) from occurrence metadata.

Input: an occurrence table (CSV or Parquet, one row per image: `species, genus, family, lat, lon, file_name`, optional
`split` for given ID splits and `taxon` to mark non-target rows) and the ID species of each region (`region, species`).
Per region it builds, with vectorised pandas/numpy (no loop over rows):

- species with fewer than `min_images` (5) images are dropped first (from every set).
- ID train/val/test: every image of the region's ID species; the table's `split` when given, else the AMI-GBIF
  proportions 70:10:20 per species (a species gets test images only with >= 1/0.2 = 5 images, val images only with
  >= 1/0.1 = 10, as the AMI-GBIF split tool does); then at most `id_val_cap` (10) val images a species (Open-Insects
  subsamples ID val so, except for C-America: `id_val_uncapped`). An ID species absent from the table (or dropped
  for too few images) is an error unless `allow_missing_id_species`.
- local OOD: species with an occurrence strictly inside the region's box padded by 1 degree latitude and 3 degrees
  longitude, minus the region's ID species; species with more than 30 images give 10% to val, the rest to test.
- non-local OOD (shared by all regions): species with an occurrence strictly inside the non-local box (continental
  Australia by default) minus every region's ID and local-OOD species; at most 30 test images a species, and a val
  set of 10% of that size drawn from their remaining images.
- non-target OOD (shared): rows whose `taxon` differs from `target_taxon`, or a separate table; 10% val, rest test.
- auxiliary train/val: every other target species minus the region's ID, local and non-local OOD species, without the
  genera found only in OOD ((local genera | non-local genera) - ID genera); a val sample as large as ID val, then
  `aux_species` (8,000; 4,000 for C-America) species drawn at random among those with >= `aux_per_species` (20)
  remaining images, `aux_per_species` images each (Open-Insects' 160,000 / 80,000 images at 20 a species);
  `aux_species=None` keeps every species with at most `aux_per_species` images each. Aux rows carry `aux_label`
  (index of their species among the aux-train species).

Every row carries `species, genus, family, hop, lat, lon`: hop 0 for ID rows, else 1 when its genus holds an ID species
of the region, 2 when only its family does, 3 otherwise. Boxes are (lat_min, lat_max, lon_min, lon_max), tested with
strict inequalities as in the official code (RolnickLab/Open-Insects). Taxon names and keys are compared as strings
whatever the column's dtype (a numeric GBIF key column with a blank reads as float: 1001.0 is the key "1001").

Manifests hold metadata only: `file_name` is the image path relative to the user's image root, which is recorded in
`manifest_info.json` (pipelines.data.MANIFEST_INFO) beside each region's `metadata.jsonl`; `load_region(folder)` returns the manifest rooted there.
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pandas as pd

from pipelines.data import MANIFEST_INFO, METADATA, Manifest, ManifestError, read_manifest, write_manifest
from pipelines.io import atomic_write_bytes, atomic_write_json, atomic_write_text
from pipelines.runtime import item_seed

OCCURRENCE_COLUMNS = ("species", "genus", "family", "lat", "lon", "file_name")
SETS = ("id_train", "id_val", "id_test", "local_test", "local_val", "non_local_test", "non_local_val",
        "non_target_test", "non_target_val", "aux_train", "aux_val")


@dataclass(frozen=True)
class Box:
    """A latitude/longitude box; `contains` is strict on every edge."""

    lat_min: float
    lat_max: float
    lon_min: float
    lon_max: float

    def __post_init__(self) -> None:
        if not (self.lat_min < self.lat_max and self.lon_min < self.lon_max):
            raise ValueError(f"box needs lat_min < lat_max and lon_min < lon_max, got {self}")

    def padded(self, lat: float, lon: float) -> "Box":
        return Box(self.lat_min - lat, self.lat_max + lat, self.lon_min - lon, self.lon_max + lon)

    def contains(self, lat: np.ndarray, lon: np.ndarray) -> np.ndarray:
        return (lat > self.lat_min) & (lat < self.lat_max) & (lon > self.lon_min) & (lon < self.lon_max)

    @classmethod
    def parse(cls, text: str) -> "Box":
        """`lat_min,lat_max,lon_min,lon_max`."""
        try:
            values = [float(v) for v in text.split(",")]
        except ValueError:
            values = []
        if len(values) != 4:
            raise ValueError(f"a box is 'lat_min,lat_max,lon_min,lon_max', got {text!r}")
        return cls(*values)


REGIONS = {
    "ne-america": Box(42, 63, -80, -57),
    "w-europe": Box(49, 61, -9, 16),
    "c-america": Box(7, 10, -83, -77),
}
AUSTRALIA = Box(-44, -10, 113, 154)


@dataclass
class SplitConfig:
    """Parameters of the split builder (defaults: Open-Insects)."""

    regions: dict[str, Box] = field(default_factory=lambda: dict(REGIONS))
    pad_lat: float = 1.0
    pad_lon: float = 3.0
    non_local_box: Box = AUSTRALIA
    min_images: int = 5  # species with fewer images are dropped (1 keeps every species)
    id_fractions: tuple[float, float, float] = (0.7, 0.1, 0.2)  # AMI-GBIF; (0.4, 0.1, 0.5) was this project's former default
    id_min_rule: bool = True  # test / val rows only for species with >= 1/fraction images (AMI-GBIF); False: always
    id_val_cap: int | None = 10  # Open-Insects; None keeps every val image
    id_val_uncapped: tuple[str, ...] = ("c-america",)  # regions whose ID val the reference code leaves uncapped
    allow_missing_id_species: bool = False
    id_cap: int | None = None
    local_val_fraction: float = 0.1
    local_val_min_images: int = 31
    local_cap: int | None = None
    non_local_cap: int = 30
    non_local_val_fraction: float = 0.1
    non_target_val_fraction: float = 0.1
    non_target_cap: int | None = None
    aux_per_species: int | None = 20
    aux_species: int | None = 8000  # None: every auxiliary species (at most aux_per_species images each)
    aux_species_by_region: dict[str, int | None] = field(default_factory=lambda: {"c-america": 4000})
    aux_val_size: int | None = None
    target_taxon: str | None = None
    non_target_name: str = "non_target"
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["regions"] = {k: asdict(v) for k, v in self.regions.items()}
        out["non_local_box"] = asdict(self.non_local_box)
        return out


# -- input ---------------------------------------------------------------------------------------------------
def read_table(path: str | os.PathLike) -> pd.DataFrame:
    """A CSV or Parquet table."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"table not found: {path}")
    if path.suffix.lower() in (".parquet", ".pq"):
        return pd.read_parquet(path)
    # taxon names / keys stay text (a numeric key column with a blank would read as float and lose digits)
    return pd.read_csv(path, low_memory=False, dtype={c: str for c in ("species", "genus", "family", "speciesKey")})


def check_occurrences(occ: pd.DataFrame, source: str = "occurrence table") -> pd.DataFrame:
    """Validate the columns and file names; taxonomy becomes categorical, coordinates float64."""
    missing = [c for c in OCCURRENCE_COLUMNS if c not in occ.columns]
    if missing:
        raise ValueError(f"{source}: missing column(s) {missing}; needs {list(OCCURRENCE_COLUMNS)}")
    dup = occ["file_name"].duplicated()
    if dup.any():
        raise ValueError(f"{source}: {int(dup.sum())} duplicate file_name value(s), e.g. {occ.loc[dup, 'file_name'].iloc[0]!r}")
    occ = occ.reset_index(drop=True).copy()
    for col in ("species", "genus", "family"):  # names compare as strings (numeric keys too)
        occ[col] = key_strings(occ[col])
    for col in ("lat", "lon"):
        occ[col] = pd.to_numeric(occ[col], errors="coerce").astype(np.float64)
    return occ


def read_id_species(path_or_frame: str | os.PathLike | pd.DataFrame) -> dict[str, list[str]]:
    """`region, species` rows -> {region: sorted species}."""
    frame = path_or_frame if isinstance(path_or_frame, pd.DataFrame) else read_table(path_or_frame)
    missing = [c for c in ("region", "species") if c not in frame.columns]
    if missing:
        raise ValueError(f"ID species table: missing column(s) {missing}; needs region, species")
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


# -- vectorised helpers ----------------------------------------------------------------------------------------
def _rng(seed: int, key: str) -> np.random.Generator:
    return np.random.default_rng(item_seed(seed, key))


def rank_in_group(codes: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A uniformly random rank of each row within its group (`codes` >= 0), and the group's size, in the input order."""
    n = len(codes)
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    key = (codes.astype(np.int64) << 32) | rng.integers(0, 1 << 32, size=n, dtype=np.int64)  # group, then random
    order = np.argsort(key)
    sorted_codes = codes[order]
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_codes)) + 1]
    sizes = np.diff(np.r_[starts, n])
    group_of_sorted = np.repeat(np.arange(len(starts)), sizes)
    rank = np.empty(n, dtype=np.int64)
    size = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n) - starts[group_of_sorted]
    size[order] = sizes[group_of_sorted]
    return rank, size


def _round_half_up(x: np.ndarray) -> np.ndarray:
    return np.floor(np.asarray(x, dtype=np.float64) + 0.5).astype(np.int64)


def _sample(index: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """`k` distinct entries of `index` (all when k >= len), in increasing order."""
    k = min(int(k), len(index))
    return np.sort(rng.choice(index, size=k, replace=False)) if k else index[:0]


def _flag(size: int, codes: np.ndarray) -> np.ndarray:
    """Boolean array over `size` categories, True at `codes` (negative codes ignored)."""
    out = np.zeros(size, dtype=bool)
    out[codes[codes >= 0]] = True
    return out


@dataclass
class _Taxonomy:
    """The table as integer codes: rows -> species / genus / family codes; species -> genus / family code."""

    species: pd.Index
    row_species: np.ndarray
    row_genus: np.ndarray
    row_family: np.ndarray
    species_genus: np.ndarray
    species_family: np.ndarray
    n_genera: int
    n_families: int

    @classmethod
    def of(cls, occ: pd.DataFrame, target: np.ndarray) -> "_Taxonomy":
        codes = {c: occ[c].cat.codes.to_numpy(np.int64) for c in ("species", "genus", "family")}
        n_species = len(occ["species"].cat.categories)
        species_genus = np.full(n_species, -1, dtype=np.int64)
        species_family = np.full(n_species, -1, dtype=np.int64)
        ok = target & (codes["species"] >= 0)
        species_genus[codes["species"][ok]] = codes["genus"][ok]
        species_family[codes["species"][ok]] = codes["family"][ok]
        return cls(occ["species"].cat.categories, codes["species"], codes["genus"], codes["family"], species_genus,
                   species_family, len(occ["genus"].cat.categories), len(occ["family"].cat.categories))

    def species_flags(self, names: Iterable[str]) -> np.ndarray:
        index = self.species.get_indexer(list(names))
        return _flag(len(self.species), index)

    def genus_flags(self, species: np.ndarray) -> np.ndarray:
        return _flag(self.n_genera, self.species_genus[species])

    def family_flags(self, species: np.ndarray) -> np.ndarray:
        return _flag(self.n_families, self.species_family[species])


# -- the builder -------------------------------------------------------------------------------------------------
@dataclass
class Splits:
    """Per region, a frame of the selected occurrence rows (file_name, species, genus, family, lat, lon) with `set`,
    `label`, `hop`, `aux_label`; plus the species requested as ID but absent from the table."""

    regions: dict[str, pd.DataFrame]
    missing_id_species: dict[str, list[str]]
    config: SplitConfig


def build_splits(occurrences: pd.DataFrame, id_species: dict[str, list[str]], config: SplitConfig | None = None,
                 non_target: pd.DataFrame | None = None) -> Splits:
    """Build every region's split frame (see the module docstring). Species-level decisions are boolean arrays over
    species codes and rows pick them up by fancy indexing, so the cost is a few linear passes over the table."""
    config = config or SplitConfig()
    unknown = sorted(set(id_species) - set(config.regions))
    if unknown:
        raise ValueError(f"ID species given for region(s) {unknown} without a box; known: {sorted(config.regions)} "
                         "(add boxes with SplitConfig.regions / --box NAME=lat_min,lat_max,lon_min,lon_max)")
    occ, target = _with_non_target(occurrences, non_target, config)
    tax = _Taxonomy.of(occ, target)
    lat, lon = occ["lat"].to_numpy(), occ["lon"].to_numpy()
    valid = target & (tax.row_species >= 0)
    n_species = len(tax.species)
    images = np.bincount(tax.row_species[valid], minlength=n_species)
    valid &= images[np.maximum(tax.row_species, 0)] >= config.min_images  # species with too few images are dropped
    present = _flag(n_species, tax.row_species[valid])

    is_id = {r: tax.species_flags(names) & present for r, names in id_species.items()}
    missing = {r: sorted(set(names) - set(tax.species[is_id[r]])) for r, names in id_species.items()}
    _check_missing(missing, tax, images, config)
    local = {}
    for region in id_species:
        in_box = valid & config.regions[region].padded(config.pad_lat, config.pad_lon).contains(lat, lon)
        local[region] = _flag(n_species, tax.row_species[in_box]) & ~is_id[region]
    excluded = np.logical_or.reduce([*is_id.values(), *local.values()]) if id_species else np.zeros(n_species, bool)
    in_non_local_box = valid & config.non_local_box.contains(lat, lon)
    non_local = _flag(n_species, tax.row_species[in_non_local_box]) & ~excluded

    row_sp = np.where(valid, tax.row_species, 0)  # species code per row (0 where invalid; masked by `valid` below)
    given = _given_id_split(occ, valid & np.logical_or.reduce([is_id[r][row_sp] for r in id_species])) if id_species else None
    shared = _non_local_sets(row_sp, valid & non_local[row_sp], config) + _non_target_sets(~target, config)
    out = {}
    for region in sorted(id_species):
        picks = _id_sets(row_sp, valid & is_id[region][row_sp], config, region, given)
        picks += _local_sets(row_sp, valid & local[region][row_sp], config, region) + shared
        id_genera = tax.genus_flags(np.flatnonzero(is_id[region]))
        drop = tax.genus_flags(np.flatnonzero(local[region] | non_local)) & ~id_genera
        genus_ok = (tax.species_genus < 0) | ~drop[np.maximum(tax.species_genus, 0)]
        aux_species = present & ~is_id[region] & ~local[region] & ~non_local & genus_ok
        n_id_val = int(sum(len(index) for name, index in picks if name == "id_val"))
        picks += _aux_sets(row_sp, valid & aux_species[row_sp], config, region, n_id_val)
        out[region] = _region_frame(occ, tax, picks, _ranks(tax.species, is_id[region]), id_genera,
                                    tax.family_flags(np.flatnonzero(is_id[region])))
    return Splits(out, missing, config)


def _with_non_target(occurrences: pd.DataFrame, non_target: pd.DataFrame | None, config: SplitConfig) -> tuple[pd.DataFrame, np.ndarray]:
    """The checked table (with the separate non-target table appended) and the mask of target rows."""
    occ = occurrences
    if non_target is not None:
        if "file_name" not in non_target.columns:
            raise ValueError("non-target table: needs a file_name column")
        extra = non_target.copy()
        for col in OCCURRENCE_COLUMNS:
            if col not in extra.columns:
                extra[col] = np.nan
        extra["_non_target"] = True
        occ = pd.concat([occ.assign(_non_target=False), extra], ignore_index=True)
        for col in ("species", "genus", "family"):
            occ[col] = occ[col].astype(object)
    occ = check_occurrences(occ)
    target = np.ones(len(occ), dtype=bool)
    if "taxon" in occ.columns:
        taxa = occ["taxon"].dropna().unique().tolist()
        if config.target_taxon is None and len(taxa) > 1:
            raise ValueError(f"the occurrence table's 'taxon' column holds {sorted(map(str, taxa))[:10]}: set target_taxon "
                             "(--target-taxon) to say which one is the target; the others become non-target OOD")
        if config.target_taxon is not None:
            target = (occ["taxon"].astype(object) == config.target_taxon).to_numpy() | occ["taxon"].isna().to_numpy()
    if "_non_target" in occ.columns:
        target &= ~occ["_non_target"].to_numpy(dtype=bool)
    return occ, target


Picks = list[tuple[str, np.ndarray]]  # (set name, row positions)


def _check_missing(missing: dict[str, list[str]], tax: "_Taxonomy", images: np.ndarray, config: SplitConfig) -> None:
    """An ID species absent from the table (or with fewer than min_images images) is an error unless allowed."""
    if config.allow_missing_id_species or not any(missing.values()):
        return
    lines = []
    for region, names in missing.items():
        if names:
            index = tax.species.get_indexer(names)
            few = [f"{n} ({images[i]} images)" for n, i in zip(names, index) if i >= 0]
            absent = [n for n, i in zip(names, index) if i < 0]
            parts = ([f"absent from the occurrence table: {absent[:10]}"] if absent else []) + \
                    ([f"fewer than min_images={config.min_images} images: {few[:10]}"] if few else [])
            lines.append(f"{region}: {len(names)} ID species " + "; ".join(parts))
    raise ValueError("ID species missing from the splits (an ID species must not silently become OOD):\n  "
                     + "\n  ".join(lines) + "\ncheck that the species columns of both tables hold the same names/keys, "
                     "or set allow_missing_id_species (--allow-missing-id-species)")


def _given_id_split(occ: pd.DataFrame, id_rows: np.ndarray) -> np.ndarray | None:
    """The table's `split` column when it gives train/val/test for every ID row, else None (split 4:1:5)."""
    if "split" not in occ.columns or occ["split"].isna().to_numpy()[id_rows].any():
        return None
    split = occ["split"].astype(str).to_numpy()
    bad = id_rows & ~np.isin(split, ("train", "val", "test"))
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise ValueError(f"occurrence table: ID row {occ['file_name'].iloc[first]!r} has split {split[first]!r}; "
                         "expected train, val or test")
    return split


def _ranks(names: pd.Index, chosen: np.ndarray) -> np.ndarray:
    """Per category: its position among the chosen categories sorted by name, -1 when not chosen."""
    out = np.full(len(names), -1, dtype=np.int64)
    picked = np.flatnonzero(chosen)
    out[picked[np.argsort(np.asarray(names[picked], dtype=str), kind="stable")]] = np.arange(len(picked))
    return out


def _id_sets(row_sp: np.ndarray, mask: np.ndarray, config: SplitConfig, region: str, given: np.ndarray | None) -> Picks:
    rows = np.flatnonzero(mask)
    rank, size = rank_in_group(row_sp[rows], _rng(config.seed, f"{region}:id"))
    if config.id_cap is not None:
        keep = rank < config.id_cap
        rows, rank, size = rows[keep], rank[keep], np.minimum(size[keep], config.id_cap)
    if given is not None:
        sets = [(f"id_{name}", rows[given[rows] == name]) for name in ("train", "val", "test")]
        val = sets[1][1]
        val_rank, _ = rank_in_group(row_sp[val], _rng(config.seed, f"{region}:id_val"))
        sets[1] = ("id_val", val[val_rank < _val_cap(config, region)])
        return sets
    n_train, n_val = id_counts(size, config.id_fractions, config.id_min_rule)
    val = (rank >= n_train) & (rank < n_train + np.minimum(n_val, _val_cap(config, region)))
    return [("id_train", rows[rank < n_train]), ("id_val", rows[val]), ("id_test", rows[rank >= n_train + n_val])]


def id_counts(size: np.ndarray, fractions: tuple[float, float, float], min_rule: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(train, val) images of species with `size` images (the rest is test): test = round(size * f_test) and val =
    round(size * f_val), half up; with `min_rule` a species gets test (val) images only when it has at least
    ceil(1 / f_test) (ceil(1 / f_val)) images, as the AMI-GBIF split tool; at least one train image."""
    _, f_val, f_test = fractions
    size = np.asarray(size, dtype=np.int64)
    n_test = _round_half_up(size * f_test)
    n_val = _round_half_up(size * f_val)
    if min_rule:
        n_test = np.where(size >= _min_size(f_test), n_test, 0)
        n_val = np.where(size >= _min_size(f_val), n_val, 0)
    n_test = np.minimum(n_test, np.maximum(size - 1, 0))
    n_val = np.minimum(n_val, np.maximum(size - 1 - n_test, 0))
    return size - n_test - n_val, n_val


def _min_size(fraction: float) -> float:
    return math.ceil(round(1 / fraction, 9)) if fraction > 0 else np.inf


def _val_cap(config: SplitConfig, region: str) -> float:
    return np.inf if config.id_val_cap is None or region in config.id_val_uncapped else config.id_val_cap


def _local_sets(row_sp: np.ndarray, mask: np.ndarray, config: SplitConfig, region: str) -> Picks:
    rows = np.flatnonzero(mask)
    rank, size = rank_in_group(row_sp[rows], _rng(config.seed, f"{region}:local"))
    if config.local_cap is not None:
        keep = rank < config.local_cap
        rows, rank, size = rows[keep], rank[keep], np.minimum(size[keep], config.local_cap)
    n_test = np.where(size >= config.local_val_min_images, _round_half_up(size * (1 - config.local_val_fraction)), size)
    return [("local_test", rows[rank < n_test]), ("local_val", rows[rank >= n_test])]


def _non_local_sets(row_sp: np.ndarray, mask: np.ndarray, config: SplitConfig) -> Picks:
    rows = np.flatnonzero(mask)
    rng = _rng(config.seed, "non_local")
    rank, _ = rank_in_group(row_sp[rows], rng)
    test = rows[rank < config.non_local_cap]
    val = _sample(rows[rank >= config.non_local_cap], int(len(test) * config.non_local_val_fraction), rng)
    return [("non_local_test", test), ("non_local_val", val)]


def _non_target_sets(mask: np.ndarray, config: SplitConfig) -> Picks:
    """A random `non_target_val_fraction` to val, the rest to test; `non_target_cap` caps test (and val in proportion)."""
    rows = _rng(config.seed, "non_target").permutation(np.flatnonzero(mask))
    n_val = int(len(rows) * config.non_target_val_fraction)
    val, test = rows[:n_val], rows[n_val:]
    if config.non_target_cap is not None:
        val, test = val[: int(config.non_target_cap * config.non_target_val_fraction)], test[: config.non_target_cap]
    return [("non_target_test", np.sort(test)), ("non_target_val", np.sort(val))]


def _aux_sets(row_sp: np.ndarray, mask: np.ndarray, config: SplitConfig, region: str, n_id_val: int) -> Picks:
    rows = np.flatnonzero(mask)
    rng = _rng(config.seed, f"{region}:aux")
    val = _sample(rows, n_id_val if config.aux_val_size is None else config.aux_val_size, rng)
    train = np.setdiff1d(rows, val, assume_unique=True)
    n_species = config.aux_species_by_region.get(region, config.aux_species)
    if config.aux_per_species is not None:
        rank, size = rank_in_group(row_sp[train], rng)
        if n_species is not None:  # n_species species with >= aux_per_species images, aux_per_species each
            eligible = np.unique(row_sp[train][size >= config.aux_per_species])
            chosen = _sample(eligible, n_species, rng)
            keep = np.isin(row_sp[train], chosen) & (rank < config.aux_per_species)
        else:
            keep = rank < config.aux_per_species
        train = train[keep]
    return [("aux_train", train), ("aux_val", val)]


def _region_frame(occ: pd.DataFrame, tax: _Taxonomy, picks: Picks, id_rank: np.ndarray, id_genera: np.ndarray,
                  id_families: np.ndarray) -> pd.DataFrame:
    """The picked rows with set, label (ID class = rank of the species name among the ID species), hop, aux_label
    (rank of the species name among the aux-train species)."""
    rows = np.concatenate([index for _, index in picks])
    sets = np.concatenate([np.full(len(index), SETS.index(name), dtype=np.int8) for name, index in picks])
    sp, genus, family = tax.row_species[rows], tax.row_genus[rows], tax.row_family[rows]
    is_id_row = sets <= SETS.index("id_test")
    hop = np.where(genus >= 0, id_genera[np.maximum(genus, 0)] & (genus >= 0), False)
    fam = np.where(family >= 0, id_families[np.maximum(family, 0)] & (family >= 0), False)
    hop = np.where(is_id_row, 0, np.where(hop, 1, np.where(fam, 2, 3)))
    aux_rank = _ranks(tax.species, _flag(len(tax.species), sp[sets == SETS.index("aux_train")]))
    aux_label = np.where((sets >= SETS.index("aux_train")) & (sp >= 0), aux_rank[np.maximum(sp, 0)], -1)
    frame = occ.iloc[rows][list(OCCURRENCE_COLUMNS)].reset_index(drop=True)
    frame["set"] = pd.Categorical.from_codes(sets, categories=SETS)
    frame["label"] = np.where(is_id_row, id_rank[np.maximum(sp, 0)], -1).astype(np.int64)
    frame["hop"] = hop.astype(np.int64)
    frame["aux_label"] = aux_label.astype(np.int64)
    return frame


# -- manifests, summary ----------------------------------------------------------------------------------------
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
    None when the vectorised schema checks cannot vouch for every row (write_manifest then names the bad line)."""
    from json.encoder import encode_basestring_ascii

    from pipelines.data import GROUPS, ROLES, SPLITS
    from pipelines.jsonl import column_texts, join_lines

    table = manifest_table(frame, non_target_name)
    names, ood_set = table["file_name"], table["ood_set"]
    is_id = (table["role"] == "id").to_numpy()
    ood_names = ood_set[~is_id]
    coordinates = table[["lat", "lon"]].to_numpy(dtype=np.float64)
    if not (table["split"].isin(SPLITS).all() and table["role"].isin(ROLES).all()
            and (table["group"].isna() | table["group"].isin(GROUPS)).all()
            and not names.duplicated().any() and (names.str.len() > 0).all()
            and not names.str.contains(r"^/|\\|(?:^|/)\.\.(?:/|$)", regex=True).any()
            and (ood_set[is_id].isna().all()) and (table["label"][is_id] >= 0).all()
            and (ood_names.empty or (pd.api.types.infer_dtype(ood_names, skipna=False) == "string"
                                     and (ood_names.str.len() > 0).all()))
            and (table["label"][~is_id] == -1).all()
            and not np.isinf(coordinates).any()):
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


# -- synthetic data --------------------------------------------------------------------------------------------
def synthetic_occurrences(n_rows: int, *, n_species: int | None = None, seed: int = 0,
                          non_target_share: float = 0.02, id_min_images: int = 5) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A synthetic occurrence table and ID species table with a realistic shape (vectorised; 3M rows in seconds).

    Species belong to genera of 1-8 species and families of about 10 genera; each species lives around a home point
    (a third in one of the built-in regions, a tenth in Australia, the rest anywhere), with long-tailed image counts.
    About `non_target_share` of the other species are another taxon (`taxon` = "other"; the target is "moth"). Each region's ID
    species are half of the species living in it with at least `id_min_images` images (the recipe drops smaller ones).
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


def make_splits(occurrences: str | os.PathLike | pd.DataFrame, id_species: str | os.PathLike | pd.DataFrame,
                out_dir: str | os.PathLike, image_root: str | os.PathLike, config: SplitConfig | None = None,
                non_target: str | os.PathLike | pd.DataFrame | None = None) -> tuple[dict[str, Path], pd.DataFrame]:
    """Read the tables (paths or frames), build the splits, write the manifests; returns (folders, summary table)."""
    occ = occurrences if isinstance(occurrences, pd.DataFrame) else read_table(occurrences)
    extra = non_target if non_target is None or isinstance(non_target, pd.DataFrame) else read_table(non_target)
    splits = build_splits(occ, read_id_species(id_species), config, non_target=extra)
    return write_splits(splits, out_dir, image_root), summarize(splits)
