"""NECO (Ben Ammar et al., ICLR 2024): share of the feature norm inside the top principal subspace of ID features."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from detectors.base import Detector, FeatureSet
from detectors.posthoc import streaming
from detectors.posthoc.common import model_precision, stored_features
from detectors.posthoc.vim import ranked_eigenvectors, resolve_dim
from detectors.registry import register_detector
from pipelines.params import Params, param


@register_detector("neco")
class NECO(Detector):
    """s = ||PCA_dim(z)|| / ||z||, z = StandardScaler(h) fitted on train (`scale=False`: z = h, PCA still centred).

    Paper default: the plain ratio (the official code's choice for ResNets). `max_logit=True` multiplies by the
    max logit, the official code's choice for ViT/DeiT/Swin. `dim=None` uses ViM's rule (see vim.principal_dim).
    The scaler and the PCA both follow from one streamed pass of moments: cov(z) = cov(h) / (std std^T).
    """

    label = "NECO"
    reference_code = "the NECO paper (Ben Ammar et al., ICLR 2024) and its released code"
    family = "posthoc"
    fits_from_shards = True  # its statistics are sums: each process may fit its shard (streaming.across_processes)
    inputs = frozenset({"features"})
    paper = "Ben Ammar et al., NECO: NEural Collapse Based Out-of-distribution detection, ICLR 2024"

    @dataclass(frozen=True)
    class Params(Params):
        dim: int | None = param(None, "PCA dimension (<= D; None: `default_dim`, else ViM's rule)", ge=1, le="features")
        default_dim: int | None = param(None, "the dimension `dim: null` takes where D allows (protocol open-insects: "
                                              "Open-Insect's neco.yml, 100); None: ViM's rule", ge=1)
        scale: bool = param(True, "standardise the features before the PCA")
        max_logit: bool = param(False, "multiply by the max logit (the official choice for ViT/DeiT/Swin)")

    fit_inputs = frozenset({"head"})
    search_space = {"dim": [50, 100, 150, 200, 250, 300]}
    # OpenOOD has no neco.yml: its defaults run; Open-Insect's neco.yml:5-9 sweeps dim 100 ... 400 from 100
    grids = {"openood_v1.5": None, "open-insects": {"dim": [100, 200, 300, 400]}}
    protocol_defaults = {"open-insects": {"default_dim": 100}}

    def resolved_params(self) -> dict[str, Any]:
        return {"dim": int(self.components.shape[1])} if "components" in self.__dict__ else {}

    def _fit(self, id_train: FeatureSet, *, id_val=None, ood_val=None) -> None:
        if self.params["max_logit"] and self.head is None:
            raise ValueError("neco: max_logit=True needs the classifier's linear head: fit(..., head=LinearHead(W, b))")
        h = stored_features(id_train, self.name)
        dim = resolve_dim(self.params["dim"], h.shape[1], self.name, self.params["default_dim"])
        stats = streaming.moments(h)
        mean, covariance = stats.mean(), stats.pooled_scatter() / stats.n
        if self.params["scale"]:
            self.offset = mean
            std = np.sqrt(np.maximum(np.diag(covariance), 0.0))
            self.scale_by = np.where(std > 10 * np.finfo(np.float64).eps, std, 1.0)
        else:
            self.offset, self.scale_by = np.zeros(h.shape[1]), np.ones(h.shape[1])
        self.pca_mean = (mean - self.offset) / self.scale_by
        self.components = ranked_eigenvectors(covariance / np.outer(self.scale_by, self.scale_by), 0, dim)

    def _score(self, batch) -> np.ndarray:
        def rows(_, block: np.ndarray) -> np.ndarray:
            block = model_precision(block)
            z = np.subtract(block, self.offset, dtype=np.float64)
            z /= self.scale_by
            ratio = (np.linalg.norm((z - self.pca_mean) @ self.components, axis=1)
                     / np.maximum(np.linalg.norm(z, axis=1), 1e-12))
            if self.params["max_logit"]:
                ratio *= self.head(block.astype(np.float32, copy=False)).max(axis=1)
            return ratio

        return streaming.map_rows(rows, stored_features(batch, self.name))

    def state(self) -> dict[str, np.ndarray]:
        return {**super().state(), "offset": self.offset, "scale_by": self.scale_by, "pca_mean": self.pca_mean,
                "components": self.components}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        super().load_state(state)
        self.offset, self.scale_by = state["offset"], state["scale_by"]
        self.pca_mean, self.components = state["pca_mean"], state["components"]
