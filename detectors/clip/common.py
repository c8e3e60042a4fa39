"""Shared base of the CLIP detectors: model handling, class prompts and cached image features."""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from detectors.base import Detector, ImageSet
from detectors.clip.backbone import DEFAULT_CLIP, DEFAULT_TEMPLATES, ClipBackbone
from detectors.clip.features import ClipImageFeatures, image_features
from detectors.clip.scores import cosine
from pipelines.params import Params, param

MCM_TEMPLATE = "a photo of a {}"  # MCM / GL-MCM's official prompt (no full stop)

class ClipDetector(Detector):
    """A detector on a CLIPModel. `model` is a hub id, a local folder or a loaded `CLIPModel` (kept out of `params`,
    which hold its id); `class_names` are the ID classes; `templates` are each method's reference prompts (a class
    declares them in `Params`; None falls back to ("a photo of a {}.",)). `embed_batch_size` is the image-embedding
    batch (a runtime setting, like `cache_dir` and `device`), not a training batch."""

    @dataclass(frozen=True)
    class Params(Params):
        model: str = param(DEFAULT_CLIP,
                           "CLIP hub id or local folder (a loaded model may be passed to the constructor)")
        class_names: list[str] | None = param(None, "the ID class names (saved: the prompts are made of them)")
        templates: list[str] | None = param(None, "reference prompts, '{}' standing for the class name")
        cache_dir: str | os.PathLike | None = param(None, "image-embedding cache folder (None: memory only)",
                                                    runtime=True)
        embed_batch_size: int = param(64, "images per embedding batch", runtime=True, ge=1)
        device: str | torch.device | None = param(None, "torch device (None: the process's accelerator)", runtime=True)

    family: ClassVar[str] = "clip"
    inputs: ClassVar[frozenset[str]] = frozenset({"images"})
    needs: ClassVar[frozenset[str]] = frozenset({"class_names", "cache_dir", "device"})
    reads_patches: ClassVar[bool] = False  # GL-MCM-style scores and LoCoOp read local patch embeddings

    def __init__(self, model: Any = DEFAULT_CLIP, processor: Any = None, **params: Any) -> None:
        self._backbone: ClipBackbone | None = None
        if isinstance(model, ClipBackbone):
            self._backbone, model = model, model.model_id
        elif not isinstance(model, (str, os.PathLike)):
            self._backbone = ClipBackbone.load(model, processor, params.get("device"))
            model = self._backbone.model_id
        super().__init__(model=str(model), **params)
        self.params["class_names"] = list(self.params["class_names"] or [])
        self.params["templates"] = list(self.params["templates"] or DEFAULT_TEMPLATES)
        self._processor = processor
        self._text_cache: dict[str, torch.Tensor] = {}

    @property
    def backbone(self) -> ClipBackbone:
        """The loaded CLIP model (loaded on first use)."""
        if self._backbone is None:
            self._backbone = ClipBackbone.load(self.params["model"], self._processor, self.params["device"])
        return self._backbone

    def features(self, images: ImageSet | ClipImageFeatures) -> ClipImageFeatures:
        """Cached image embeddings of `images` (the image tower runs once per model and image set)."""
        return image_features(self.backbone, images, self.params["cache_dir"], self.params["embed_batch_size"],
                              local=self.reads_patches)

    def require_classes(self) -> list[str]:
        """The ID class names; a clear error when none were given."""
        if not self.params["class_names"]:
            raise ValueError(f"{self.name}: class_names=[...] (the ID class names) is required")
        return self.params["class_names"]

    def class_text(self) -> torch.Tensor:
        """Normalised ID class embeddings [C,P] from the hand-written templates (computed once)."""
        if "classes" not in self._text_cache:
            self._text_cache["classes"] = self.backbone.encode_class_prompts(self.require_classes(),
                                                                             self.params["templates"]).cpu()
        return self._text_cache["classes"]

    @property
    def num_classes(self) -> int:
        return len(self.params["class_names"])

    def predict(self, batch: ImageSet | ClipImageFeatures) -> np.ndarray:
        """ID class predictions [N]: the class prompt nearest each image (CLIP's zero-shot classifier), the known-class
        predictions of the open-set metrics."""
        return cosine(self.features(batch).global_, self.class_text()).argmax(-1).numpy()


def labels_of(images: ImageSet, who: str) -> torch.Tensor:
    """Integer class labels of a training ImageSet, with a clear error when missing."""
    if images.labels is None or (images.labels < 0).any():
        raise ValueError(f"{who}.fit needs an ImageSet with ID class labels (>= 0) for every image")
    return torch.as_tensor(images.labels, dtype=torch.long)


def few_shot_indices(labels: Sequence[int], shots: int | None, seed: int) -> list[int]:
    """Up to `shots` indices per class drawn with `seed` (all when `shots` is None), in ascending order."""
    labels = np.asarray(labels)
    if shots is None:
        return list(range(len(labels)))
    rng = np.random.default_rng(seed)
    picked = [rng.permutation(np.flatnonzero(labels == c))[:shots] for c in np.unique(labels)]
    return sorted(int(i) for i in np.concatenate(picked))
