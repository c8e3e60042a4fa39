"""The options of `scripts/make_splits.py` as one typed config: inputs, the taxon filter and the builder's parameters,
each checked by `pipelines.params` before any table is read."""
from __future__ import annotations

from gen.insects.splits import SplitConfig
from pipelines.curation.gbif import TableLimits, TaxonFilter
from pipelines.params import REQUIRED, Config, config, param


@config
class MakeSplitsConfig(Config):
    """Everything make_splits reads; a fault is one ConfigError naming the key (the script names the flag)."""

    DOC = "docs/species.md"

    occurrences: str | None = param(None, "GBIF Darwin Core Archive (zip or folder) or CSV / TSV / Parquet table")
    synthetic: int | None = param(None, "rows of a generated occurrence table (instead of occurrences)", ge=1)
    id_species: str | None = param(None, "table of region, species (required with occurrences)")
    image_root: str | None = param(None, "folder the file_name paths are relative to")
    out: str = param(REQUIRED, "output folder")
    non_target: str | None = param(None, "extra table or archive of non-target images")
    check_files: bool | None = param(None, "drop rows whose image file is missing (None: on for archives)")
    taxa: TaxonFilter = param(TaxonFilter(), "which taxa the occurrence rows keep")
    split: SplitConfig = param(SplitConfig(), "the split builder's parameters")
    limits: TableLimits = param(TableLimits(), "what reading the occurrence table or archive may cost (rows, bytes)")

    def check(self, dims: dict[str, int] | None = None) -> None:
        super().check(dims)
        if (self.occurrences is None) == (self.synthetic is None):
            raise ValueError("give one of --occurrences and --synthetic")
        if self.occurrences is not None and (self.id_species is None or self.image_root is None):
            raise ValueError("--occurrences needs --id-species and --image-root")
