"""What CIDER and ReweightOOD share (OpenOOD's CIDERNet, `openood/networks/cider_net.py`): a projection head on the
backbone's features trained by an embedding loss (no classifier loss), and a score read from the trained backbone's
L2-normalised features (`CIDERNet.intermediate_forward`, `cider_net.py:33-35`) by a rule fitted on ID train.

The closed-set head gets no gradient (`replaces_head`); it stays the classifier's and keeps the accuracy columns.
In heads mode only the projection head trains, and the backbone's features, hence the score, stay the frozen ones.
The reference feeds each image twice, as two augmented views (`cider_preprocessor.py:47, 56-62`); the loop draws one
view per row, so the losses here see each row once (they take any batch, two-view ones included: the golden tests).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from detectors.training.common import TrainedDetector


def projection_head(feature_dim: int, feat_dim: int, kind: str = "mlp") -> nn.Module:
    """CIDERNet's head (`cider_net.py:20-25`): "mlp" = Linear(D, D), ReLU, Linear(D, feat_dim); "linear" = one layer."""
    if kind == "linear":
        return nn.Linear(feature_dim, feat_dim)
    return nn.Sequential(nn.Linear(feature_dim, feature_dim), nn.ReLU(inplace=True), nn.Linear(feature_dim, feat_dim))


def unit_rows(features: np.ndarray) -> np.ndarray:
    """float64 rows over their L2 norm (at least 1e-12, `F.normalize`'s floor): `intermediate_forward`'s features."""
    h = np.asarray(features, dtype=np.float64)
    return h / np.maximum(np.linalg.norm(h, axis=1, keepdims=True), 1e-12)


class EmbeddingDetector(TrainedDetector):
    """Trained through a projection head; after training, `fit_rule` fits the score on the trained model's normalised
    ID-train features (its arrays join the detector's state) and `rule_scores` scores normalised features."""

    released_network = None

    def fit(self, id_train: Any, *, head: Any = None, id_val: Any = None, ood_val: Any = None,
            aux: Any = None) -> EmbeddingDetector:
        super().fit(id_train, head=head, id_val=id_val, ood_val=ood_val, aux=aux)
        seen = self.transform(id_train)
        self.extra = {**self.extra, **self.fit_rule(unit_rows(seen.features), np.asarray(seen.labels))}
        self._rule_memo = None
        if self.work_dir is not None:
            self._save_artifact()
        return self

    def export(self, objective: Any) -> dict[str, np.ndarray]:
        """The projection head's weights (`projection.<name>`), as trained."""
        weights = objective.projection.state_dict()
        return {f"projection.{k}": v.detach().double().cpu().numpy() for k, v in weights.items()}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        super().load_state(state)
        self._rule_memo = None

    def fit_rule(self, unit: np.ndarray, labels: np.ndarray) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def rule_scores(self, unit: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _score_logits(self, logits: np.ndarray, features: np.ndarray) -> np.ndarray:
        return self.rule_scores(unit_rows(features))


class MahalanobisOnUnitFeatures(EmbeddingDetector):
    """The score max_c -(h - mu_c)^T P (h - mu_c) on the normalised features: class means and P the precision of
    sklearn's EmpiricalCovariance of the class-centred normalised ID-train features, as OpenOOD's
    `reweightood_postprocessor.py:20-72` and `mds_postprocessor.py:20-77` compute it (the `mds` detector's fit)."""

    def fit_rule(self, unit: np.ndarray, labels: np.ndarray) -> dict[str, np.ndarray]:
        from detectors.base import FeatureSet
        from detectors.posthoc.mds import Mahalanobis

        mds = Mahalanobis().fit(FeatureSet(unit, None, labels))
        return {"mds.means": mds.means, "mds.precision": mds.precision}

    def rule_scores(self, unit: np.ndarray) -> np.ndarray:
        from detectors.posthoc.mds import min_squared_mahalanobis

        return -min_squared_mahalanobis(unit, self.extra["mds.means"], self.extra["mds.precision"], desc=self.name)


def embed(projection: nn.Module, features: torch.Tensor) -> torch.Tensor:
    """CIDERNet's forward after the backbone (`cider_net.py:27-31`): the projection, L2-normalised (float32)."""
    return F.normalize(projection(features).float(), dim=1)
