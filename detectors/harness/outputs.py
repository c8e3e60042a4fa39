"""Step 3 of an evaluation: the run's output files from its finished units, and its progress and sanity lines.

`results.csv` and `ood_metrics.csv` (rewritten after every unit the main process finishes), `failures.json`, and at
the end `scores.parquet`, `rule_selection.csv` and `threshold_transfer.csv`. Every table's columns come from
`detectors.harness.results`.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from detectors.harness.openset import OOD_METRICS_FILE, ood_csv_table
from detectors.harness.prepare import ID_TEST, ID_TRAIN, PreparedRun
from detectors.harness.results import LOWER_IS_BETTER, RESULT_COLUMNS, RESULT_TEXT, SCORE_COLUMNS
from detectors.harness.sanity import (
    accuracy_warnings,
    head_warning,
    id_classes,
    one_class_warning,
    protocol_warning,
    small_set_warnings,
)
from detectors.harness.transfer import transfer_table
from detectors.harness.units import UnitResult
from pipelines.io import atomic_path, atomic_write_json
from pipelines.runtime import partial_state

log = logging.getLogger(__name__)


def results_table(done: list[UnitResult]) -> pd.DataFrame:
    """The units' result rows in order, `RESULT_TEXT` columns empty where a unit written before them lacks them."""
    frames = [u.rows for u in done if len(u.rows)]
    results = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(RESULT_COLUMNS))
    results = results.reindex(columns=[*results.columns, *(c for c in RESULT_TEXT if c not in results)])
    results[list(RESULT_TEXT)] = results[list(RESULT_TEXT)].fillna("")
    return results


def rule_selection(validation: list[dict[str, Any]]) -> pd.DataFrame:
    """Per training method, its own score and each rule on (ID val, OOD val); `chosen` marks the best by the metric."""
    table = pd.DataFrame(validation)
    table["chosen"] = False
    for _, rows in table.groupby("base", sort=False):
        sign = -1.0 if LOWER_IS_BETTER.get(rows["metric"].iloc[0], False) else 1.0
        table.loc[(sign * rows["value"]).fillna(-np.inf).idxmax(), "chosen"] = True  # one per base, NaN never first
    return table


def write_csv(frame: pd.DataFrame, path: Path) -> None:
    with atomic_path(path) as tmp:
        frame.to_csv(tmp, index=False)


def write_outputs(run: PreparedRun, done: list[UnitResult], unit_failures: list[dict[str, Any]], final: bool) -> None:
    """The tables of the units done so far and failures.json; with `final`, the scores and the tables read from
    them."""
    plan = run.plan
    out = plan.out
    results = results_table(done)
    write_csv(results, out / "results.csv")
    write_csv(ood_csv_table(results), out / OOD_METRICS_FILE)  # the reference's ood.csv columns
    atomic_write_json(out / "failures.json", {"images": run.image_failures, "sets": run.set_failures,
                                              "detectors": unit_failures})
    if not final:
        return
    scores = pd.concat([u.scores for u in done], ignore_index=True) if done else pd.DataFrame(columns=SCORE_COLUMNS)
    with atomic_path(out / "scores.parquet") as tmp:
        scores.to_parquet(tmp, index=False)
    validation = [v for u in done for v in (u.validation or [])]
    if validation:
        write_csv(rule_selection(validation), out / "rule_selection.csv")
    if plan.transfer and len(scores):
        species = {s.name: {int(i): s.manifest.rows[i].get("species") for i in run.data[s.id].index}
                   for s in plan.of_role("field_ood") if s.id in run.data}
        rules = [t.to_dict() for t in plan.transfer]
        write_csv(transfer_table(rules, scores, species), out / "threshold_transfer.csv")


def log_summary(run: PreparedRun, reused: int, unit_failures: int, seconds: float) -> None:
    """Units run and reused, and the counts of what failures.json records."""
    units = len(run.plan.units)
    log.info("units: %d run in %.1f s on %d process(es)", units - reused, seconds, partial_state().num_processes)
    if reused:
        log.info("resumed: %d of %d units up to date", reused, units)
    n_images, n_sets = len(run.image_failures), len(run.set_failures)
    failures = run.plan.out / "failures.json"
    if n_sets:
        log.info("%d set%s left out (no loadable image) -> %s", n_sets, "s" if n_sets > 1 else "", failures)
    if n_images:
        log.info("%d image%s unreadable -> %s", n_images, "s" if n_images > 1 else "", failures)
    if unit_failures:
        log.info("%d detector%s failed -> %s", unit_failures, "s" if unit_failures > 1 else "", failures)


def _id_classes(run: PreparedRun) -> int | None:
    """The number of ID classes of the ID train (else test) rows; None without either."""
    for split_id in (ID_TRAIN, ID_TEST):
        if split_id in run.data:
            return id_classes(run.labels(split_id))
    return None


def warn_data(run: PreparedRun) -> None:
    """One line each for a head that is not one output per ID class, an ID set of one class and a classifier trained
    under another protocol (`sanity`)."""
    classes = _id_classes(run)
    train = run.data.get(ID_TRAIN)
    logits = None if train is None or train.features is None else train.features.logits
    lines = [one_class_warning(classes or 0), protocol_warning(run.plan.runtime.model, run.plan.protocol)]
    if classes and logits is not None:
        lines.append(head_warning(int(np.asarray(logits).shape[1]), classes, str(run.plan.runtime.model)))
    for line in filter(None, lines):
        log.warning("[oodforge] warning: %s", line)


def warn_results(run: PreparedRun, results: pd.DataFrame) -> None:
    """One line each for an ID accuracy at chance or zero and a set too small for AUROC to resolve 10 points."""
    classes = _id_classes(run) or 0
    n_test = len(run.labels(ID_TEST)) if ID_TEST in run.data else 0
    for line in [*accuracy_warnings(results, classes, n_test), *small_set_warnings(results)]:
        log.warning("[oodforge] warning: %s", line)
