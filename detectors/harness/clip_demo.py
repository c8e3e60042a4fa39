"""Demo stage of the CLIP detectors: zero-shot MCM and a briefly trained LoCoOp on a tiny random-weight CLIP."""
from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from detectors.metrics import METRICS as DEMO_METRICS


def clip_demo(out_dir: str, id_images: Sequence[Any], id_labels: Sequence[int], class_names: Sequence[str],
              ood_sets: dict[str, list[Any]], model: str | None = None,
              locoop_epochs: int = 10) -> list[dict[str, Any]]:
    """Rows (method, family, ood_set, group, metrics in percent, n_id, n_ood, seconds) of MCM and LoCoOp.

    `model` defaults to a tiny CLIP written to `out_dir/tiny_clip`. LoCoOp trains `locoop_epochs` epochs on every
    ID image (all shots) and is saved to `out_dir/locoop`; both methods then score the same ID images.
    """
    import detectors
    from detectors.base import ImageSet
    from detectors.clip.backbone import ClipBackbone
    from detectors.metrics import evaluate

    out = Path(out_dir)
    if model is None:
        from pipelines.tiny import save_tiny_clip

        model = str(save_tiny_clip(out / "tiny_clip"))
    backbone = ClipBackbone.load(model)
    id_set = ImageSet(images=list(id_images), labels=np.asarray(id_labels))
    ood = {name: ImageSet(images=list(images)) for name, images in ood_sets.items()}
    rows = []
    mcm = detectors.build("mcm", model=backbone, class_names=list(class_names))
    locoop = detectors.build("locoop", model=backbone, class_names=list(class_names), shots=None, epochs=locoop_epochs,
                             lr=0.05, progress=False)
    for det in (mcm, locoop):
        start = time.perf_counter()
        if det is locoop:
            det.fit(id_set)
            det.save_pretrained(out / "locoop")
        id_scores = det.score(id_set)
        for name, images in ood.items():
            metrics = evaluate(id_scores, det.score(images))
            rows.append({"method": det.name, "family": det.family, "ood_set": name, "group": None,
                         **{k: 100 * metrics[k] for k in DEMO_METRICS}, "n_id": len(id_set), "n_ood": len(images),
                         "seconds": time.perf_counter() - start})
    return rows
