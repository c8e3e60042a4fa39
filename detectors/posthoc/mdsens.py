"""MDSEns: Mahalanobis scores of several layers' pooled feature maps after input pre-processing, combined (Lee et al.,
NeurIPS 2018, the "ensemble" variant), as OpenOOD v1.5 implements it
(openood/postprocessors/mds_ensemble_postprocessor.py with configs/postprocessors/mds_ensemble.yml, which Open-Insects
runs unchanged).

For each chosen layer l: the map is pooled ("mean" per channel, "stat" mean and unbiased variance, "flat"), class
means and one tied precision are fitted on ID train (as `mds`); a sample's closest class c (on the clean input) gives
the loss mean(0.5 d_c^2); the input moves by -noise * sign(grad) / grad_std (OpenOOD divides by 0.5 for every channel,
whatever the normalisation); the layer score is max_c -0.5 d_c^2 of the moved input. The score is sum_l alpha_l
score_l. Defaults are the yml's: noise 0.0014, one layer: index 0 of the feature list (for ResNets the stem output
after max-pooling, which is `hidden_states[0]` of a transformers ResNet), "mean", alpha [1]. `layers: [0, 1, 2, 3, 4]`
uses every stage; `alpha: "fit"` fits the weights by logistic regression (scikit-learn LogisticRegressionCV, ID = 1)
on the layer scores of ID val against OOD val, as the code does when no alpha list is given.
`maps`: "hidden_states" (a transformers classifier's hidden states) or "relu_conv" (every nn.ReLU / nn.Conv2d output).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from detectors.base import Detector
from detectors.posthoc import streaming
from detectors.posthoc.mds import spd_inverse
from detectors.posthoc.odin import REFERENCE_GRAD_STD
from detectors.posthoc.pixels import eval_mode, labels_of_images, pixel_batches
from detectors.registry import register_detector
from pipelines.params import Params, param
from pipelines.progress import progress

FEATURE_TYPES = ("mean", "stat", "flat")


def pool_map(feature_map: torch.Tensor, kind: str) -> torch.Tensor:
    """OpenOOD's `process_feature_type`: [B, C, ...] -> [B, F]."""
    x = feature_map.reshape(feature_map.shape[0], feature_map.shape[1], -1)
    if kind == "flat":
        return x.reshape(x.shape[0], -1)
    mean = x.mean(-1)
    if kind == "mean" or x.shape[-1] == 1:
        return mean
    return torch.cat([mean, x.var(-1)], dim=1)


def half_squared_distances(features: torch.Tensor, means: torch.Tensor, precision: torch.Tensor) -> torch.Tensor:
    """0.5 (f - mu_c)^T P (f - mu_c) for every row and class, [B, K] (expanded: no [B, K, F] tensor; about the mean of
    the class means, as `mahalanobis.min_squared_mahalanobis`, so the expansion cancels less)."""
    origin = means.mean(0)
    features, means = features - origin, means - origin
    fp = features @ precision
    quad = (fp * features).sum(1, keepdim=True)
    return 0.5 * (quad - 2.0 * fp @ means.T + ((means @ precision) * means).sum(1)[None, :])


@register_detector("mdsens")
class MDSEnsemble(Detector):
    """sum_l alpha_l max_c -0.5 d_{l,c}(x'_l)^2 over the chosen layers. Needs the classifier and images."""

    label = "MDSEns"
    aliases = {"mds_ensemble": "OpenOOD's"}
    reference_code = "OpenOOD openood/postprocessors/mds_ensemble_postprocessor.py"
    family = "posthoc"
    inputs = frozenset({"images"})
    keeps_batches = True  # a killed rerun resumes within a set (Detector.score)
    paper = ("Lee et al., A Simple Unified Framework for Detecting Out-of-Distribution Samples and Adversarial "
             "Attacks, NeurIPS 2018")

    @dataclass(frozen=True)
    class Params(Params):
        noise: float = param(0.0014, "input pre-processing step", ge=0)
        layers: list[int] = param([0], "indices of the feature maps scored")
        feature_types: list[Literal["mean", "stat", "flat"]] = param(["mean"], "pooling of each layer's map")
        alpha: list[float] | Literal["fit"] = param([1.0],
                                                    "layer weights, or 'fit' (logistic regression on ID/OOD val)")
        maps: Literal["hidden_states", "relu_conv"] = param("hidden_states", "which feature maps are read")
        grad_std: float = param(REFERENCE_GRAD_STD,
                                "divisor of the input gradient (OpenOOD: 0.5 for every channel)", gt=0)

        def check(self, dims: dict[str, int] | None = None) -> None:
            super().check(dims)
            if len(self.feature_types) != len(self.layers):
                raise ValueError(f"feature_types needs one of {FEATURE_TYPES} per layer, got {self.feature_types!r} "
                                 f"for layers {self.layers!r}")
            if self.alpha != "fit" and len(self.alpha) != len(self.layers):
                raise ValueError(f"alpha must be 'fit' or one weight per layer, got {self.alpha!r}")

    fit_inputs = frozenset({"id_val", "ood_val"})
    needs = frozenset({"classifier"})
    search_space: dict[str, list[Any]] = {"noise": [0.0014]}  # OpenOOD v1.5 mds_ensemble.yml

    def __init__(self, classifier: Any = None, batch_size: int = 32, **params: Any) -> None:
        super().__init__(**params)
        self.classifier, self.batch_size = classifier, int(batch_size)
        self.stats: list[tuple[np.ndarray, np.ndarray]] = []  # per layer: (class means [K,F], precision [F,F])
        self.alpha: np.ndarray | None = None

    def _pooled(self, maps: list[torch.Tensor]) -> list[torch.Tensor]:
        return [pool_map(maps[l], kind).double() for l, kind in zip(self.params["layers"],
                                                                    self.params["feature_types"])]

    def _check(self) -> None:
        if self.classifier is None:
            raise ValueError("mdsens needs the classifier: build('mdsens', classifier=ImageClassifier...)")

    # -- fit ------------------------------------------------------------------------------------------------
    def _fit(self, id_train: Any, *, id_val: Any = None, ood_val: Any = None) -> None:
        self._check()
        labels = labels_of_images(id_train, self.name)
        chunks, total = pixel_batches(self.classifier, id_train, self.batch_size, self.name)
        parts: list[list[np.ndarray]] = []
        with eval_mode(self.classifier), torch.no_grad():
            for x in progress(chunks, total=total, desc="mdsens fit", leave=False, disable=total < 2):
                parts.append([f.cpu().numpy()
                              for f in self._pooled(self.classifier.hidden_maps(x, self.params["maps"])[1])])
        self.stats = []
        for j in range(len(self.params["layers"])):
            scatter = streaming.class_scatter(np.concatenate([p[j] for p in parts]), labels)
            self.stats.append((scatter.stats.means(), spd_inverse(scatter.within / scatter.stats.n)))
        self.alpha = (self._fit_alpha(id_val, ood_val) if self.params["alpha"] == "fit"
                      else np.asarray(self.params["alpha"], float))

    def _fit_alpha(self, id_val: Any, ood_val: Any) -> np.ndarray:
        from sklearn.linear_model import LogisticRegressionCV

        if id_val is None or ood_val is None:
            raise ValueError("mdsens: alpha='fit' needs id_val and ood_val images (ID = 1, OOD = 0)")
        scores_in, scores_out = self.layer_scores(id_val), self.layer_scores(ood_val)
        data = np.concatenate([scores_in, scores_out]).astype(np.float32)
        target = np.concatenate([np.ones(len(scores_in)), np.zeros(len(scores_out))])
        return LogisticRegressionCV().fit(data, target).coef_.reshape(-1).astype(np.float64)

    # -- score ----------------------------------------------------------------------------------------------
    def layer_scores(self, batch: Any) -> np.ndarray:
        """[N, L] noisy per-layer scores max_c -0.5 d_c^2."""
        self._check()
        if not self.stats:
            raise RuntimeError("mdsens: call fit(id_train) before score()")
        chunks, total = pixel_batches(self.classifier, batch, self.batch_size, self.name)
        with eval_mode(self.classifier):
            parts = [self._chunk_scores(x) for x in progress(chunks, total=total, desc="mdsens", leave=False,
                                                             disable=total < 2)]
        return np.concatenate(parts) if parts else np.zeros((0, len(self.stats)))

    def _chunk_scores(self, x: torch.Tensor) -> np.ndarray:
        x = x.detach().requires_grad_(True)
        stats = [(torch.as_tensor(m, device=x.device), torch.as_tensor(p, device=x.device)) for m, p in self.stats]
        out = []
        with torch.enable_grad():
            clean = self._pooled(self.classifier.hidden_maps(x, self.params["maps"])[1])
            for j, (means, precision) in enumerate(stats):
                dist = half_squared_distances(clean[j], means, precision)
                loss = dist.gather(1, dist.argmin(1, keepdim=True)).mean()
                (grad,) = torch.autograd.grad(loss, x, retain_graph=j < len(stats) - 1)
                step = torch.where(grad >= 0, 1.0, -1.0).to(x.dtype) / float(self.params["grad_std"])
                moved = x.detach() - float(self.params["noise"]) * step
                with torch.no_grad():
                    noisy = self._pooled(self.classifier.hidden_maps(moved, self.params["maps"])[1])[j]
                    out.append((-half_squared_distances(noisy, means, precision)).max(1).values.cpu().numpy())
        return np.stack(out, axis=1)

    def _score(self, batch: Any) -> np.ndarray:
        return self.layer_scores(batch) @ self.alpha

    # -- state ----------------------------------------------------------------------------------------------
    def state(self) -> dict[str, np.ndarray]:
        out = super().state()
        for j, (means, precision) in enumerate(self.stats):
            out[f"layer{j}.means"], out[f"layer{j}.precision"] = means, precision
        if self.alpha is not None:
            out["alpha"] = self.alpha
        return out

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        super().load_state(state)
        count = sum(1 for k in state if k.endswith(".precision"))
        self.stats = [(state[f"layer{j}.means"], state[f"layer{j}.precision"]) for j in range(count)]
        self.alpha = state.get("alpha")
