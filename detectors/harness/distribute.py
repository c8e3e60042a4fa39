"""Which process runs which unit: under `accelerate launch` / `torchrun`, each unit runs on one rank, chosen the same
way on every rank from the plan alone, so N processes do about 1/N of the units each.

A unit runs on every rank together (`EVERY`) only where that pays: a training-time or prompt-learning detector
trains under accelerate on all processes at once (`Detector.trains_across_processes`), the few-shot sweep trains
prompts the same way, and a detector whose statistics are sums (`fits_from_shards`) fits per-process shards when the
ID train set has at least `shard_fit_rows` rows (each rank then reads 1/N of a paper-scale memory-mapped cache). A
rule unit runs where its training unit runs (it re-scores that trained model).

The other units are dealt largest first to the least loaded rank (longest processing time first), by a fixed cost
per family (`FAMILY_COST`, times `IMAGE_COST` for a detector that reads images, times the sweep's grid points for a
`select` unit): the assignment depends on the plan, the pending units and the process count only, never on timing,
so every rank computes the same one.
"""
from __future__ import annotations

import math
from collections.abc import Iterable

from detectors.harness.plan import Unit
from detectors.harness.runconfig import SHARD_FIT_ROWS
from detectors.registry import FAMILIES

EVERY = -1  # a unit every rank runs together
FAMILY_COST = dict.fromkeys(FAMILIES, 1.0) | {"clip": 4.0, "generative": 20.0, "training": 20.0}  # relative
IMAGE_COST = 10.0  # times a family's cost for a detector that reads images (ODIN, GRAM: a model pass per set)


def collective(unit: Unit, train_rows: int, shard_fit_rows: int = SHARD_FIT_ROWS) -> bool:
    """True when `unit` runs on every rank together (module docstring); a rule unit follows its parent."""
    if unit.kind == "fewshot":
        return True
    if unit.kind == "rule" and unit.parent is not None:
        return collective(unit.parent, train_rows, shard_fit_rows)
    cls = unit.detector
    if cls is None:
        return False
    return cls.trains_across_processes or (cls.fits_from_shards and train_rows >= shard_fit_rows)


def unit_cost(unit: Unit) -> float:
    """A unit's relative cost for dealing units out (`FAMILY_COST`, times the grid points of a sweep)."""
    cls = unit.detector
    cost = FAMILY_COST.get(cls.family if cls is not None else "clip", 1.0)
    if cls is not None and "images" in getattr(cls, "inputs", ()):
        cost *= IMAGE_COST
    if unit.kind == "select":
        grid = unit.parts.get("sweep") or {}
        cost *= max(1, math.prod(len(v) for v in grid.values()) if isinstance(grid, dict) else 1)
    return cost


def assign(units: Iterable[Unit], pending: set[str], processes: int, train_rows: int,
           shard_fit_rows: int = SHARD_FIT_ROWS) -> dict[str, int]:
    """The rank of every pending unit (`EVERY`: all together). A training unit and its rules form one group, kept on
    one rank; groups are dealt largest first (ties in plan order) to the least loaded rank (ties: the lowest)."""
    groups: dict[str, list[Unit]] = {}
    for unit in units:
        if unit.method in pending:
            head = unit.parent.method if unit.kind == "rule" and unit.parent is not None else unit.method
            groups.setdefault(head, []).append(unit)
    where: dict[str, int] = {}
    solo: list[tuple[float, int, list[Unit]]] = []
    for order, members in enumerate(groups.values()):
        if processes > 1 and any(collective(u, train_rows, shard_fit_rows) for u in members):
            where.update({u.method: EVERY for u in members})
        else:
            solo.append((sum(unit_cost(u) for u in members), order, members))
    load = [0.0] * max(processes, 1)
    for cost, _, members in sorted(solo, key=lambda group: (-group[0], group[1])):
        rank = min(range(len(load)), key=lambda r: (load[r], r))
        load[rank] += cost
        where.update({u.method: rank for u in members})
    return where
