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
}
"""`protocol:` -> parameter defaults per detector (a detector's own `params` win)."""
