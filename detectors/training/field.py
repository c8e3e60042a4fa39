"""Field-test reporting: how many of the target novel species a thresholded detector catches.

Convention (detectors.metrics): an image is flagged novel when its score is BELOW the threshold (scores: higher = ID).
For each species, the flagged share is (flagged images) / (images of the species). A species is
- "detected" when at least one of its images is flagged (`any`),
- "majority-detected" when strictly more than half of its images are flagged (`majority`).
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from detectors.base import as_numpy


def species_detection_share(scores: Any, species: Iterable[Any], threshold: float, *,
                            novel_species: Iterable[Any] | None = None) -> dict[str, Any]:
    """Share of species with >= 1 / a majority of images flagged (score < threshold).

    `species` gives each score's species (missing values are ignored); `novel_species` restricts the count to the target
    novel species (default: every species present). Returns `n_species`, `n_images`, `any`, `majority` (shares in
    [0, 1]), `mean_flagged` (mean over species of the flagged share), `image_share` (flagged share of all counted
    images) and `per_species` {species: flagged share}.
    """
    import pandas as pd  # a report helper: the registry loads this package without the `report` extra

    values = as_numpy(scores, np.float64).reshape(-1)
    names = pd.Series(list(species), dtype=object)
    if len(names) != len(values):
        raise ValueError(f"species has {len(names)} entries for {len(values)} scores")
    if not np.isfinite(values).all():
        raise ValueError("scores contain NaN or infinite values")
    keep = names.notna().to_numpy()
    if novel_species is not None:
        keep = keep & names.isin(set(novel_species)).to_numpy()
    frame = pd.DataFrame({"species": names[keep].to_numpy(), "flagged": values[keep] < threshold})
    if frame.empty:
        raise ValueError("no image of the requested species: nothing to count")
    share = frame.groupby("species", sort=True)["flagged"].mean()
    return {
        "n_species": int(len(share)), "n_images": int(len(frame)),
        "any": float((share > 0).mean()), "majority": float((share > 0.5).mean()),
        "mean_flagged": float(share.mean()), "image_share": float(frame["flagged"].mean()),
        "per_species": {k: float(v) for k, v in share.items()},
    }
