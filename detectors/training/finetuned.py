"""Full-mode plumbing of the training-time detectors: what keys a fine-tuning run, the fine-tuned model's features
(content-keyed cache), and the fine-tuned weights as part of the detector's saved state."""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from detectors.base import ImageSet, as_numpy
from pipelines.data import Manifest
from pipelines.features import FeatureCache, cache_path, extract_features
from pipelines.fingerprint import combine, images_fingerprint, preprocessing_fingerprint, weights_fingerprint

CLASSIFIER_PREFIX = "classifier."
SCORING_ONLY = ("score_rule", "score_batch_size", "num_workers")  # parameters that do not change the trained model


def as_manifest(data: Any, what: str, who: str) -> Manifest | None:
    """The manifest behind an ImageSet (or a Manifest itself); None stays None."""
    if data is None or isinstance(data, Manifest):
        return data
    if isinstance(data, ImageSet) and data.manifest is not None:
        return data.manifest
    raise TypeError(f"{who}: mode 'full' trains on manifest rows: {what} must be an ImageSet built from a manifest or a "
                    f"Manifest, got {type(data).__name__}")


def training_key(name: str, params: dict[str, Any], classifier: Any, *manifests: Manifest | None) -> str:
    """Content key of a fine-tuning run: method, training parameters, the starting weights and every image set."""
    kept = {k: v for k, v in params.items() if k not in SCORING_ONLY}
    return combine("finetune-v1", name, kept, weights_fingerprint(classifier),
                   [None if m is None else images_fingerprint(m) for m in manifests])


def extract(det: Any, batch: Any) -> tuple[np.ndarray, np.ndarray | None]:
    """(features [N,D], labels) of `det.classifier` on an ImageSet or Manifest; manifest rows go through
    `pipelines.features.extract_features` with a cache under `det.work_dir/features` keyed by the current weights."""
    clf, params = det.classifier, det.params
    manifest = batch if isinstance(batch, Manifest) else batch.manifest if isinstance(batch, ImageSet) else None
    if manifest is None:
        if isinstance(batch, ImageSet):
            return _forward(clf, batch, params["score_batch_size"]), batch.labels
        raise TypeError(f"{det.name}: transform/score take a FeatureSet, an ImageSet or a Manifest, got {type(batch).__name__}")
    if det._weights_key is None:
        det._weights_key = weights_fingerprint(clf)
    key = combine("trained-features-v1", det._weights_key, preprocessing_fingerprint(clf), images_fingerprint(manifest),
                  params["precision"])
    if key not in det._features_memo:
        cache = None if det.work_dir is None else cache_path(det.work_dir / "features", manifest.root.name, key)
        found = extract_features(clf, manifest, batch_size=params["score_batch_size"], precision=params["precision"],
                                 cache=cache, key=key, desc=f"{det.name} features")
        if cache is not None and cache.is_file():  # keep the memory-mapped file, not a second copy in memory
            found = FeatureCache.load(cache, mmap=True)
        if len(found) != len(manifest):
            bad = [f["file"] for f in found.failures][:3]
            raise ValueError(f"{det.name}: {len(manifest) - len(found)} image(s) could not be loaded ({bad}); "
                             "leave unreadable images out of the scored sets")
        det._features_memo[key] = (np.asarray(found.features), np.asarray(found.labels))
    return det._features_memo[key]


@torch.no_grad()
def _forward(classifier: Any, images: ImageSet, batch_size: int) -> np.ndarray:
    """Penultimate features of in-memory images (no cache: they have no file identity)."""
    classifier.eval()
    device = next(classifier.parameters()).device
    parts = [as_numpy(classifier(classifier.preprocess(batch).to(device))[1], np.float32)
             for _, batch in images.batches(batch_size)]
    return np.concatenate(parts) if parts else np.zeros((0, classifier.head.in_features), np.float32)


def classifier_arrays(classifier: torch.nn.Module) -> dict[str, np.ndarray]:
    """The classifier's state dict as numpy arrays named `classifier.<key>` (saved with the detector)."""
    return {CLASSIFIER_PREFIX + k: np.ascontiguousarray(as_numpy(v)) for k, v in classifier.state_dict().items()}


def load_classifier_arrays(classifier: torch.nn.Module, state: dict[str, np.ndarray]) -> None:
    """Load what `classifier_arrays` saved into a classifier of the same architecture (dtypes kept)."""
    own = classifier.state_dict()
    weights = {k[len(CLASSIFIER_PREFIX):]: v for k, v in state.items() if k.startswith(CLASSIFIER_PREFIX)}
    missing = sorted(set(own) - set(weights))
    if missing:
        raise ValueError(f"the saved fine-tuned classifier lacks {missing[:5]}: not the same architecture")
    classifier.load_state_dict({k: torch.from_numpy(np.array(weights[k])).to(own[k].dtype) for k in own})
