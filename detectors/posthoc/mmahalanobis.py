"""MultiMahalanobis: Mahalanobis scores of several layers' spatially averaged maps, weighted and summed, without input
pre-processing (Lee et al., NeurIPS 2018), as pytorch-ood 0.4.0 implements it.

pytorch-ood `pytorch_ood/detector/mmahalanobis.py` is the reference (its DetectorInfo is not `ai_coded`): `:87-89`
alpha uniform by default, `:155-166` per layer the class means and the undivided within-class scatter plus 1e-6 I,
inverted (`torch.linalg.inv`), `:175-190` each class's -0.5 d^2, `:214-224` the layer score -max_c(-0.5 d^2) times its
alpha, summed (an outlier score: negated here, higher = more ID), `:244-247` maps averaged over H, W. Its layers are
consecutive modules given by the caller; here `layers` indexes the classifier's maps (by default every one: for a
ResNet's `hidden_states` the stem and each stage, as Lee et al.'s `feature_list`). `mdsens` is the same family
with OpenOOD's input pre-processing and its covariance divided by N.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from detectors.base import Detector
from detectors.posthoc import streaming
from detectors.posthoc.mdsens import half_squared_distances, pool_map
from detectors.posthoc.pixels import eval_mode, labels_of_images, pixel_batches
from detectors.registry import register_detector
from pipelines.params import Params, param
from pipelines.progress import progress


@register_detector("mmahalanobis")
class MultiMahalanobis(Detector):
    """sum_l alpha_l max_c -0.5 (f_l - mu_lc)^T (S_l + reg I)^-1 (f_l - mu_lc), f_l the channel means of map l and
    S_l its undivided within-class scatter. Needs the classifier and images."""

    label = "MultiMahalanobis"
    aliases = {"MultiMahalanobis": "pytorch-ood's"}
    reference_code = "pytorch-ood pytorch_ood/detector/mmahalanobis.py"
    family = "posthoc"
    inputs = frozenset({"images"})
    paper = ("Lee et al., A Simple Unified Framework for Detecting Out-of-Distribution Samples and Adversarial "
             "Attacks, NeurIPS 2018")

    @dataclass(frozen=True)
    class Params(Params):
        layers: list[int] | None = param(None, "indices of the maps scored; null: every map (a ResNet's "
                                         "hidden_states: the stem and each stage)")
        alpha: list[float] | None = param(None, "one weight per layer; null: 1 each (pytorch-ood's default)")
        maps: Literal["hidden_states", "relu_conv"] = param("hidden_states", "which feature maps are read")
        reg: float = param(1e-6, "added to the diagonal of each layer's within-class scatter before inverting",
                           ge=0)

        def check(self, dims: dict[str, int] | None = None) -> None:
            super().check(dims)
            if self.layers is not None and not self.layers:
                raise ValueError("layers must name at least one map (null: every map)")
            if self.alpha is not None and self.layers is not None and len(self.alpha) != len(self.layers):
                raise ValueError(f"alpha must be null or one weight per layer, got {self.alpha!r} for layers "
                                 f"{self.layers!r}")

    needs = frozenset({"classifier"})

    def __init__(self, classifier: Any = None, batch_size: int = 32, **params: Any) -> None:
        super().__init__(**params)
        self.classifier, self.batch_size = classifier, int(batch_size)
        self.stats: list[tuple[np.ndarray, np.ndarray]] = []  # per layer: (class means [K,F], precision [F,F])

    def _pooled(self, x: torch.Tensor) -> list[torch.Tensor]:
        maps = self.classifier.hidden_maps(x, self.params["maps"])[1]
        layers = self.params["layers"]
        layers = list(range(len(maps))) if layers is None else layers
        if max(layers) >= len(maps):
            raise ValueError(f"{self.name}: layers {layers} but the classifier gives {len(maps)} "
                             f"{self.params['maps']} maps")
        alpha = self.params["alpha"]
        if alpha is not None and len(alpha) != len(layers):
            raise ValueError(f"{self.name}: alpha {alpha} needs one weight for each of the {len(layers)} maps")
        return [pool_map(maps[j], "mean").double() for j in layers]

    def _batches(self, data: Any, desc: str) -> list[list[np.ndarray]]:
        if self.classifier is None:
            raise ValueError(f"{self.name} needs the classifier: build('{self.name}', classifier=ImageClassifier...)")
        chunks, total = pixel_batches(self.classifier, data, self.batch_size, self.name)
        with eval_mode(self.classifier), torch.no_grad():
            return [[f.cpu().numpy() for f in self._pooled(x)]
                    for x in progress(chunks, total=total, desc=desc, leave=False, disable=total < 2)]

    def _fit(self, id_train: Any, *, id_val: Any = None, ood_val: Any = None) -> None:
        labels = labels_of_images(id_train, self.name)
        parts = self._batches(id_train, f"{self.name} fit")
        if not parts:
            raise ValueError(f"{self.name}: no training images")
        self.stats = []
        for j in range(len(parts[0])):
            scatter = streaming.class_scatter(np.concatenate([p[j] for p in parts]), labels)
            within = scatter.within + self.params["reg"] * np.eye(len(scatter.within))
            self.stats.append((scatter.stats.means(), np.linalg.inv(within)))

    def layer_scores(self, batch: Any) -> np.ndarray:
        """[N, L] per-layer scores max_c -0.5 d_c^2."""
        if not self.stats:
            raise RuntimeError(f"{self.name}: call fit(id_train) before score()")
        parts = self._batches(batch, self.name)
        if not parts:
            return np.zeros((0, len(self.stats)))
        out = []
        for j, (means, precision) in enumerate(self.stats):
            f = torch.from_numpy(np.concatenate([p[j] for p in parts]))
            dist = half_squared_distances(f, torch.from_numpy(means), torch.from_numpy(precision))
            out.append((-dist).max(1).values.numpy())
        return np.stack(out, axis=1)

    def _score(self, batch: Any) -> np.ndarray:
        alpha = self.params["alpha"]
        weights = np.ones(len(self.stats)) if alpha is None else np.asarray(alpha, float)
        return self.layer_scores(batch) @ weights

    def state(self) -> dict[str, np.ndarray]:
        out = super().state()
        for j, (means, precision) in enumerate(self.stats):
            out[f"layer{j}.means"], out[f"layer{j}.precision"] = means, precision
        return out

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        super().load_state(state)
        count = sum(1 for k in state if k.endswith(".precision"))
        self.stats = [(state[f"layer{j}.means"], state[f"layer{j}.precision"]) for j in range(count)]
