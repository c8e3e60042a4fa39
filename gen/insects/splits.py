"""The split builder: species-level decisions as boolean arrays over species codes, picked up by the rows through
fancy indexing (a few linear passes over the table, no loop over rows). See gen.insects for the protocol."""
from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from gen.insects.occurrences import (
    AUSTRALIA,
    GBIF_ID_COLUMNS,
    OCCURRENCE_COLUMNS,
    REGIONS,
    Box,
    TableError,
    check_occurrences,
)
from pipelines.curation.gbif import BLANK_SPECIES
from pipelines.errors import ConfigError
from pipelines.params import Config, config, param
from pipelines.runtime import item_seed

MIN_IMAGES = "< min images"  # a drop reason beside pipelines.curation.gbif's
SETS = ("id_train", "id_val", "id_test", "local_test", "local_val", "non_local_test", "non_local_val",
        "non_target_test", "non_target_val", "aux_train", "aux_val")


def _check_fractions(fractions: list[float], key: str) -> None:
    if len(fractions) != 3 or not all(0 <= f <= 1 for f in fractions) or abs(sum(fractions) - 1) > 1e-6:
        raise ConfigError(f"{key}: three fractions TRAIN VAL TEST in [0, 1] summing to 1, got "
                          f"{' '.join(f'{f:g}' for f in fractions)} (sum {sum(fractions):g})")


def check_region_names(regions: dict[str, Box], key: str) -> None:
    """A region names the folder its manifest is written to (OUT/<region>): a plain name, never a path."""
    for name in regions:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", str(name)) or ".." in str(name):
            raise ConfigError(f"{key}: region name {str(name)!r} must be letters, digits, '-', '_' or '.' (it names "
                              "the region's folder under --out)")


def _check_counts(counts: dict[str, int | None], key: str) -> None:
    for region, count in counts.items():
        if count is not None and count < 1:
            raise ConfigError(f"{key}.{region}: must be >= 1 or null (every species), got {count}")


@config
class SplitConfig(Config):
    """Parameters of the split builder (defaults: Open-Insects); `SplitConfig.from_dict` checks every one."""

    DOC = "docs/species.md"

    regions: dict[str, Box] = param(dict(REGIONS), "region name -> box (lat_min, lat_max, lon_min, lon_max)",
                                    check=check_region_names)
    pad_lat: float = param(1.0, "local OOD box padding, degrees latitude", ge=0)
    pad_lon: float = param(3.0, "local OOD box padding, degrees longitude", ge=0)
    non_local_box: Box = param(AUSTRALIA, "box of the non-local OOD species (continental Australia)")
    min_images: int = param(5, "species with fewer images are dropped (1 keeps every species)", ge=1)
    id_fractions: tuple[float, float, float] = param(
        (0.7, 0.1, 0.2), "ID train / val / test share per species (AMI-GBIF; (0.4, 0.1, 0.5) was this project's "
        "former default)", check=_check_fractions)
    id_min_rule: bool = param(True, "test / val rows only for species with >= 1/fraction images (AMI-GBIF)")
    id_val_cap: int | None = param(10, "ID val images a species at most (Open-Insects); None keeps every one", ge=1)
    id_val_uncapped: tuple[str, ...] = param(("c-america",), "regions whose ID val the reference code leaves uncapped")
    allow_missing_id_species: bool = param(False, "an ID species absent from the table is a shortfall, not an error")
    id_cap: int | None = param(None, "images an ID species at most", ge=1)
    local_val_fraction: float = param(0.1, "local OOD share given to val", ge=0, le=1)
    local_val_min_images: int = param(31, "local OOD species give val images only with at least this many", ge=1)
    local_cap: int | None = param(None, "images a local OOD species at most", ge=1)
    non_local_cap: int = param(30, "non-local OOD test images a species at most", ge=1)
    non_local_val_fraction: float = param(0.1, "non-local val size as a share of its test size", ge=0, le=1)
    non_target_val_fraction: float = param(0.1, "non-target OOD share given to val", ge=0, le=1)
    non_target_cap: int | None = param(None, "non-target test images at most", ge=1)
    aux_per_species: int | None = param(20, "auxiliary train images a species (None: no cap)", ge=1)
    aux_species: int | None = param(8000, "auxiliary species drawn (None: every auxiliary species)", ge=1)
    aux_species_by_region: dict[str, int | None] = param({"c-america": 4000}, "aux_species per region",
                                                         check=_check_counts)
    aux_val_size: int | None = param(None, "auxiliary val images (None: as many as ID val)", ge=0)
    target_taxon: str | None = param(None, "value of the `taxon` column that is the target (others: non-target OOD)")
    non_target_name: str = param("non_target", "ood_set name of the non-target rows")
    seed: int = param(0, "every random choice is seeded from it and the region / set name", ge=0)


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
    def of(cls, occ: pd.DataFrame, target: np.ndarray) -> _Taxonomy:
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


@dataclass
class Splits:
    """Per region, a frame of the selected occurrence rows (file_name, species, genus, family, lat, lon) with `set`,
    `label`, `hop`, `aux_label`; the species requested as ID but absent from the table; the rows dropped by reason
    (`dropped`) and every request the data fell short of (`shortfalls`: region, what, requested, found)."""

    regions: dict[str, pd.DataFrame]
    missing_id_species: dict[str, list[str]]
    config: SplitConfig
    dropped: dict[str, int] = field(default_factory=dict)
    shortfalls: list[dict[str, Any]] = field(default_factory=list)


def build_splits(occurrences: pd.DataFrame, id_species: dict[str, list[str]], config: SplitConfig | None = None,
                 non_target: pd.DataFrame | None = None) -> Splits:
    """Build every region's split frame (see the module docstring). Species-level decisions are boolean arrays over
    species codes and rows pick them up by fancy indexing, so the cost is a few linear passes over the table."""
    config = config or SplitConfig()
    unknown = sorted(set(id_species) - set(config.regions))
    if unknown:
        raise TableError(f"ID species given for region(s) {unknown} without a box; known: {sorted(config.regions)} "
                         "(add boxes with SplitConfig.regions / --box NAME=lat_min,lat_max,lon_min,lon_max)")
    occ, target = _with_non_target(occurrences, non_target, config)
    tax = _Taxonomy.of(occ, target)
    lat, lon = occ["lat"].to_numpy(), occ["lon"].to_numpy()
    valid = target & (tax.row_species >= 0)
    dropped = {BLANK_SPECIES: int((target & (tax.row_species < 0)).sum())}
    n_species = len(tax.species)
    images = np.bincount(tax.row_species[valid], minlength=n_species)
    few = valid & (images[np.maximum(tax.row_species, 0)] < config.min_images)  # species with too few images: dropped
    dropped[MIN_IMAGES] = int(few.sum())
    valid &= ~few
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
    given = _given_id_split(occ, valid & np.logical_or.reduce([is_id[r][row_sp]
                                                               for r in id_species])) if id_species else None
    shared = _non_local_sets(row_sp, valid & non_local[row_sp], config) + _non_target_sets(~target, config)
    out, shortfalls = {}, [dict(region=r, what="ID species", requested=len(set(id_species[r])),
                                 found=len(set(id_species[r])) - len(missing[r]))
                                 for r in sorted(id_species) if missing[r]]
    for region in sorted(id_species):
        picks = _id_sets(row_sp, valid & is_id[region][row_sp], config, region, given)
        picks += _local_sets(row_sp, valid & local[region][row_sp], config, region) + shared
        id_genera = tax.genus_flags(np.flatnonzero(is_id[region]))
        drop = tax.genus_flags(np.flatnonzero(local[region] | non_local)) & ~id_genera
        genus_ok = (tax.species_genus < 0) | ~drop[np.maximum(tax.species_genus, 0)]
        aux_species = present & ~is_id[region] & ~local[region] & ~non_local & genus_ok
        n_id_val = int(sum(len(index) for name, index in picks if name == "id_val"))
        aux, shortfall = _aux_sets(row_sp, valid & aux_species[row_sp], config, region, n_id_val)
        picks += aux
        shortfalls += [dict(region=region, **shortfall)] if shortfall else []
        out[region] = _region_frame(occ, tax, picks, _ranks(tax.species, is_id[region]), id_genera,
                                    tax.family_flags(np.flatnonzero(is_id[region])))
    return Splits(out, missing, config, {k: v for k, v in dropped.items() if v}, shortfalls)


def _with_non_target(occurrences: pd.DataFrame, non_target: pd.DataFrame | None,
                     config: SplitConfig) -> tuple[pd.DataFrame, np.ndarray]:
    """The checked table (with the separate non-target table appended) and the mask of target rows."""
    occ = occurrences
    if non_target is not None:
        if "file_name" not in non_target.columns:
            raise TableError("non-target table: needs a file_name column")
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
            raise TableError(f"the occurrence table's 'taxon' column holds {sorted(map(str, taxa))[:10]}: set "
                             "target_taxon "
                             "(--target-taxon) to say which one is the target; the others become non-target OOD")
        if config.target_taxon is not None:
            target = (occ["taxon"].astype(object) == config.target_taxon).to_numpy() | occ["taxon"].isna().to_numpy()
    if "_non_target" in occ.columns:
        target &= ~occ["_non_target"].to_numpy(dtype=bool)
    return occ, target


Picks = list[tuple[str, np.ndarray]]  # (set name, row positions)


def _check_missing(missing: dict[str, list[str]], tax: _Taxonomy, images: np.ndarray, config: SplitConfig) -> None:
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
    raise TableError("ID species missing from the splits (an ID species must not silently become OOD):\n  "
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
        raise TableError(f"occurrence table: ID row {occ['file_name'].iloc[first]!r} has split {split[first]!r}; "
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


def id_counts(size: np.ndarray, fractions: tuple[float, float, float],
              min_rule: bool = True) -> tuple[np.ndarray, np.ndarray]:
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
    """A random `non_target_val_fraction` to val, the rest to test; `non_target_cap` caps test (and val in
    proportion)."""
    rows = _rng(config.seed, "non_target").permutation(np.flatnonzero(mask))
    n_val = int(len(rows) * config.non_target_val_fraction)
    val, test = rows[:n_val], rows[n_val:]
    if config.non_target_cap is not None:
        val, test = val[: int(config.non_target_cap * config.non_target_val_fraction)], test[: config.non_target_cap]
    return [("non_target_test", np.sort(test)), ("non_target_val", np.sort(val))]


def _aux_sets(row_sp: np.ndarray, mask: np.ndarray, config: SplitConfig, region: str,
              n_id_val: int) -> tuple[Picks, dict[str, Any] | None]:
    """The auxiliary sets and the shortfall (fewer species with >= aux_per_species images than requested), if any."""
    rows = np.flatnonzero(mask)
    shortfall = None
    rng = _rng(config.seed, f"{region}:aux")
    val = _sample(rows, n_id_val if config.aux_val_size is None else config.aux_val_size, rng)
    train = np.setdiff1d(rows, val, assume_unique=True)
    n_species = config.aux_species_by_region.get(region, config.aux_species)
    if config.aux_per_species is not None:
        rank, size = rank_in_group(row_sp[train], rng)
        if n_species is not None:  # n_species species with >= aux_per_species images, aux_per_species each
            eligible = np.unique(row_sp[train][size >= config.aux_per_species])
            chosen = _sample(eligible, n_species, rng)
            if len(eligible) < n_species:
                shortfall = dict(what=f"auxiliary species with >= {config.aux_per_species} images",
                                 requested=int(n_species), found=int(len(eligible)))
            keep = np.isin(row_sp[train], chosen) & (rank < config.aux_per_species)
        else:
            keep = rank < config.aux_per_species
        train = train[keep]
    return [("aux_train", train), ("aux_val", val)], shortfall


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
    frame = (occ.iloc[rows][[*OCCURRENCE_COLUMNS, *(c for c in GBIF_ID_COLUMNS if c in occ.columns)]]
             .reset_index(drop=True))
    frame["set"] = pd.Categorical.from_codes(sets, categories=SETS)
    frame["label"] = np.where(is_id_row, id_rank[np.maximum(sp, 0)], -1).astype(np.int64)
    frame["hop"] = hop.astype(np.int64)
    frame["aux_label"] = aux_label.astype(np.int64)
    return frame

