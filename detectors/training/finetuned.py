"""Full-mode plumbing of the training-time detectors: what keys a fine-tuning run and names its files, the fine-tuned
model's features (content-keyed cache), and the fine-tuned weights as part of the detector's saved state (a
transformers classifier as its own model folder, a plain module as arrays)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from detectors.base import ImageSet, as_numpy
from pipelines.data import Manifest
from pipelines.features import FeatureCache, cache_path, extract_features
from pipelines.fingerprint import combine, images_fingerprint, preprocessing_fingerprint, weights_fingerprint

CHECKPOINT = "finetune.safetensors"  # the per-epoch resume checkpoint in work_dir (pipelines.checkpoints: no pickle)
ARTIFACT = "model"  # work_dir/model: the trained detector (save_pretrained) once training has finished
CLASSIFIER_FOLDER = "classifier"  # <saved detector>/classifier: the fine-tuned transformers classifier
CLASSIFIER_PREFIX = "classifier."
SCORING_ONLY = ("score_rule", "score_batch_size", "num_workers")  # parameters that do not change the trained model


def as_manifest(data: Any, what: str, who: str) -> Manifest | None:
    """The manifest behind an ImageSet (or a Manifest itself); None stays None."""
    if data is None or isinstance(data, Manifest):
        return data
    if isinstance(data, ImageSet) and data.manifest is not None:
        return data.manifest
    raise TypeError(f"{who}: mode 'full' trains on manifest rows: {what} must be an ImageSet built from a manifest or "
                    "a "
                    f"Manifest, got {type(data).__name__}")


def training_key(name: str, params: dict[str, Any], classifier: Any, *manifests: Manifest | None) -> str:
    """Content key of a fine-tuning run: method, training parameters, the starting weights and every image set."""
    kept = {k: v for k, v in params.items() if k not in SCORING_ONLY}
    return combine("finetune-v1", name, kept, weights_fingerprint(classifier),
                   [None if m is None else images_fingerprint(m) for m in manifests])


def features_key(weights_key: str, classifier: Any, manifest: Manifest, precision: str) -> str:
    """Content key of the fine-tuned model's features on `manifest`: its weights' fingerprint, the preprocessing, the
    images and the precision."""
    return combine("trained-features-v1", weights_key, preprocessing_fingerprint(classifier),
                   images_fingerprint(manifest), precision)


def cached_features(who: str, classifier: Any, manifest: Manifest, key: str, cache_dir: Path | None, batch_size: int,
                    precision: str) -> tuple[np.ndarray, np.ndarray]:
    """(features [N,D], labels) of `classifier` on every row of `manifest`, through
    `pipelines.features.extract_features` with a cache file under `cache_dir` named by `key` (none: no cache); an
    unreadable image is an error."""
    cache = None if cache_dir is None else cache_path(cache_dir, manifest.root.name, key)
    found = extract_features(classifier, manifest, batch_size=batch_size, precision=precision, cache=cache, key=key,
                             desc=f"{who} features")
    if cache is not None and cache.is_file():  # keep the memory-mapped file, not a second copy in memory
        found = FeatureCache.load(cache, mmap=True)
    if len(found) != len(manifest):
        bad = [f["file"] for f in found.failures][:3]
        raise ValueError(f"{who}: {len(manifest) - len(found)} image(s) could not be loaded ({bad}); "
                         "leave unreadable images out of the scored sets")
    return np.asarray(found.features), np.asarray(found.labels)


@torch.no_grad()
def forward_images(classifier: Any, images: ImageSet, batch_size: int) -> np.ndarray:
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
