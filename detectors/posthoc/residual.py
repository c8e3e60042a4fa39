"""Residual (Wang et al., CVPR 2022, ViM's residual alone): minus the norm of h - u off the principal subspace.

OpenOOD (`openood/postprocessors/residual_postprocessor.py`) reads the head (`:23`), takes the virtual origin
u = -pinv(W) b (`:48`), the uncentred covariance of h - u (`:49-50`, `EmpiricalCovariance(assume_centered=True)`) of the
ID *validation* features (its loader `'val'`, `:26`), the eigenvectors past the `dim` largest eigenvalues
(`:51-53`), and scores -||(h - u) N|| (`:63-64`) with dim 512 (`configs/postprocessors/residual.yml:4`) and no sweep.
The ViM machinery is shared: the origin, the float32-product covariance and the ranked eigenvectors (`eigh` where the
reference calls `eig` on the symmetric matrix).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from detectors.base import Detector, FeatureSet
from detectors.posthoc import streaming
from detectors.posthoc.common import model_precision, stored_features
from detectors.posthoc.vim import residual_norm, resolve_dim, resolved_dim, subspace_basis, virtual_origin
from detectors.registry import register_detector
from pipelines.params import Params, param

OFFICIAL_DIM = 512
"""configs/postprocessors/residual.yml:4."""


@register_detector("residual")
class Residual(Detector):
    """s = -||(h - u) off the top-`dim` eigenvectors of the uncentred covariance of h - u||, u = -pinv(W) b."""

    label = "Residual"
    reference_code = "OpenOOD openood/postprocessors/residual_postprocessor.py"
    family = "posthoc"
    inputs = frozenset({"features"})
    paper = "Wang et al., ViM: Out-Of-Distribution with Virtual-logit Matching, CVPR 2022 (the residual score)"

    @dataclass(frozen=True)
    class Params(Params):
        dim: int | None = param(None, "principal subspace dimension (< D; None: 512, residual.yml:4, where D > 512, "
                                "else ViM's rule: 256 for D >= 512, D // 2 below)", ge=1, lt="features")
        fit_split: Literal["id_val", "id_train"] = param("id_val", "the ID split the subspace is fitted on (OpenOOD: "
                                                         "its 'val' loader, residual_postprocessor.py:26)")

    fit_inputs = frozenset({"head", "id_val"})
    needs_head = True

    def resolved_params(self) -> dict[str, Any]:
        return resolved_dim(self)

    def _fit(self, id_train: FeatureSet, *, id_val=None, ood_val=None) -> None:
        if self.params["fit_split"] == "id_val" and id_val is None:
            raise ValueError("residual: fit_split='id_val' (OpenOOD's) needs fit(..., id_val=FeatureSet); "
                             "fit_split='id_train' fits on the training rows")
        h = stored_features(id_val if self.params["fit_split"] == "id_val" else id_train, self.name)
        if len(h) == 0:
            raise ValueError("residual: the fit split has no rows")
        dim = resolve_dim(self.params["dim"], h.shape[1], self.name, OFFICIAL_DIM)
        self.origin = virtual_origin(self.head.weight, self.head.bias)
        covariance = streaming.moments(h, scatter=np.float32).second_moment_about(self.origin)
        self.keeps_principal, self.basis = subspace_basis(covariance, dim)

    def _score(self, batch) -> np.ndarray:
        def rows(_, block: np.ndarray) -> np.ndarray:
            block = model_precision(block)
            origin, basis = self.origin.astype(block.dtype), self.basis.astype(block.dtype)
            return -residual_norm(block - origin, basis, self.keeps_principal)

        h = stored_features(batch, self.name)
        return streaming.map_rows(rows, h, None if h.dtype in (np.float32, np.float64) else np.float32)

    def state(self) -> dict[str, np.ndarray]:
        return {**super().state(), "origin": self.origin, "basis": self.basis,
                "keeps_principal": np.array([self.keeps_principal])}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        super().load_state(state)
        self.origin, self.basis = state["origin"], state["basis"]
        self.keeps_principal = bool(state["keeps_principal"][0])
