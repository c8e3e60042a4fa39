"""The one definition of the runner's table formats: results, per-sample scores and threshold transfer.

The runner writes these columns, selection and the report read them, and the tests check against them. Nothing else
spells a column list, a score role or a metric direction.
"""
from __future__ import annotations

from typing import Any

from detectors.metrics import METRICS
from detectors.openset_metrics import OOD_CSV_COLUMNS, OPENSET_METRICS

LOWER_IS_BETTER: dict[str, bool] = {"auroc": False, "fpr95": True, "fpr95_id": True, "aupr_in": False,
                                    "aupr_out": False, "id_acc": False, "tnr10": False, "tnr20": False,
                                    "ap_out": False, "fpr95_ref": True, "auoscr": False, "openauc": False,
                                    "osa": False, "oosa": False}
"""Direction of each metric: selection maximises the others and minimises these."""

RESULT_COLUMNS: tuple[str, ...] = ("method", "family", "mode", "protocol", "checkpoint", "base", "rule", "ood_set",
                                   "group", *METRICS, "id_acc", *OPENSET_METRICS, "n_id", "n_ood", "seconds", "params",
                                   "selected_on")
"""A row per (method, OOD set). `family` is the row's own family (a rule re-scoring a training method is `training`);
`mode` says how a training method trained (`full` or `heads`; empty elsewhere); `protocol` the config's `protocol:`
(`detectors.harness.protocols.PROTOCOLS`); `checkpoint` which checkpoint of a trained classifier folder the run's
classifier is
(`last` / `best`; empty for a model without `checkpoints.json`; a training method's own fine-tune says its choice in
`params`); `base` / `rule` name the trained method
and the post-hoc rule of a re-scored row; `id_acc` is the top-1 ID test accuracy of the classifier the row scores with
(NaN where no classifier is involved); `OPENSET_METRICS` are the Open-Insect evaluator's ood.csv numbers
(`detectors.openset_metrics`, filled by `detectors.harness.openset`; NaN in tables written before them); `params` the
JSON of the hyperparameters that ran (chosen ones included);
`selected_on` how a swept unit chose them (`auroc: id_val vs ood_val[<sets>]`; empty where defaults ran)."""

RESULT_TEXT: tuple[str, ...] = ("mode", "checkpoint", "base", "rule", "selected_on")
"""Result columns of text that may be empty (rows of units written before a column existed read back empty)."""


def result_row(**values: Any) -> dict[str, Any]:
    """A results-table row: the `RESULT_COLUMNS` of `values`, in their order; a missing column raises KeyError (other
    keys are not columns of the table and are left out)."""
    missing = [c for c in RESULT_COLUMNS if c not in values]
    if missing:
        raise KeyError(f"result row without column(s) {missing}")
    return {c: values[c] for c in RESULT_COLUMNS}


RESULT_REQUIRED: tuple[str, ...] = ("method", "family", "ood_set", "group", "auroc", "fpr95", "aupr_in", "aupr_out",
                                    "n_id", "n_ood", "seconds")
"""The columns a results table must have to be reported (older tables lack the rest)."""

SCORE_ROLES: tuple[str, ...] = ("id", "ood", "field_id", "field_ood")
"""`id`: ID test rows; `ood`: a test OOD set's rows; `field_id` / `field_ood`: a field set's known / novel rows."""

SCORE_COLUMNS: tuple[str, ...] = ("method", "family", "role", "ood_set", "group", "index", "score")
"""A row per (method, scored image); `index` is the row's position in its manifest selection; higher score = more ID."""

SCORE_OPTIONAL: tuple[str, ...] = ("file_name", "manifest")
"""Traceability columns of newer scores tables: the image's file name and the manifest folder it came from."""
PREDICTION = "pred"
"""The optional scores column of the run classifier's predicted class (its name where the run knows the class names,
else the index as text), the same for every method; absent where no classifier logits were computed."""

TRANSFER_COLUMNS: tuple[str, ...] = ("method", "source", "target", "tpr", "threshold", "precision", "recall", "id_kept",
                                     "tp", "fp", "n_id", "n_ood")
"""A row per (rule, method, target) of threshold transfer; field-set targets add `SPECIES_COLUMNS`."""

SPECIES_COLUMNS: tuple[str, ...] = ("species_detected", "species_any", "n_novel_species")
"""`species_detected`: share of the field set's novel-species *images* flagged OOD (the paper's Table 6);
`species_any`: share of novel *species* with at least one image flagged; `n_novel_species`: how many species."""

TRANSFER_RATES: tuple[str, ...] = ("tpr", "precision", "recall", "id_kept", "species_detected", "species_any")
"""Transfer columns that are fractions (rendered in percent)."""

COLUMN_LABELS: dict[str, str] = {
    "auroc": "AUROC", "fpr95": "FPR@95", "fpr95_id": "FPR@95 (ID-positive)", "aupr_in": "AUPR-In",
    "aupr_out": "AUPR-Out", "id_acc": "ID acc.", "species_detected": "novel-species images flagged",
    "species_any": "novel species with >= 1 image flagged",
    **{ours: label for label, ours in OOD_CSV_COLUMNS.items() if ours not in ("auroc", "id_acc")},
    "oosa_threshold": "OOSA threshold",
}
"""Human labels of metric columns for rendered tables and figures."""
