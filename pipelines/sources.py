"""`Source`: one manifest selection, the same value in every config (evaluation, generation, training, splits).

A source is a manifest folder, optionally one split, an OOD-group override and some OOD sets. A bare folder string is
shorthand for `{manifest: FOLDER}`. `split: null` means the documented default of the key the source stands under
(evaluation's `ood:` reads `test`, `ood_val:` reads `val`, `aux:` reads `train`; a generation input reads every split);
`split: all` reads every split wherever it stands. `Source.read_split(default)` resolves it.
"""
from __future__ import annotations

from typing import Literal

from pipelines.params import REQUIRED, Config, config, param
from pipelines.schema import GROUPS

SplitName = Literal["train", "val", "test", "all"]
GroupName = Literal[GROUPS]  # type: ignore[valid-type]


@config
class Source(Config):
    """A manifest selection: folder, split, group override, OOD-set filter."""

    DOC = "README.md, section 'Data formats'"
    SHORTHAND = "manifest"

    manifest: str = param(REQUIRED, "the manifest folder (images + metadata.jsonl, or manifest_info.json)")
    split: SplitName | None = param(None,
                                    "the split to read; null: the default of the key it stands under; all: every split")
    group: GroupName | None = param(None,
                                    "the OOD group of every row read (hard, easy, near, far); null: the manifest's")
    sets: list[str] | None = param(None, "only these ood_set names; null: every set")


    def check(self, dims: dict[str, int] | None = None) -> None:
        super().check(dims)
        if not self.manifest:
            raise ValueError("manifest must be a folder path, got ''")
        if self.sets is not None and not self.sets:
            raise ValueError("sets must name at least one ood_set (or be null for every set)")

    def read_split(self, default: str | None) -> str | None:
        """The split this source reads under a key whose default is `default` (None: every split)."""
        split = self.split if self.split is not None else default
        return None if split == "all" else split
