"""Named protocols: what each benchmark's reference code ran, per detector (parameter defaults, fits and sweeps).

`protocol:` in an evaluation config names one; the plan merges it into every unit (a detector's own `params` win) and
every results row names it. docs/references.md lists each difference between `exact` and the reference protocols.
"""
from __future__ import annotations

from typing import Any

from detectors.registry import available, detector_class

PARENTS: dict[str, str | None] = {
    "openood_v1.5": None,  # OpenOOD v1.5 (the benchmark papers' tooling): its postprocessors' defaults and YAML grids
    "open-insects": "openood_v1.5",  # Open-Insect (RolnickLab/Open-Insect, an OpenOOD v1.5 fork): its own configs
    "exact": "openood_v1.5",  # OpenOOD v1.5 with the documented corrections (docs/references.md)
}
"""The protocols, each with the protocol whose entries it takes where a detector class names none for it (a
detector's `grids` and `protocol_defaults`)."""


def _entry(table: dict[str, object], protocol: str) -> tuple[bool, object]:
    """(found, value) of `protocol` in a class's per-protocol `table`, else of its parents in turn."""
    while protocol is not None:
        if protocol in table:
            return True, table[protocol]
        protocol = PARENTS[protocol]
    return False, None


def _classes() -> list[type]:
    """Every registered detector class; ValueError when one names a protocol that does not exist."""
    classes = [detector_class(name) for name in available()]
    for cls in classes:
        unknown = (set(cls.grids) | set(cls.protocol_defaults)) - set(PARENTS)
        if unknown:
            raise ValueError(f"{cls.__module__}.{cls.__name__}: unknown protocol(s) {sorted(unknown)} in grids / "
                             f"protocol_defaults; known: {sorted(PARENTS)}")
    return classes


PROTOCOLS: dict[str, dict[str, dict[str, Any]]] = {
    protocol: {cls.name: dict(value) for cls in _classes()
               for found, value in [_entry(cls.protocol_defaults, protocol)] if found}
    for protocol in PARENTS}
"""`protocol:` -> parameter defaults per detector (a detector's own `params` win), read from the classes'
`protocol_defaults`; the training-time loop settings are added below."""


# -- sweep grids (APS: ID val against OOD val, AUROC, the tie rule below) -------------------------------------------
# Each class declares the grid its reference runs: `search_space` (OpenOOD's configs/postprocessors/<name>.yml,
# Jingkang50/OpenOOD at 3c35632; a method OpenOOD lacks: its own grid, as APS would), and `grids` where a protocol's
# reference runs another (Open-Insect's copies at e0aa51e where they differ). A postprocessor with `APS_mode: False`
# (DICE, MDS, RMDS, MSP, MLS, KLM, SHE, MCM, GradNorm, RankFeat, OpenMax, TempScale, RP-MSP, RP-GradNorm) declares
# none: its defaults run. A one-point grid (EBO's temperature [1], MDSEns's noise [0.0014], RP-EBO's temperature [1])
# is its default, evaluated on validation. A `None` grid (NECO under openood_v1.5: OpenOOD has no neco.yml) runs the
# defaults while `detectors.select` still sweeps the declared `search_space`; the CLIP, generative and training
# families run their defaults in a run unless a class lists a grid.
def _sweeps(protocol: str) -> tuple[dict[str, dict[str, list[Any]]], frozenset[str]]:
    table, defaults_only = {}, set()
    for cls in _classes():
        found, grid = _entry(cls.grids, protocol)
        if found and grid is None:
            defaults_only.add(cls.name)
        elif found or cls.family == "posthoc":
            table[cls.name] = {k: list(v) for k, v in (grid if found else cls.search_space).items()}
    return table, frozenset(defaults_only)


SWEEPS: dict[str, dict[str, dict[str, list[Any]]]] = {protocol: _sweeps(protocol)[0] for protocol in PARENTS}
"""`protocol:` -> the sweep grid per detector, read from the classes (`search_space`, `grids`)."""

DEFAULTS_ONLY: dict[str, frozenset[str]] = {protocol: _sweeps(protocol)[1] for protocol in PARENTS}
"""`protocol:` -> the post-hoc detectors absent from its `SWEEPS` table that a run does not sweep (the reference's
defaults; a `None` grid on the class)."""

TIE_RULES: tuple[str, ...] = ("last", "first")
"""Which of several grid points equal to the best metric a sweep keeps. `last`: the reference's run,
`OODEvaluator.hyperparam_search` (Open-Insect src/openood/evaluators/ood_evaluator.py:421-425; OpenOOD
openood/evaluators/ood_evaluator.py:258-262) sets every point equal to the maximum in turn, so the last one sticks;
`first`: OpenOOD's unified `Evaluator.hyperparam_search` (openood/evaluation_api/evaluator.py:418-422, `auroc >
max_auroc` keeps a `final_index`)."""

TIES: dict[str, str] = {
    # Open-Insect's eval.sh runs scripts/main.py -> TestOODPipeline -> OODEvaluator.eval_ood (configs/pipelines/test/
    # test_ood.yml: evaluator ood), whose hyperparam_search (src/openood/evaluators/ood_evaluator.py:388-427) notes
    # the maximum with `>` (:421), then sets every point equal to it in turn (:423-425): the last maximum sticks
    "open-insects": "last",
    # OpenOOD's main.py pipelines run the same code (openood/evaluators/ood_evaluator.py:258-262); its unified
    # Evaluator (openood/evaluation_api/evaluator.py:418-422, scripts/eval_ood.py) keeps the first: `select.ties: first`
    "openood_v1.5": "last",
    "exact": "last",  # no correction: the reference protocol's rule
}
"""`protocol:` -> which of several grid points tied at the best validation metric the sweep keeps
(`TIE_RULES`; `select.ties` in a config overrides it)."""
# -- end of sweep grids
# -------------------------------------------------------------------------------------------------


# -- which checkpoint of a trained classifier the protocol evaluates -------------------------------------------------
CHECKPOINTS: dict[str, str] = {
    # OpenOOD v1.5's evaluation loads each training run's best.ckpt (scripts/eval_ood.py:147), the file its recorder
    # keeps for the best ID-val accuracy (openood/recorders/base_recorder.py:40-50)
    "openood_v1.5": "best",
    # Open-Insect's eval.sh:71 loads `$WEIGHT_DIR/${METHOD}_${REGION}.pth`, the released weights
    # (download_pretrained_weights.py:15-33 copies them under their own names), so its code does not say which epoch
    # they are; its recorder keeps best.ckpt and last_epoch<N>_acc<a>.ckpt (src/openood/recorders/base_recorder.py:
    # 40-62) and the configs it inherits point `network.checkpoint` at best.ckpt
    # (configs/networks/resnet18_32x32.yml:5):
    # the best, as OpenOOD's own evaluation
    "open-insects": "best",
    "exact": "last",  # no epoch chosen on ID val: the weights training ends with
}
"""`protocol:` -> the checkpoint (`last` | `best`, pipelines.training.loop.CHECKPOINT_CHOICES) of a trained classifier
folder the evaluation loads and the training-time methods' fine-tunes score with (config `checkpoint:` and a training
detector's `params.checkpoint` override it)."""


def protocol_params(protocol: str, name: str) -> dict[str, Any]:
    """The parameter defaults `protocol` gives detector `name` (a config's own `params` win over them)."""
    return dict(PROTOCOLS[protocol].get(name, {}))


def sweep_space(protocol: str, name: str, declared: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """The grid `protocol` sweeps for detector `name` on OOD validation (`declared`: the class's `search_space`);
    an empty grid means the protocol runs its defaults."""
    return {k: list(v) for k, v in SWEEPS[protocol].get(name, declared).items()}


def unit_sweep(protocol: str, cls: type, has_ood_val: bool, given: Any = ()) -> dict[str, list[Any]]:
    """The grid a unit of detector class `cls` sweeps under `protocol`; empty = its defaults run.

    Only with OOD validation rows (`has_ood_val`), only for detectors in the protocol's table (`SWEEPS`: the reference's
    post-hoc postprocessors) or post-hoc detectors absent from it (their declared `search_space`, unless
    `DEFAULTS_ONLY`; training-time methods, CLIP prompt learners and OpenGAN would retrain per point), and the keys a
    config's own `params` give (`given`) are fixed, not swept. A one-point grid (EBO's [1]) still runs, as OpenOOD's APS
    does: its row in `selection/<method>.csv` records the validation metric."""
    listed = cls.name in SWEEPS[protocol]
    own = cls.family == "posthoc" and cls.name not in DEFAULTS_ONLY.get(protocol, frozenset())
    if not has_ood_val or not (listed or own):  # the table, or a post-hoc detector's own grid (never training, CLIP)
        return {}
    return {k: v for k, v in sweep_space(protocol, cls.name, cls.search_space).items() if k not in set(given)}


# -- training-time methods under `open-insects` (sweep grids live above) ---------------------------------------------
def _open_insects_training() -> dict[str, dict[str, Any]]:
    """Each training-time method as Open-Insect's trainers ran it: the loop settings of
    `pipelines.training.recipes.TRAINING_PROTOCOLS["open-insects"]` (timm schedule with the step counter, last partial
    batch kept, fp32), MixOE dropping its last batch (`mixoe_trainer.py`), MCD's `start_epoch_ft: 90`
    (`configs/pipelines/train/train_mcd.yml`) and G-ODIN's h in both optimisers (`godin_trainer.py`)."""
    from pipelines.training.recipes import TRAINING_PROTOCOLS

    loop = dict(TRAINING_PROTOCOLS["open-insects"])
    out = {name: dict(loop) for name in TRAINING_METHODS}
    out["mixoe"]["drop_last"] = True
    out["mcd"]["start_epoch_ft"] = 90
    out["godin"]["h_optimizer"] = "both"
    return out


TRAINING_METHODS = ("arpl", "confbranch", "energy_oe", "extended", "godin", "logitnorm", "mcd", "mixoe", "novel_branch",
                    "oe", "rotpred", "udg")
"""The training-time methods the reference protocols fine-tune (their settings above)."""
OPENOOD_TRAINERS = ("augmix", "cider", "cutmix", "ish", "mixup", "palm", "regmixup", "reweightood", "t2fnorm",
                    "vos")
"""Training-time methods from OpenOOD's trainers alone (no Open-Insect recipe): they take only the protocols' scored
checkpoint (OpenOOD's `scripts/eval_ood.py:147` loads `best.ckpt`)."""
LAST_EPOCH_METHODS = ("cider", "palm", "reweightood")
"""Methods scored with the last epoch under every protocol: no classifier loss, so no ID-val accuracy to choose by
(the reference's `CiderRecorder` / `PALMRecorder`, named by their train configs, keep the lowest training-loss epoch,
`openood/recorders/cider_recorder.py:35-50`, `palm_recorder.py:27-45`)."""

for _name, _values in _open_insects_training().items():
    PROTOCOLS["open-insects"].setdefault(_name, {}).update(_values)
for _protocol, _choice in CHECKPOINTS.items():  # the fine-tunes score with the protocol's checkpoint
    if _choice != "last":
        for _name in set(TRAINING_METHODS + OPENOOD_TRAINERS) - set(LAST_EPOCH_METHODS):
            PROTOCOLS[_protocol].setdefault(_name, {})["checkpoint"] = _choice


# -- the open-set columns (detectors.openset_metrics) ----------------------------------------------------------------
ZERO_THRESHOLD_MISSING: dict[str, bool] = {
    # Open-Insect's compute_all_metrics computes OSA and OOSA only `if theta:` (src/openood/evaluators/metrics.py:139),
    # so an OOSA threshold of exactly 0 chosen on validation reports both as -1 (NaN here)
    "open-insects": True,
    "openood_v1.5": True,  # OpenOOD has no OSA: Open-Insect's evaluator is the reference of these columns
    "exact": False,  # correction: OSA and OOSA computed at a zero threshold too
}
"""`protocol:` -> whether an OOSA threshold of exactly 0 leaves OSA and OOSA missing, as the reference's `if theta:`."""

OOSA_SCORER: dict[str, str] = {
    # Open-Insect's OODEvaluator.eval_ood picks the OOSA threshold (ood_evaluator.py:102-113) before its APS sweep
    # (:126-131): with the postprocessor at its config's defaults, not at the point the sweep then chooses
    "open-insects": "defaults",
    "openood_v1.5": "defaults",  # OpenOOD has no OOSA: Open-Insect's evaluator is the reference of these columns
    "exact": "selected",  # correction: the threshold of the scores the row reports
}
"""`protocol:` -> which scorer of a swept unit picks its OOSA threshold on validation: `defaults` (the unit's
parameters before the sweep, fitted once more) or `selected` (the chosen point's). Units without a sweep have one."""
