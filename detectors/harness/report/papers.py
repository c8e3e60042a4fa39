"""The two papers' layouts: the tables and figures each prints, from the runs' tables and companion files.

- Open-Insects (`open_insects`, one run per region): Tables 2/7, 4, 5, 6; Figures 1, 3, 4.
- ShiftedBronzes (`shiftedbronzes`): Tables 2, 3, 4; Figures 5, 6, 7, 2(c).

This module holds what both share: a run folder's tables (`Run`) and the `NAME=PATH` region specs. Display names and
orders come from `names`; every value is the one the generic tables compute (`tables`, `scores`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from detectors.harness.report.scores import read_scores
from detectors.harness.report.tables import companion_files, read_results, read_rule_selection, read_table


@dataclass
class Run:
    """One run folder's tables: the results (percent), their scale and the companions that exist; `pretrained`: its
    classifier started from ImageNet-1K weights (Open-Insects' Table 7), not from scratch."""

    name: str
    folder: Path
    results: pd.DataFrame
    scale: str
    selection: pd.DataFrame | None = None
    transfer: pd.DataFrame | None = None
    scores: pd.DataFrame | None = None
    pretrained: bool = False

    @classmethod
    def read(cls, name: str, results: str | os.PathLike, scores: bool = True, pretrained: bool = False) -> Run:
        frame, scale = read_results(results)
        found = companion_files(results)
        selection = read_rule_selection(found["rule_selection"]) if "rule_selection" in found else None
        transfer = read_table(found["threshold_transfer"], ("method", "source", "target", "threshold", "precision",
                                                            "recall"), "threshold-transfer table") \
            if "threshold_transfer" in found else None
        table = read_scores(found["scores"]) if scores and "scores" in found else None
        return cls(name, Path(results).parent, frame, scale, selection, transfer, table, pretrained)


def region_name(spec: str) -> tuple[str, Path]:
    """`NAME=PATH` or `PATH` (named by its run folder) -> (name, path)."""
    name, sep, path = spec.partition("=")
    return (name, Path(path)) if sep and name and "/" not in name else (Path(spec).parent.name or spec, Path(spec))


__all__ = ["Run", "region_name"]
