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
