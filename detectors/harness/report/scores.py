"""Tables computed from the runner's per-sample scores (`scores.parquet`): bootstrap intervals, AUROC per taxonomic
hop, the field report per novel species and the most ID-looking OOD images.

Scores: higher = more in-distribution; an image is flagged OOD iff score < threshold (`detectors.metrics`). Roles are
`detectors.harness.results.SCORE_ROLES`. Metadata of a row (`hop`, `species`, its image) comes from the manifest it was
read from, through the optional `file_name` / `manifest` columns (`detectors.harness.results.SCORE_OPTIONAL`).
"""
from __future__ import annotations

import os
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from detectors.harness.report.tables import group_labels, read_table
from detectors.harness.results import PREDICTION, SCORE_COLUMNS, SCORE_OPTIONAL, SCORE_ROLES
from detectors.metrics import auroc, evaluate
from detectors.training.field import species_detection_share
from pipelines.data import Manifest, read_manifest
from pipelines.errors import UserInputError

HOP_LABELS = {1: "same genus", 2: "same family", 3: "farther"}
"""`hop` of an OOD row (gen.insects): 1 its genus holds an ID species, 2 its family does, 3 neither."""


def read_scores(source: pd.DataFrame | str | os.PathLike) -> pd.DataFrame:
    """The runner's per-sample scores table (`SCORE_COLUMNS`, optionally `SCORE_OPTIONAL`), every role accepted."""
    frame = read_table(source, SCORE_COLUMNS, "scores table")
    frame["role"] = frame["role"].astype(str)
    roles = set(frame["role"].unique()) - set(SCORE_ROLES)
    if roles:
        raise UserInputError(f"scores table: column 'role' must be one of {list(SCORE_ROLES)}, found {sorted(roles)}")
    frame["group"] = group_labels(frame["group"])
    frame["method"] = frame["method"].astype(str)
    frame["ood_set"] = frame["ood_set"].astype(str)
    frame["score"] = frame["score"].astype(np.float64)
    return frame


def has_sources(scores: pd.DataFrame) -> bool:
    """Whether every row names its image: the `file_name` and `manifest` columns are present and filled (checked
    once per distinct value)."""
    for c in SCORE_OPTIONAL:
        if c not in scores.columns or scores[c].isna().any():
            return False
        if not all(str(v).strip() for v in scores[c].unique()):
            return False
    return True


def _manifest(folder: str, base: Path | None, memo: dict[str, Manifest]) -> Manifest:
    """The manifest `folder` names: as given, else relative to the run folder `base` or one of its parents (a
    config's relative paths are relative to where the run was started)."""
    if folder not in memo:
        path = Path(folder)
        roots = [] if path.is_absolute() or base is None else [base, *base.resolve().parents]
        found = next((r / path for r in roots if (r / path / "metadata.jsonl").is_file()), path)
        memo[folder] = read_manifest(path if (path / "metadata.jsonl").is_file() else found)
    return memo[folder]


def _objects(values: list) -> np.ndarray:
    """`values` as a 1-D object array (a list value stays one element)."""
    out = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        out[i] = value
    return out


def attach_metadata(scores: pd.DataFrame, fields: Sequence[str], base: str | os.PathLike | None = None) -> pd.DataFrame:
    """`scores` with the manifest fields `fields` of each row, and `path` (its image), joined on (manifest, file_name).

    A relative `manifest` is read from the working folder, else from `base` (the run folder) or one of its parents.
    Needs `has_sources`. Each manifest row is looked up once, however many methods scored it.
    """
    if not has_sources(scores):
        raise UserInputError(f"scores table: the columns {list(SCORE_OPTIONAL)} are needed to find each row's image")
    memo: dict[str, Manifest] = {}
    out = scores.copy()
    columns = {f: np.full(len(out), None, dtype=object) for f in (*fields, "path")}
    for folder, positions in out.groupby(out["manifest"].astype(str), sort=False).indices.items():
        manifest = _manifest(folder, Path(base) if base is not None else None, memo)
        codes, names = pd.factorize(out["file_name"].to_numpy()[positions].astype(str))
        lookup = {r["file_name"]: i for i, r in enumerate(manifest.rows)}  # a repeated name: its last row, as before
        found = np.array([lookup.get(n, -1) for n in names], dtype=np.int64)
        if (found < 0).any():
            raise UserInputError(f"scores table: file {names[np.flatnonzero(found < 0)[0]]!r} is not in the manifest "
                                 f"{folder}")
        at = found[codes]
        used, inverse = np.unique(at, return_inverse=True)
        rows = [manifest.rows[i] for i in used]
        for f in fields:
            columns[f][positions] = _objects([r.get(f) for r in rows])[inverse]
        columns["path"][positions] = _objects([str(manifest.path(r)) for r in rows])[inverse]
    for name, values in columns.items():
        out[name] = values
    return out


# -- bootstrap intervals ----------------------------------------------------------------------------------------------
def _seed(seed: int, *names: str) -> np.random.SeedSequence:
    return np.random.SeedSequence([seed, *(zlib.crc32(n.encode()) for n in names)])


def resampled_metrics(id_scores: np.ndarray, ood_scores: np.ndarray, id_idx: np.ndarray,
                      ood_idx: np.ndarray) -> dict[str, np.ndarray]:
    """AUROC and FPR@95 (fractions, `detectors.metrics` conventions, exact with ties) of each bootstrap replicate.

    Replicate b uses `id_scores[id_idx[b]]` and `ood_scores[ood_idx[b]]`; computed at once from per-replicate counts
    over the pooled distinct score values (ascending), so a replicate costs O(distinct values), not a sort.
    """
    values, inverse = np.unique(np.concatenate([id_scores, ood_scores]), return_inverse=True)
    n_id, n_ood, n_values, reps = id_idx.shape[1], ood_idx.shape[1], len(values), len(id_idx)
    offsets = (np.arange(reps) * n_values)[:, None]

    def counts(positions: np.ndarray) -> np.ndarray:
        flat = np.bincount((positions + offsets).ravel(), minlength=reps * n_values)
        return flat.reshape(reps, n_values).astype(np.float64)

    c_id = counts(inverse[: len(id_scores)][id_idx])
    c_ood = counts(inverse[len(id_scores):][ood_idx])
    id_below = np.cumsum(c_id, axis=1) - c_id
    area = (c_ood * (id_below + 0.5 * c_id)).sum(axis=1) / (n_id * n_ood)
    # OOD positive, ranked by -score: the ROC walks the distinct values upwards; FPR@95 = ID share at or below the
    # first value where >= 95% of OOD is at or below it
    first = np.argmax(np.cumsum(c_ood, axis=1) / n_ood >= 0.95 - 1e-12, axis=1)
    fpr95 = np.cumsum(c_id, axis=1)[np.arange(reps), first] / n_id
    return {"auroc": 1.0 - area, "fpr95": fpr95}


def bootstrap_interval(id_scores: np.ndarray, ood_scores: np.ndarray, n: int, rng: np.random.Generator,
                       level: float = 0.95, memory: int = 4_000_000) -> dict[str, tuple[float, float]]:
    """Percentile `level` intervals of AUROC and FPR@95 (fractions) over `n` replicates that resample the ID and the
    OOD scores independently, with replacement; replicates run in blocks of about `memory` counts."""
    width = max(len(id_scores) + len(ood_scores), 1)
    block = max(1, min(n, memory // width))
    draws: dict[str, list[np.ndarray]] = {"auroc": [], "fpr95": []}
    for start in range(0, n, block):
        reps = min(block, n - start)
        id_idx = rng.integers(0, len(id_scores), size=(reps, len(id_scores)))
        ood_idx = rng.integers(0, len(ood_scores), size=(reps, len(ood_scores)))
        for k, v in resampled_metrics(id_scores, ood_scores, id_idx, ood_idx).items():
            draws[k].append(v)
    tail = (1.0 - level) / 2 * 100
    return {k: tuple(np.percentile(np.concatenate(v), [tail, 100 - tail])) for k, v in draws.items()}


def bootstrap_table(scores: pd.DataFrame, n: int, seed: int = 0, level: float = 0.95) -> pd.DataFrame:
    """Per (method, test OOD set): AUROC and FPR@95 in percent with their bootstrap `level` interval.

    Columns `method, family, ood_set, group, auroc, auroc_lo, auroc_hi, fpr95, fpr95_lo, fpr95_hi, n_id, n_ood,
    n_boot`. Point values are computed from the scores; each (method, set) draws from its own stream seeded by
    (`seed`, method, set), so the intervals do not depend on which other methods are reported.
    """
    if n < 1:
        raise UserInputError(f"--bootstrap: the number of replicates must be >= 1, got {n}")
    rows = []
    for method, frame in scores.groupby("method", sort=False):
        id_scores = frame.loc[frame["role"] == "id", "score"].to_numpy(np.float64)
        ood = frame[frame["role"] == "ood"]
        for ood_set, part in ood.groupby("ood_set", sort=False):
            ood_scores = part["score"].to_numpy(np.float64)
            point = evaluate(id_scores, ood_scores)
            rng = np.random.default_rng(_seed(seed, method, ood_set))
            interval = bootstrap_interval(id_scores, ood_scores, n, rng, level)
            row = {"method": method, "family": part["family"].iloc[0], "ood_set": ood_set,
                   "group": part["group"].iloc[0]}
            for metric in ("auroc", "fpr95"):
                lo, hi = interval[metric]
                row.update({metric: point[metric] * 100, f"{metric}_lo": lo * 100, f"{metric}_hi": hi * 100})
            rows.append({**row, "n_id": len(id_scores), "n_ood": len(ood_scores), "n_boot": n})
    return pd.DataFrame(rows)


# -- species: AUROC per hop and the field report per novel species ---------------------------------------------------
def _positions(scores: pd.DataFrame) -> dict[tuple[str, str, str], np.ndarray]:
    """Row positions per (method, role, ood_set), in one pass."""
    return scores.groupby(["method", "role", "ood_set"], sort=False).indices


def _id_key(positions: dict[tuple[str, str, str], np.ndarray], method: str) -> np.ndarray:
    found = [p for (m, role, _), p in positions.items() if m == method and role == "id"]
    return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)


def hop_table(scores: pd.DataFrame) -> pd.DataFrame:
    """AUROC (percent) of ID test against the OOD rows of each hop, per (method, OOD set) and pooled over the sets.

    `scores` carries a `hop` column (`attach_metadata`). Columns `method, family, ood_set, hop, distance, auroc, n_id,
    n_ood`; `ood_set` is `all` for the pooled rows; OOD rows without a hop in `HOP_LABELS` are left out.
    """
    values = scores["score"].to_numpy(np.float64)
    hops = pd.to_numeric(scores["hop"], errors="coerce").to_numpy(np.float64)
    families = scores["family"].to_numpy()
    positions = _positions(scores)
    rows = []
    for method in scores["method"].unique():
        ids = _id_key(positions, method)
        id_scores = values[ids]
        sets = [(s, p) for (m, role, s), p in positions.items() if m == method and role == "ood"]
        pooled = np.concatenate([p for _, p in sets]) if sets else np.zeros(0, dtype=np.int64)
        for ood_set, part in [*sets, ("all", pooled)]:
            for hop in HOP_LABELS:
                chosen = part[hops[part] == hop]
                if not len(chosen) or not len(id_scores):
                    continue
                rows.append({"method": method, "family": families[ids[0]] if len(ids) else families[chosen[0]],
                             "ood_set": ood_set, "hop": hop, "distance": HOP_LABELS[hop],
                             "auroc": auroc(id_scores, values[chosen]) * 100, "n_id": len(id_scores),
                             "n_ood": len(chosen)})
    return pd.DataFrame(rows, columns=["method", "family", "ood_set", "hop", "distance", "auroc", "n_id", "n_ood"])


def species_field_table(scores: pd.DataFrame, transfer: pd.DataFrame) -> pd.DataFrame:
    """Open-Insects' Table 6 per novel species: for each threshold-transfer row whose target is a field set, each novel
    species' images, how many are flagged (score < the transferred threshold), `any` (>= 1 flagged) and `majority`
    (more than half flagged), from `detectors.training.field.species_detection_share`.

    `scores` carries a `species` column (`attach_metadata`). Columns `method, source, target, tpr, threshold, species,
    images, flagged, share, any, majority`.
    """
    novel = scores[scores["role"] == "field_ood"]
    rows = []
    for _, rule in transfer[transfer["target"].isin(novel["ood_set"].unique())].iterrows():
        part = novel[(novel["method"] == rule["method"]) & (novel["ood_set"] == rule["target"])]
        part = part[part["species"].notna()]
        if part.empty:
            continue
        result = species_detection_share(part["score"].to_numpy(), part["species"], float(rule["threshold"]))
        images = part["species"].value_counts()
        for name, share in result["per_species"].items():
            count = int(images[name])
            rows.append({"method": rule["method"], "source": rule["source"], "target": rule["target"],
                         "tpr": rule.get("tpr", np.nan), "threshold": float(rule["threshold"]), "species": name,
                         "images": count, "flagged": int(round(share * count)), "share": share * 100,
                         "any": share > 0, "majority": share > 0.5})
    return pd.DataFrame(rows, columns=["method", "source", "target", "tpr", "threshold", "species", "images", "flagged",
                                       "share", "any", "majority"])


def species_summary(per_species: pd.DataFrame) -> pd.DataFrame:
    """Per (method, source, target): novel species and images, images flagged, and in percent the image share flagged
    and the species shares with any / a majority of images flagged."""
    keys = ["method", "source", "target"]
    grouped = per_species.groupby(keys, sort=False)
    out = grouped.agg(species=("species", "size"), images=("images", "sum"), flagged=("flagged", "sum"),
                      any=("any", "mean"), majority=("majority", "mean")).reset_index()
    out["images_flagged"] = out["flagged"] / out["images"] * 100
    out["any"], out["majority"] = out["any"] * 100, out["majority"] * 100
    return out[[*keys, "species", "images", "flagged", "images_flagged", "any", "majority"]]


# -- the most ID-looking OOD images -----------------------------------------------------------------------------------
def id_looking_table(scores: pd.DataFrame, k: int) -> pd.DataFrame:
    """Per (OOD set, method): the `k` OOD images with the highest scores (the most ID-looking), best first.

    Columns `ood_set, method, rank, score, id_share, file_name, manifest` (+ `pred`, `species`, `path` when
    present);
    `id_share` is the percent of ID test scores below the image's score (100: it looks more ID than every ID test
    image). Ties keep the table's order.
    """
    extra = [c for c in (*SCORE_OPTIONAL, PREDICTION, "species", "path") if c in scores.columns]
    values = scores["score"].to_numpy(np.float64)
    positions = _positions(scores)
    picked, shares, keys = [], [], []
    for method in scores["method"].unique():
        id_scores = np.sort(values[_id_key(positions, method)])
        for (m, role, ood_set), part in positions.items():
            if m != method or role != "ood":
                continue
            top = part[np.argsort(-values[part], kind="stable")[:k]]
            picked.append(top)
            shares.append(np.searchsorted(id_scores, values[top], side="left") / max(len(id_scores), 1) * 100)
            keys.append((ood_set, method, len(top)))
    if not picked:
        return pd.DataFrame()
    rows = np.concatenate(picked)
    sizes = [n for *_, n in keys]
    return pd.DataFrame({"ood_set": np.repeat([s for s, _, _ in keys], sizes),
                         "method": np.repeat([m for _, m, _ in keys], sizes),
                         "rank": np.concatenate([np.arange(1, n + 1) for n in sizes]), "score": values[rows],
                         "id_share": np.concatenate(shares), **{c: scores[c].to_numpy()[rows] for c in extra}})


def per_set_auroc(scores: pd.DataFrame) -> dict[tuple[str, str], float]:
    """{(method, OOD set): AUROC in percent} for every test OOD set, and (method, field set) for the field sets
    (their own known rows as the ID side)."""
    values = scores["score"].to_numpy(np.float64)
    positions = _positions(scores)
    out: dict[tuple[str, str], float] = {}
    for method in scores["method"].unique():
        id_scores = values[_id_key(positions, method)]
        for (m, role, ood_set), part in positions.items():
            if m != method:
                continue
            if role == "ood" and len(id_scores):
                out[(method, ood_set)] = auroc(id_scores, values[part]) * 100
            elif role == "field_ood" and (method, "field_id", ood_set) in positions:
                out[(method, ood_set)] = auroc(values[positions[(method, "field_id", ood_set)]], values[part]) * 100
    return out


__all__ = ["HOP_LABELS", "read_scores", "has_sources", "attach_metadata", "resampled_metrics", "bootstrap_interval",
           "bootstrap_table", "hop_table", "species_field_table", "species_summary", "id_looking_table",
           "per_set_auroc"]
