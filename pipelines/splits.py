"""Seeded stratified splits with exact per-stratum counts (the importers' `--split 4:1:5 --stratify a,b`).

Rule: the rows of each stratum (one combination of the stratify values) are shuffled with a generator seeded by
(seed, stratum), then cut in split order by the stratum's quotas. Quotas follow the largest-remainder rule: split k
gets floor(n * r_k / R); the rows left over go one each to the splits with the largest fractional parts (ties: split
order). So a stratum of n rows gets exactly n rows in all, each split within one row of its share; e.g. n = 7 at 4:1:5
gives 3 / 1 / 3 (shares 2.8 / 0.7 / 3.5). A stratum with fewer rows than splits of non-zero ratio is an error.
"""
from __future__ import annotations

import hashlib
from collections.abc import Hashable, Sequence

import numpy as np

from pipelines.errors import UserInputError

SPLIT_NAMES = ("train", "val", "test")


class SplitError(UserInputError):
    """A split that cannot be made (bad ratio, a stratum too small); names the stratum."""


def parse_ratio(text: str) -> tuple[float, float, float]:
    """'4:1:5' -> (4, 1, 5) for (train, val, test); two values mean no val split ('8:2' -> 8, 0, 2)."""
    try:
        values = [float(v) for v in str(text).split(":")]
    except ValueError:
        raise SplitError(f"--split takes TRAIN:VAL:TEST ratios such as 4:1:5, got {text!r}") from None
    if len(values) == 2:
        values = [values[0], 0.0, values[1]]
    if len(values) != 3 or min(values) < 0 or sum(values) <= 0:
        raise SplitError(f"--split takes three non-negative ratios TRAIN:VAL:TEST such as 4:1:5, got {text!r}")
    return values[0], values[1], values[2]


def quotas(n: int, ratio: Sequence[float]) -> list[int]:
    """Rows per split of a stratum of n rows by the largest-remainder rule."""
    total = float(sum(ratio))
    shares = [n * r / total for r in ratio]
    counts = [int(np.floor(s)) for s in shares]
    order = sorted(range(len(ratio)), key=lambda k: (-(shares[k] - counts[k]), k))
    for k in order[: n - sum(counts)]:
        counts[k] += 1
    return counts


def stratified_split(strata: Sequence[Hashable], ratio: Sequence[float], seed: int = 0,
                     names: Sequence[str] = SPLIT_NAMES) -> list[str]:
    """The split name of every row, given each row's stratum key."""
    needed = sum(1 for r in ratio if r > 0)
    groups: dict[Hashable, list[int]] = {}
    for i, key in enumerate(strata):
        groups.setdefault(key, []).append(i)
    out = [""] * len(strata)
    for key, rows in groups.items():
        if len(rows) < needed:
            raise SplitError(f"stratum {key!r} has {len(rows)} image(s), fewer than the {needed} splits with a "
                             "non-zero "
                             f"ratio {':'.join(f'{r:g}' for r in ratio)}; merge it, drop it or stratify by fewer "
                             "fields")
        digest = hashlib.sha256(f"{seed}:{key!r}".encode()).digest()
        order = np.random.default_rng(int.from_bytes(digest[:8], "little")).permutation(len(rows))
        start = 0
        for name, count in zip(names, quotas(len(rows), ratio)):
            for j in order[start: start + count]:
                out[rows[j]] = name
            start += count
    return out
