"""Named protocols: what each benchmark's reference code ran, per detector (parameter defaults and fits).

`protocol:` in an evaluation config names one; the plan merges it into every unit (a detector's own `params` win) and
every results row names it. docs/references.md lists each difference between `exact` and the reference protocols.
"""
from __future__ import annotations

from typing import Any

PROTOCOLS: dict[str, dict[str, dict[str, Any]]] = {
    # OpenOOD v1.5 (the benchmark papers' tooling): each detector's declared sweep, TempScale's LBFGS temperature fit
    "openood_v1.5": {},
    # the same, with TempScale's exact NLL optimum instead of OpenOOD's under-converged LBFGS step
    "exact": {"tempscale": {"fit": "exact"}},
    # Open-Insect's own code (the species configs' default; its grids and training recipes are filled in separately)
    "open-insects": {},
}
"""`protocol:` -> parameter defaults per detector (a detector's own `params` win)."""

SWEEPS: dict[str, dict[str, dict[str, list[Any]]]] = {
    "openood_v1.5": {},
    "exact": {},
    "open-insects": {},
}
"""`protocol:` -> the sweep grid per detector where it differs from the detector's declared `search_space`."""


def protocol_params(protocol: str, name: str) -> dict[str, Any]:
    """The parameter defaults `protocol` gives detector `name` (a config's own `params` win over them)."""
    return dict(PROTOCOLS[protocol].get(name, {}))


def sweep_space(protocol: str, name: str, declared: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """The grid `protocol` sweeps for detector `name` on OOD validation (`declared`: the class's `search_space`);
    an empty grid means the protocol runs its defaults."""
    return dict(SWEEPS[protocol].get(name, declared))


# -- training-time methods under `open-insects` (helper "trainproto"; sweep grids live above) -------------------------
def _open_insects_training() -> dict[str, dict[str, Any]]:
    """Each training-time method as Open-Insect's trainers ran it: the loop settings of
    `pipelines.training.recipes.TRAINING_PROTOCOLS["open-insects"]` (timm schedule with the step counter, last partial
    batch kept, fp32), MixOE dropping its last batch (`mixoe_trainer.py`), MCD's `start_epoch_ft: 90`
    (`configs/pipelines/train/train_mcd.yml`) and G-ODIN's h in both optimisers (`godin_trainer.py`)."""
    from pipelines.training.recipes import TRAINING_PROTOCOLS

    loop = dict(TRAINING_PROTOCOLS["open-insects"])
    methods = ("arpl", "confbranch", "energy_oe", "extended", "godin", "logitnorm", "mcd", "mixoe", "novel_branch", "oe",
               "rotpred", "udg")
    out = {name: dict(loop) for name in methods}
    out["mixoe"]["drop_last"] = True
    out["mcd"]["start_epoch_ft"] = 90
    out["godin"]["h_optimizer"] = "both"
    return out


for _name, _values in _open_insects_training().items():
    PROTOCOLS.setdefault("open-insects", {}).setdefault(_name, {}).update(_values)
SWEEPS.setdefault("open-insects", {})
