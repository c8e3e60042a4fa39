"""Geographic open-set splits for species recognition (Open-Insects protocol) from occurrence metadata.

Input: an occurrence table (a GBIF Darwin Core Archive, or CSV / TSV / Parquet, one row per image: `species, genus,
family, lat, lon, file_name`, optional `split` for given ID splits and `taxon` to mark non-target rows; GBIF names
mapped and rows dropped by counted reasons in pipelines.curation.gbif) and the ID species of each region (`region,
species`). Per region it builds, with vectorised pandas/numpy (no loop over rows):

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
`manifest_info.json` (pipelines.data.MANIFEST_INFO) beside each region's `metadata.jsonl`; `load_region(folder)` returns
the manifest rooted there.
"""
from __future__ import annotations

from gen.insects.manifests import (
                                   SET_FIELDS,
                                   load_region,
                                   make_splits,
                                   manifest_rows,
                                   manifest_table,
                                   object_columns,
                                   read_input,
                                   shortfall_lines,
                                   summarize,
                                   summary_record,
                                   write_region,
                                   write_splits,
)
from gen.insects.occurrences import (
                                   AUSTRALIA,
                                   OCCURRENCE_COLUMNS,
                                   REGIONS,
                                   Box,
                                   TableError,
                                   check_occurrences,
                                   key_strings,
                                   read_id_species,
                                   read_table,
                                   synthetic_occurrences,
)
from gen.insects.options import MakeSplitsConfig
from gen.insects.splits import SETS, SplitConfig, Splits, build_splits, id_counts, rank_in_group

__all__ = [
    "AUSTRALIA", "OCCURRENCE_COLUMNS", "REGIONS", "SETS", "SET_FIELDS", "Box", "MakeSplitsConfig", "SplitConfig",
    "Splits", "TableError", "read_input", "shortfall_lines", "summary_record",
    "build_splits", "check_occurrences", "id_counts", "key_strings", "load_region", "make_splits", "manifest_rows",
    "manifest_table", "object_columns", "rank_in_group", "read_id_species", "read_table", "summarize",
    "synthetic_occurrences", "write_region", "write_splits",
]
