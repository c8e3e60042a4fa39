"""Threshold transfer from the runner's per-sample scores: a threshold chosen on one set, applied to another.

The threshold flags OOD iff score < t and reaches `tpr` on the source (an OOD set, or ID test with positive 'id').
On a benchmark OOD set target, precision counts false positives among the benchmark's ID test rows. On a *field set*
target (config `field:`), everything is computed on the field set alone, as the Open-Insects field test does: its own ID
rows are the negatives, its novel rows the positives; `species_detected` is the share of the field set's
novel-species images that are flagged (the image share over the novel species of the paper's Table 6) and
`species_any` the share of novel species with at least one flagged image.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from detectors.harness.results import TRANSFER_COLUMNS
from detectors.metrics import precision_recall_at, threshold_at_tpr
from detectors.training.field import species_detection_share


def _of(scores: pd.DataFrame, role: str, ood_set: str | None = None) -> pd.DataFrame:
    pick = scores["role"] == role
    if ood_set is not None:
        pick &= scores["ood_set"] == ood_set
    return scores[pick]


def species_detected(scores: np.ndarray, species: list[Any], threshold: float) -> dict[str, float]:
    """`SPECIES_COLUMNS` of a field set's novel rows (score < threshold is flagged; rows without a species are left
    out), from the one count of `detectors.training.field.species_detection_share`."""
    if all(s is None or s != s for s in species):
        return {}
    share = species_detection_share(scores, species, threshold)
    return {"species_detected": share["image_share"], "species_any": share["any"],
            "n_novel_species": share["n_species"]}


def transfer_table(rules: list[dict[str, Any]], scores: pd.DataFrame,
                   species: dict[str, dict[int, Any]]) -> pd.DataFrame:
    """One row per (rule, method, target). `scores` is the runner's scores frame; `species[field_set][index]` gives
    the species of a field set's row (by its position in the field manifest selection)."""
    rows = []
    for rule in rules:
        source, tpr, positive = rule["source"], float(rule.get("tpr", 0.95)), rule.get("positive", "ood")
        for method, frame in scores.groupby("method", sort=False):
            id_scores = _of(frame, "id")["score"].to_numpy()
            if positive == "id":
                threshold = threshold_at_tpr(id_scores, tpr, "id")
            else:
                threshold = threshold_at_tpr(_of(frame, "ood", source)["score"].to_numpy(), tpr, "ood")
            for target in rule["targets"]:
                row: dict[str, Any] = {"method": method, "source": source, "target": target, "tpr": tpr}
                novel = _of(frame, "field_ood", target)
                if len(novel) or len(_of(frame, "field_id", target)):
                    negatives = _of(frame, "field_id", target)["score"].to_numpy()
                    row.update(precision_recall_at(threshold, negatives, novel["score"].to_numpy())
                               if len(negatives) else _recall_only(threshold, novel["score"].to_numpy()))
                    names = species.get(target, {})
                    row.update(species_detected(novel["score"].to_numpy(), [names.get(int(i)) for i in novel["index"]],
                                                threshold))
                else:
                    row.update(precision_recall_at(threshold, id_scores, _of(frame, "ood", target)["score"].to_numpy()))
                rows.append(row)
    table = pd.DataFrame(rows)
    return table[[*TRANSFER_COLUMNS, *(c for c in table.columns if c not in TRANSFER_COLUMNS)]] if rows else table


def _recall_only(threshold: float, novel: np.ndarray) -> dict[str, float]:
    tp = int((novel < threshold).sum())
    return {"threshold": float(threshold), "precision": float("nan"), "recall": tp / len(novel),
            "id_kept": float("nan"), "tp": tp, "fp": 0, "n_id": 0, "n_ood": len(novel)}
