"""Named protocols: what each benchmark's reference code ran, per detector (parameter defaults, fits and sweeps).

`protocol:` in an evaluation config names one; the plan merges it into every unit (a detector's own `params` win) and
every results row names it. docs/references.md lists each difference between `exact` and the reference protocols.
"""
from __future__ import annotations

from typing import Any

from detectors.posthoc.odin import REFERENCE_GRAD_STD

PROTOCOLS: dict[str, dict[str, dict[str, Any]]] = {
    # OpenOOD v1.5 (the benchmark papers' tooling): its postprocessor defaults, TempScale's LBFGS temperature fit
    "openood_v1.5": {"vim": {"default_dim": 256}},  # configs/postprocessors/vim.yml: dim 256
    # Open-Insect (RolnickLab/Open-Insect, an OpenOOD v1.5 fork): its own configs/postprocessors where they differ
    "open-insects": {"vim": {"default_dim": 256}, "neco": {"default_dim": 100},  # vim.yml; neco.yml: dim 100
                     # eval.sh:67 names the region, missing from transform.py:3-12: odin_postprocessor.py:18-21 takes
                     # 0.5
                     "odin": {"grad_std": REFERENCE_GRAD_STD}, "rp_odin": {"grad_std": REFERENCE_GRAD_STD}},
    # OpenOOD v1.5 with the documented corrections: TempScale's exact NLL optimum instead of the under-converged LBFGS
    "exact": {"vim": {"default_dim": 256}, "tempscale": {"fit": "exact"}},
}
"""`protocol:` -> parameter defaults per detector (a detector's own `params` win)."""


# -- sweep grids (APS: ID val against OOD val, AUROC, the tie rule below) -------------------------------------------
# Read from OpenOOD's configs/postprocessors/<name>.yml (Jingkang50/OpenOOD at 3c35632; Open-Insect's copies at e0aa51e
# are the same files unless noted). A postprocessor with `APS_mode: False` (DICE, MDS, RMDS, MSP, MLS, KLM, SHE, MCM,
# GradNorm, RankFeat, OpenMax, TempScale, RP-MSP, RP-GradNorm) runs its defaults: an empty grid here. A one-point grid
# (EBO's temperature [1], MDSEns's noise [0.0014], RP-EBO's temperature [1]) is its default, evaluated on validation.
# A post-hoc detector absent from a table sweeps its declared `search_space` (one the reference never ran: its own grid,
# as APS would), except where the reference ran its defaults without a grid (`DEFAULTS_ONLY`: NECO under openood_v1.5,
# OpenOOD has no neco.yml); the CLIP, generative and training families run their defaults in a run.
# `sweep_space` gives every detector absent from a table its declared `search_space` for `detectors.select`.
_OPENOOD = {
    "ash": {"percentile": [65, 70, 75, 80, 85, 90, 95]},                         # ash.yml
    "dice": {},                                                                   # dice.yml: APS off, p 90
    "ebo": {"temperature": [1]},                                                  # ebo.yml (v1.5 tag: [1, 10, 100,
                                                                                  # 1000])
    "fdbd": {"distance_as_normalizer": [True, False]},                           # fdbd.yml
    "gen": {"gamma": [0.01, 0.1, 0.5, 1, 2, 5, 10], "M": [10, 50, 100, 200, 500, 1000]},  # gen.yml
    "knn": {"k": [50, 100, 200, 500, 1000]},                                      # knn.yml: K_list
    "mdsens": {"noise": [0.0014]},                                                # mds_ensemble.yml
    "nci": {"alpha": [0.0001, 0.001, 0.01, 0.1]},                                 # nci.yml
    "odin": {"temperature": [1, 10, 100, 1000], "noise": [0.0014, 0.0028]},      # odin.yml (on images)
    "react": {"percentile": [85, 90, 95, 99]},                                    # react.yml
    # vim.yml sweeps dim [256, 1000], but OpenOOD's ViM computes its principal space once in setup() at the default
    # (setup_flag) and set_hyperparam() only relabels it: every point scores alike, as at 256 (the search's last-maximum
    # rule then labels the run 1000, vim_postprocessor.py:71-72; its scores stay those of 256).
    "vim": {},
    "rp_ebo": {"temperature": [1]},                                               # Open-Insect rp_ebo.yml
    "rp_odin": {"temperature": [1, 10, 100, 1000], "noise": [0.0014, 0.0028]},   # Open-Insect rp_odin.yml (images)
    # gram.yml's powers_list [[1, 2, 3, 4, 5]] is its default powers: none of ours to sweep
    **{name: {} for name in ("mds", "rmds", "msp", "mls", "klm", "she", "gradnorm", "rankfeat", "openmax", "tempscale",
                             "gram", "mcm", "rp_msp", "rp_gradnorm")},
}
SWEEPS: dict[str, dict[str, dict[str, list[Any]]]] = {
    "openood_v1.5": _OPENOOD,
    "open-insects": {**_OPENOOD,
                     "react": {"percentile": [10, 65, 85, 90, 95, 99]},           # Open-Insect react.yml
                     "neco": {"dim": [100, 200, 300, 400]}},                      # Open-Insect neco.yml
    # correction: ViM refitted at every point of vim.yml's grid (OpenOOD's sweep never refits, see above)
    "exact": {**_OPENOOD, "vim": {"dim": [256, 1000]}},
}
"""`protocol:` -> the sweep grid per detector where it differs from the detector's declared `search_space`."""

DEFAULTS_ONLY: dict[str, frozenset[str]] = {"openood_v1.5": frozenset({"neco"}), "exact": frozenset({"neco"})}
"""`protocol:` -> the post-hoc detectors absent from its `SWEEPS` table that a run does not sweep (the reference's
defaults)."""

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

for _name, _values in _open_insects_training().items():
    PROTOCOLS["open-insects"].setdefault(_name, {}).update(_values)
for _protocol, _choice in CHECKPOINTS.items():  # the fine-tunes score with the protocol's checkpoint
    if _choice != "last":
        for _name in TRAINING_METHODS:
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
