"""The evaluation runner: a `Plan` (detectors.harness.plan) -> feature caches -> units -> results table and per-sample
scores.

Four steps, one module each:
1. **plan** — `make_plan(config)` (detectors.harness.plan): the whole config checked, every detector built once, every
   manifest read and checked (duplicate set names, leaks by path and by content), unit keys from content, before any
   model loads;
2. **prepare** — `prepare(plan)` (detectors.harness.prepare): one content-addressed feature cache per split, returned as
   a `PreparedRun`; images that fail to load are recorded and left out of every detector's populations alike;
3. **units** — `run_unit(unit, prepared, context)` (detectors.harness.execute) for `detector`, `select`, `rule` and
   `fewshot` units: fit and score, written atomically (`detectors.harness.units`); a finished unit is skipped on
   rerun, a failing one recorded in `failures.json` and the others go on;
4. **outputs** — `results.csv`, `ood_metrics.csv`, `scores.parquet`, `failures.json`, `threshold_transfer.csv`,
   `rule_selection.csv` (detectors.harness.outputs).

`Runner` ties them together across processes: units are divided across the ranks (`detectors.harness.distribute`),
the main process decides which are finished and every rank follows, and the main process reads back the units the
other ranks wrote.
"""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from detectors.base import Detector
from detectors.harness.distribute import EVERY, assign
from detectors.harness.execute import UnitContext, execute, run_unit
from detectors.harness.outputs import log_summary, results_table, rule_selection, warn_data, warn_results, write_outputs
from detectors.harness.plan import Plan, Unit, make_plan, reads_features
from detectors.harness.prepare import Prepared, PreparedRun, prepare
from detectors.harness.results import RESULT_COLUMNS, SCORE_COLUMNS
from detectors.harness.runconfig import ConfigError, DetectorSpec, EvalConfig, Source
from detectors.harness.selection import defaults_note
from detectors.harness.units import UnitResult, UnitStore
from detectors.posthoc import streaming
from pipelines import rankfiles
from pipelines.collectives import host, main_decides
from pipelines.errors import UserInputError
from pipelines.fingerprint import image_identity
from pipelines.io import atomic_path, remove_orphan_temps
from pipelines.locks import output_lock
from pipelines.runtime import partial_state

log = logging.getLogger(__name__)

RANKS_FOLDER = ".ranks"  # under units/: each process's done mark and heartbeat (pipelines.rankfiles)

__all__ = ["EvalConfig", "Source", "DetectorSpec", "ConfigError", "Plan", "make_plan", "Runner", "run_config",
           "dump_config", "reads_features", "RESULT_COLUMNS", "SCORE_COLUMNS", "Prepared", "rule_selection"]


class Runner:
    """Executes a Plan (`Runner(make_plan(config)).run()`); a config, mapping or path is planned once first."""

    def __init__(self, plan: Plan | EvalConfig | dict[str, Any] | str | os.PathLike):
        self.plan = plan if isinstance(plan, Plan) else make_plan(plan)
        self.store = UnitStore(self.plan.out)
        self.prepared: PreparedRun | None = None
        self.detector_failures: list[dict[str, Any]] = []
        self.reused = 0
        self.units_seconds = 0.0  # wall time of the units (main process: until every rank's are done)

    def run(self) -> pd.DataFrame:
        """Prepare features, run every unit (skipping finished ones), write the outputs; return the results table.
        Every cache key identifies images by the plan's `cache_hash`."""
        with image_identity(self.plan.runtime.cache_hash), \
                output_lock(self.plan.out, "evaluate", partial_state().is_main_process):  # one writer per output folder
            return self._run()

    def _unit(self, unit: Unit, ctx: UnitContext,
              failures: dict[str, dict[str, Any]]) -> tuple[UnitResult | None, Detector | None]:
        return execute(unit, lambda: run_unit(unit, self.prepared, ctx), self.plan, ctx, failures)

    def _start(self, main: bool) -> Path:
        """The output folder made; on the main process the temp files a killed run's writes left (a live writer's
        stay) and an earlier run's done marks removed. Returns the ranks' folder."""
        self.plan.out.mkdir(parents=True, exist_ok=True)
        ranks = self.store.root / RANKS_FOLDER
        if main:
            remove_orphan_temps(self.plan.out)
            if not self.plan.cache_dir.resolve().is_relative_to(self.plan.out.resolve()):
                remove_orphan_temps(self.plan.cache_dir)
            rankfiles.clear(ranks)
        rankfiles.check_shared({"out": self.plan.out, "cache_dir": self.plan.cache_dir})
        return ranks

    def _run(self) -> pd.DataFrame:
        state = partial_state()
        main, rank, units = state.is_main_process, state.process_index, self.plan.units
        ranks = self._start(main)
        run = self.prepared = prepare(self.plan)
        note = defaults_note(self.plan)
        if main:
            warn_data(run)
            if note:
                log.info(note)
        # the main process alone reads which units are finished; every rank follows its answer
        finished = self._finished() if main else {}
        pending = set(main_decides(lambda: [u.method for u in units if u.method not in finished],
                                   "the finished units' check"))
        where = assign(units, pending, state.num_processes, run.train_rows(), self.plan.runtime.shard_fit_rows)
        ran: dict[str, UnitResult | None] = {}  # what this process ran: a result, or None for a failure
        failures: dict[str, dict[str, Any]] = {}
        kept: dict[str, Detector] = {}  # training models their rule units re-score, until the last rule ran
        # units run together first (each ends in a collective), then each rank's own: no collective waits on a
        # rank's long unit
        order = [u for u in units if where.get(u.method) == EVERY] + [u for u in units if where.get(u.method) == rank]
        started = time.perf_counter()
        stream = streaming.StreamContext(rows=self.plan.runtime.chunk_rows or streaming.current().rows)
        with streaming.using(stream), rankfiles.Heartbeat(ranks, rank):
            for unit in order:
                together = where[unit.method] == EVERY
                group = unit.parent.method if unit.kind == "rule" else unit.method
                ctx = UnitContext(self.store, together, main or not together,
                                  kept.get(group) if unit.kind == "rule" else None)
                ran[unit.method], trained = self._unit(unit, ctx, failures)
                if trained is not None:
                    kept[group] = trained
                if unit.kind == "rule" and unit.method == unit.parent.rules[-1]:
                    kept.pop(group, None)  # its last rule ran: the trained model can go
                if main:
                    write_outputs(run, self._in_order(finished, ran), self.detector_failures, final=False)
            rankfiles.mark_done(ranks, rank, {"units": sorted(m for m in ran if where[m] == rank),
                                              "failures": failures})
        if not main:
            return results_table([])
        for mark in rankfiles.wait_for_ranks(ranks, state.num_processes, what="its units")[1:]:
            failures.update(mark["failures"])
            ran.update({m: self._read_back(m) for m in mark["units"] if m not in mark["failures"]})
        self.units_seconds = time.perf_counter() - started
        self.detector_failures += [failures[u.method] for u in units if u.method in failures]
        done = self._in_order(finished, ran)
        write_outputs(run, done, self.detector_failures, final=True)
        log_summary(run, self.reused, len(self.detector_failures), self.units_seconds)
        results = results_table(done)
        warn_results(run, results)
        return results

    def _read_back(self, method: str) -> UnitResult:
        """A unit another rank ran and wrote, read back by the main process."""
        unit = next(u for u in self.plan.units if u.method == method)
        found = self.store.finished(unit.method, unit.key)
        if found is None:
            raise UserInputError(f"{self.store.folder(method)}: another process wrote unit {method!r}, but the main "
                                 f"process on {host()} cannot read it: `out` must be a folder every process sees")
        return found

    def _finished(self) -> dict[str, UnitResult]:
        """The units finished with their current key, read back (main process)."""
        found = {u.method: self.store.finished(u.method, u.key) for u in self.plan.units}
        self.reused = sum(r is not None for r in found.values())
        return {m: r for m, r in found.items() if r is not None}

    def _in_order(self, finished: dict[str, UnitResult], ran: dict[str, UnitResult | None]) -> list[UnitResult]:
        """The finished and the newly run units' results in plan order (failed units left out)."""
        results = {**finished, **ran}
        return [r for r in (results.get(u.method) for u in self.plan.units) if r is not None]


def run_config(config: Plan | EvalConfig | dict[str, Any] | str | Path) -> pd.DataFrame:
    """Run the evaluation described by a plan, config object, mapping or YAML path; returns the results table."""
    return Runner(config if isinstance(config, Plan) else make_plan(config)).run()


def dump_config(config: EvalConfig, path: str | Path) -> None:
    """Write a config back as YAML (for the record next to the results): `EvalConfig.dump()`, keys at their default
    left out."""
    with atomic_path(path) as tmp:
        tmp.write_text(yaml.safe_dump(config.dump(), sort_keys=False))
