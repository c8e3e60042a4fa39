"""Step 2 of an evaluation: one unit run as a function of the unit, the prepared run and an explicit context.

`run_unit(unit, run, ctx)` fits the unit's detector (a `select` unit: the protocol's validation sweep first; a `rule`
unit: a post-hoc rule on its training unit's model) and scores ID test, every OOD set and every field set, giving its
result rows and per-sample scores (`UnitResult`). It keeps no state: what it needs besides the prepared data comes in
`UnitContext` (whether every rank runs it together, whether this process writes its files, the model a rule
re-scores), and the trained model that later rule units re-score goes back out with the result.

`execute` runs one and writes it (`UnitStore`), or records its failure and lets the run go on.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from detectors.base import RUNTIME_INPUTS, Detector, FeatureSet, ImageSet
from detectors.harness.openset import KnownClasses, from_logits, oosa_threshold, openset_columns, predictions
from detectors.harness.outputs import write_csv
from detectors.harness.plan import Plan, Split, Unit, key_record, reads_features, safe_name
from detectors.harness.prepare import AUX, ID_TEST, ID_TRAIN, ID_VAL, PreparedRun
from detectors.harness.protocols import OOSA_SCORER
from detectors.harness.results import PREDICTION, RESULT_COLUMNS, SCORE_COLUMNS, SCORE_OPTIONAL, result_row
from detectors.harness.selection import select
from detectors.harness.units import UnitResult, UnitStore
from detectors.metrics import evaluate as compute_metrics
from detectors.posthoc import streaming
from detectors.posthoc.pixels import pixel_memo
from pipelines.batches import clear_kept_batches
from pipelines.collectives import PeerFailed, PeerLost, all_gather, alone, fail_together, is_peer_lost, peer_line
from pipelines.runtime import partial_state

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class UnitContext:
    """How this process runs a unit: `together` on every rank (`detectors.harness.distribute`), whether it `writes`
    the unit's files (its rank, or the main one of a unit run together), the `store` whose folders hold each unit's
    work files, and for a rule unit the `parent` model its training unit left in this run (None: fitted again)."""

    store: UnitStore
    together: bool = False
    writes: bool = True
    parent: Detector | None = None


class UnitFailed(Exception):
    """A unit that raised after its training model fitted: the `error`, and the `trained` model its rule units still
    re-score."""

    def __init__(self, error: Exception, trained: Detector):
        super().__init__(str(error))
        self.error, self.trained = error, trained


@dataclass(frozen=True)
class Chosen:
    """A unit's detector, how a sweep chose it (`selected_on`), and another scorer picking the OOSA threshold (a swept
    unit under a `defaults` protocol, `OOSA_SCORER`)."""

    det: Detector
    selected_on: str = ""
    theta_scorer: Detector | None = None


@dataclass(frozen=True)
class Scoring:
    """What a unit scores with and what its rows say of it: the detector, its row labels, when its fit started (the
    rows' `seconds` include the fit), the classifier predictions (`known`), and for a rule the trained model's `view`
    of each split."""

    det: Detector
    method: str
    family: str
    start: float
    known: KnownClasses
    mode: str = ""
    base: str = ""
    rule: str = ""
    selected_on: str = ""
    theta_scorer: Detector | None = None
    view: Callable[[str], Any] | None = None

    def data(self, run: PreparedRun, split_id: str) -> Any:
        return self.view(split_id) if self.view else run.split_data(self.det, split_id)


def run_unit(unit: Unit, run: PreparedRun, ctx: UnitContext) -> UnitResult:
    """The unit's result rows, scores and validation record; `trained` carries a training model that rules re-score.
    Raises `UnitFailed` when it fails after such a model fitted."""
    if unit.kind == "fewshot":
        from detectors.harness.fewshot import fewshot_unit

        fewshot_unit(run, ctx.writes)
        return UnitResult(pd.DataFrame(columns=RESULT_COLUMNS), pd.DataFrame(columns=SCORE_COLUMNS))
    if unit.kind == "rule":
        return _rule_unit(unit, run, ctx)
    start = time.perf_counter()
    chosen = _selected(unit, run, ctx) if unit.kind == "select" else Chosen(_build(unit, run, ctx))
    det = chosen.det
    if not det.fitted:
        _fit(det, run, ctx)
    try:
        training = det.family == "training"
        scoring = Scoring(det, unit.method, det.family, start, _known(run, det, det if training else None),
                          mode=str(det.params.get("mode", "")) if training else "",
                          base=unit.method if training else "", selected_on=chosen.selected_on,
                          theta_scorer=chosen.theta_scorer)
        result = _result(*_score_all(run, ctx, scoring),
                         _validation(run, det, unit.method, "") if training else None)
    except Exception as err:
        if unit.rules:
            raise UnitFailed(err, det) from err
        raise
    return dataclasses.replace(result, trained=det if unit.rules else None)


def _rule_unit(unit: Unit, run: PreparedRun, ctx: UnitContext) -> UnitResult:
    """A post-hoc rule fitted and scored on the trained model's outputs (`transform`, `trained_head`)."""
    trained = ctx.parent
    if trained is None:  # not kept from its unit in this run: fitted again (not rewritten)
        trained = _build(unit.parent, run, ctx)
        if not trained.fitted:
            _fit(trained, run, ctx)
    try:
        if not hasattr(trained, "transform"):
            raise TypeError(f"{unit.parent.method}: rules need a training-time detector with transform() and "
                            "trained_head")
        start = time.perf_counter()
        scorer = unit.detector(**unit.params)  # the rule's resolved parameters (protocol merged)
        view = lambda split_id: _transformed(trained, run.split_data(trained, split_id))  # noqa: E731
        scorer.fit(view(ID_TRAIN), head=trained.trained_head, id_val=view(ID_VAL))
        scoring = Scoring(scorer, unit.method, "training", start, _known(run, scorer, trained),
                          mode=str(trained.params.get("mode", "")), base=unit.parent.method, rule=unit.rule,
                          view=view)
        result = _result(*_score_all(run, ctx, scoring),
                         _validation(run, scorer, unit.parent.method, unit.rule, view))
    except Exception as err:
        raise UnitFailed(err, trained) from err
    return dataclasses.replace(result, trained=trained)


def _fit(det: Detector, run: PreparedRun, ctx: UnitContext) -> None:
    kwargs = _fit_kwargs(det, run)
    train = run.split_data(det, ID_TRAIN)
    if type(det).fits_from_shards and ctx.together and partial_state().num_processes > 1:
        # each process fits its contiguous share of the rows; the sums are reduced exactly over the processes
        shard = lambda fs: fs.subset(streaming.process_rows(len(fs))) if isinstance(fs, FeatureSet) else fs  # noqa: E731
        with streaming.across_processes():
            det.fit(shard(train), **{k: shard(v) for k, v in kwargs.items()})
        return
    det.fit(train, **kwargs)


def _fit_kwargs(det: Detector, run: PreparedRun) -> dict[str, Any]:
    """The optional fit inputs `det`'s class declares (`fit_inputs`): ID val, head, OOD val, aux."""
    wants = type(det).fit_inputs
    kwargs: dict[str, Any] = {}
    if "id_val" in wants:
        kwargs["id_val"] = run.split_data(det, ID_VAL)
    if "head" in wants and reads_features(det):
        kwargs["head"] = run.head
    ood_val = run.plan.ood_val
    if "ood_val" in wants and ood_val is not None:
        kwargs["ood_val"] = run.split_data(det, ood_val.id)
    if "aux" in wants and run.plan.split(AUX) is not None:
        kwargs["aux"] = run.split_data(det, AUX)
    return kwargs


def _build(unit: Unit, run: PreparedRun, ctx: UnitContext) -> Detector:
    """The detector of a unit (its resolved parameters), with the runtime objects its class `needs` (a training
    method gets its own copy of the classifier, which it fine-tunes; the others share one)."""
    cls, method, plan = unit.detector, unit.method, run.plan
    params = dict(unit.params)
    rt = plan.runtime
    runtime = {"class_names": list(plan.class_names) if plan.class_names else None,
               "cache_dir": str(plan.cache_dir / cls.family), "device": rt.device,
               "precision": None if rt.precision == "auto" else rt.precision,
               "work_dir": str(ctx.store.folder(method) / "work")}
    if "classifier" in cls.needs and "classifier" not in params and rt.model:
        clf = run.model.load()
        params["classifier"] = copy.deepcopy(clf) if cls.family == "training" else clf
    for key, value in runtime.items():
        if value is not None and key not in params and key in cls.needs:
            params[key] = value
    if unit.load:
        return cls.from_pretrained(unit.load, **params)
    return cls(**params)


def _selected(unit: Unit, run: PreparedRun, ctx: UnitContext) -> Chosen:
    """The protocol's validation sweep (`unit.parts["sweep"]`, ID val against OOD val) on cached features or, for
    image-level detectors, on the validation images; the best point's detector, fitted."""
    plan = run.plan
    sel = plan.select
    probe = _build(unit, run, ctx)  # what the detector reads and its fit inputs, for every point alike
    fit_kwargs = {k: v for k, v in _fit_kwargs(probe, run).items() if k != "id_val"}
    fit_kwargs["id_val"] = run.split_data(probe, ID_VAL)
    make = lambda params: _build(dataclasses.replace(unit, params=params), run, ctx)  # noqa: E731
    sets = ",".join(sorted({r["ood_set"] for r in plan.split(sel.split).manifest.rows}))
    try:
        with pixel_memo(plan.runtime.sweep_pixel_mb):  # image-level sweeps preprocess the images once
            det, _, table = select(unit.name, fit_kwargs["id_val"], run.split_data(probe, sel.split),
                                   id_train=run.split_data(probe, ID_TRAIN), space=unit.parts["sweep"],
                                   metric=sel.metric, fixed=dict(unit.params), make=make, fit_kwargs=fit_kwargs,
                                   ties=sel.ties)
        selected_on = f"{sel.metric}: id_val vs ood_val[{sets}]"
    except ValueError as err:  # no grid point fits these features (e.g. NECO's dims on D = 64): the defaults run
        det, table = probe, [{"error": str(err)}]
        selected_on = "defaults: no grid point fits the data"
    if ctx.writes:  # which split chose: ID val against these OOD-validation sets
        frame = pd.DataFrame(table).assign(metric=sel.metric, id_val="id_val", ood_val=sets)
        write_csv(frame, plan.out / "selection" / f"{safe_name(unit.method)}.csv")
    theta = OOSA_SCORER[plan.protocol] == "defaults" and probe is not det and probe.params != det.params
    return Chosen(det, selected_on, probe if theta else None)  # the reference picks the threshold before its sweep


def _known(run: PreparedRun, det: Detector, trained: Detector | None) -> KnownClasses:
    """ID test and val predictions of the classifier the rows score with (`detectors.harness.openset`): the trained
    model's logits (`transform`) for training methods and their rules, the run classifier's cached logits for
    detectors that use it, a detector's own `predict` (CLIP's class prompts), else none (NaN columns). Val
    predictions only where OOD validation rows choose the OOSA threshold."""
    ood_val = run.plan.ood_val
    val = ood_val is not None and ood_val.id in run.data
    return KnownClasses(_predictions(run, det, trained, ID_TEST),
                        _predictions(run, det, trained, ID_VAL) if val else None)


def _predictions(run: PreparedRun, det: Detector, trained: Detector | None, split_id: str) -> Any:
    prepared = run.data.get(split_id)
    if prepared is None or not len(prepared.index):
        return None
    labels = run.labels(split_id)
    if trained is not None and hasattr(trained, "transform"):
        return from_logits(_trained_logits(run, trained, split_id), labels)
    if prepared.features is not None and (reads_features(det) or "classifier" in type(det).needs):
        return from_logits(prepared.features.logits, labels)
    if hasattr(det, "predict"):
        return predictions(det.predict(run.split_data(det, split_id)), labels)
    return None


def _trained_logits(run: PreparedRun, trained: Detector, split_id: str) -> np.ndarray | None:
    """A split's logits by a trained model: `transform` of what it reads; a method that reads images only to score
    (RotPred in heads mode) but transforms features is given the cached features."""
    data = run.split_data(trained, split_id)
    features = run.data[split_id].features
    if isinstance(data, ImageSet) and features is not None:
        try:
            return trained.transform(data).logits
        except (TypeError, ValueError, AttributeError):
            return trained.transform(features).logits
    return trained.transform(data).logits


def _oosa_threshold(run: PreparedRun, ctx: UnitContext, s: Scoring) -> float | None:
    """The OOSA threshold on ID val against OOD val (None without both or predictions), scored by the row's
    detector or, for a swept unit under a `defaults` protocol (`OOSA_SCORER`), at its parameters before the
    sweep."""
    scorer = s.theta_scorer or s.det
    ood_val = run.plan.ood_val
    if s.known.val is None or ood_val is None or not run.has_rows(ood_val.id):
        return None
    if not scorer.fitted:
        try:
            _fit(scorer, run, ctx)
        except ValueError as err:  # the defaults do not fit these data (the sweep skipped such points too)
            log.info("%s: OOSA threshold from the selected point (its defaults do not fit: %s)", s.method, err)
            scorer = s.det
    get = s.view or (lambda split_id: run.split_data(scorer, split_id))
    return oosa_threshold(scorer.score(get(ID_VAL)), scorer.score(get(ood_val.id)), s.known.val)


def _validation(run: PreparedRun, det: Detector, base: str, rule: str, view: Any = None) -> dict[str, Any] | None:
    """The unit's metric on ID val against OOD val (rule selection reads it); None without both."""
    plan = run.plan
    ood_val = plan.ood_val
    if ood_val is None or ID_VAL not in run.data or ood_val.id not in run.data:
        return None
    get = view or (lambda split_id: run.split_data(det, split_id))
    metric = plan.select.metric if plan.select else "auroc"
    value = compute_metrics(det.score(get(ID_VAL)), det.score(get(ood_val.id)))[metric]
    sets = sorted({r["ood_set"] for r in ood_val.manifest.rows})
    return {"base": base, "rule": rule, "metric": metric, "value": float(value), "ood_val": ",".join(sets),
            "n_id_val": int(len(run.data[ID_VAL].index)), "n_ood_val": int(len(run.data[ood_val.id].index))}


def _score_all(run: PreparedRun, ctx: UnitContext, s: Scoring) -> tuple[list[dict[str, Any]], list[pd.DataFrame]]:
    """Score ID test, every OOD set and every field set: a row per OOD set (`result_row`) with the fit time in
    `seconds` and the open-set columns, and the per-sample score frames."""
    plan = run.plan
    test = plan.split(ID_TEST)
    id_scores = s.det.score(s.data(run, test.id))
    fit_seconds = time.perf_counter() - s.start
    unit_columns = {"method": s.method, "family": s.family, "mode": s.mode, "protocol": plan.protocol,
                    "checkpoint": plan.checkpoint, "base": s.base, "rule": s.rule, "params": _params_json(s.det),
                    "selected_on": s.selected_on, "id_acc": s.known.accuracy}
    theta = _oosa_threshold(run, ctx, s)
    frames, rows = [_score_frame(run, s, test, "id", "id", id_scores)], []
    for split in (x for x in plan.of_role("ood") if x.id not in run.left_out):
        t0 = time.perf_counter()
        ood_scores = s.det.score(s.data(run, split.id))
        rows.append(result_row(**unit_columns, ood_set=split.name, group=split.group,
                               **compute_metrics(id_scores, ood_scores),
                               **openset_columns(id_scores, ood_scores, s.known, theta, plan.protocol),
                               n_id=len(id_scores), n_ood=len(ood_scores),
                               seconds=fit_seconds + time.perf_counter() - t0))
        frames.append(_score_frame(run, s, split, "ood", split.group or "", ood_scores))
    for split in plan.of_role("field_id", "field_ood"):
        if run.has_rows(split.id):
            frames.append(_score_frame(run, s, split, split.role, "field", s.det.score(s.data(run, split.id))))
    return rows, frames


def _score_frame(run: PreparedRun, s: Scoring, split: Split, role: str, group: str,
                 scores: np.ndarray) -> pd.DataFrame:
    index = run.data[split.id].index
    name = "id" if role == "id" else split.name
    frame = pd.DataFrame({"method": s.method, "family": s.family, "role": role, "ood_set": name, "group": group,
                          "index": np.asarray(index, dtype=np.int64), "score": scores,
                          "file_name": [split.manifest.rows[i]["file_name"] for i in index],
                          "manifest": split.source})
    predicted = run.predicted_names(split.id)
    return frame.assign(**{PREDICTION: predicted}) if predicted is not None else frame


def _transformed(trained: Detector, data: Any) -> Any:
    return None if data is None else trained.transform(data)


def _params_json(det: Detector) -> str:
    """The hyperparameters that ran, as JSON: what the fit settled included (`effective_params`, runtime settings
    already left out), and the runtime inputs some detectors also keep as parameters (CLIP's class names) left out."""
    params = {k: v for k, v in det.effective_params().items() if k not in RUNTIME_INPUTS}
    return json.dumps(params, sort_keys=True, default=str)


def _result(rows: list[dict[str, Any]], frames: list[pd.DataFrame], validation: dict[str, Any] | None) -> UnitResult:
    frames = [f for f in frames if len(f)]
    scores = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=[*SCORE_COLUMNS, *SCORE_OPTIONAL])
    return UnitResult(pd.DataFrame(rows, columns=list(RESULT_COLUMNS)), scores,
                      [validation] if validation is not None else None)


def execute(unit: Unit, work: Callable[[], UnitResult], plan: Plan, ctx: UnitContext,
            failures: dict[str, dict[str, Any]]) -> tuple[UnitResult | None, Detector | None]:
    """Run a unit (`work`) and write it (`ctx.writes`), giving its result (None for a failure, recorded in `failures`)
    and the training model its rules re-score. A unit run together fails on every rank together: a rank that raised
    says so in one exchange (`fail_together`), which the others meet at the collective they are in (`PeerFailed`) or
    at the agreement after the unit, so none waits for a collective another left."""
    error: BaseException | None = None
    found: UnitResult | None = None
    trained: Detector | None = None
    try:
        with contextlib.nullcontext() if ctx.together else alone():
            found = work()
        found, trained = dataclasses.replace(found, trained=None), found.trained  # the model is kept by the caller
    except Exception as err:  # noqa: BLE001 - one failing unit is recorded, the others go on
        if isinstance(err, UnitFailed):
            err, trained = err.error, err.trained
        if ctx.together and is_peer_lost(err) and not isinstance(err, PeerFailed):
            raise PeerLost(peer_line(err, f"unit {unit.method}")) from err
        error = err
    if ctx.together:
        error = _agree(unit, error)
    store = ctx.store
    if error is not None:
        if ctx.writes:
            failures[unit.method] = store.fail(unit.method, unit.key, error)
        log.warning("[oodforge] detector %s failed: %s: %s (see %s)", unit.method, type(error).__name__, error,
                    store.folder(unit.method) / "traceback.txt")
        return None, trained
    if ctx.writes:
        store.write(unit.method, unit.key, found, {"method": unit.method, "kind": unit.kind,
                                                   "key_parts": key_record(unit, plan)})
        clear_kept_batches(store.folder(unit.method) / "work")  # the unit's scores are written: not needed
    return found, trained


def _agree(unit: Unit, error: BaseException | None) -> BaseException | None:
    """One exchange per rank after a unit run together: at the collective where a peer's failure was met, else here
    (this rank's own failure told to the others, or a peer's failure met now). The unit's error as every rank sees
    it."""
    if error is None:
        try:
            all_gather(None, f"unit {unit.method}")
        except PeerFailed as err:
            return err
    elif not isinstance(error, PeerFailed):
        fail_together(f"{type(error).__name__}: {error}", f"unit {unit.method}")
    return error
