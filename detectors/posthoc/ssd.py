"""SSD's post-hoc score (Sehwag et al., ICLR 2021): the Mahalanobis distance of a unit-normalised feature to the one
Gaussian of all unit-normalised ID training features, negated.

SSD trains the network self-supervised (SimCLR) and scores its features with one cluster by default
(inspire-group/SSD `eval_ssd.py`, `--clusters 1`, `get_scores_one_cluster` in `utils.py`: rows over their norm, then
(f - mu)^T pinv(cov) (f - mu), cov with 1/N). OpenOOD's port (`openood/postprocessors/ssd_postprocessor.py`) is that
fit alone: `setup` (`:21-24`) runs `get_MDS_stat` with num_classes 1 (`:16`) on the ID train features its SimClrNet
returns, which are normalised (`openood/networks/simclr_net.py:18`, F.normalize) with `mean` pooling and no reduction
(`configs/postprocessors/ssd.yml:6, 8`): the mean and sklearn's `EmpiricalCovariance` precision (pinvh) of those rows
(`mds_ensemble_postprocessor.py:170-238`). It has no `postprocess` (the base class's MSP of `net(data)`, a tuple from
SimClrNet), it indexes the one-cluster list with the true labels (an IndexError for any label but 0), and it has no
`set_hyperparam` for ssd.yml's APS sweep (`:3, 9-10`, noise [0.0014], read by nothing here): APS off; the yml's
`name: mds` (`:2`) makes OpenOOD's `main.py` run its MDS postprocessor with it instead. The score
here is SSD's distance on OpenOOD's statistics; the self-supervised training is not part of this detector (it scores
the features it is given: those of a SimCLR encoder for SSD proper).

The mean and the scatter are two streamed passes over unit rows (mergeable across processes, as `mds`); SSD's
per-dimension standardisation before the fit leaves the distance unchanged where the covariance is invertible and is
not applied.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from detectors.base import Detector, FeatureSet
from detectors.posthoc import streaming
from detectors.posthoc.common import stored_features
from detectors.posthoc.mds import min_squared_mahalanobis, spd_inverse
from detectors.registry import register_detector
from pipelines.params import Params, param


def unit_rows(block: np.ndarray) -> np.ndarray:
    """float64 rows over max(||h||, 1e-12) (torch's F.normalize, as SimClrNet applies it; a zero row stays 0)."""
    block = np.asarray(block, dtype=np.float64)
    return block / np.maximum(np.sqrt(np.einsum("nd,nd->n", block, block)), 1e-12)[:, None]


@register_detector("ssd")
class SSD(Detector):
    """s(h) = -(f - mu)^T S^+ (f - mu), f = h / ||h||, mu and S the mean and 1/N covariance of the unit train rows."""

    label = "SSD"
    reference_code = "OpenOOD openood/postprocessors/ssd_postprocessor.py"
    family = "posthoc"
    fits_from_shards = True  # sums over rows: each process may fit its shard (streaming.across_processes)
    inputs = frozenset({"features"})
    paper = "Sehwag et al., SSD: A Unified Framework for Self-Supervised Outlier Detection, ICLR 2021"

    @dataclass(frozen=True)
    class Params(Params):
        normalize: bool = param(True, "unit-normalise the features first (SSD's eval_ssd.py; OpenOOD's SimClrNet "
                                "returns them normalised)")

    def _rows(self, block: np.ndarray) -> np.ndarray:
        return unit_rows(block) if self.params["normalize"] else np.asarray(block, dtype=np.float64)

    def _fit(self, id_train: FeatureSet, *, id_val=None, ood_val=None) -> None:
        h = stored_features(id_train, self.name)
        total = np.zeros(h.shape[1])
        for _, block in streaming.chunks(h):
            total += self._rows(block).sum(axis=0)
        total, count = streaming.reduce_sum(total, np.array(len(h)))
        if int(count) == 0:
            raise ValueError("ssd: the training set has no rows")
        self.mean = total / count
        scatter = np.zeros((h.shape[1], h.shape[1]))
        for _, block in streaming.chunks(h):
            centred = self._rows(block) - self.mean
            scatter += centred.T @ centred
        (scatter,) = streaming.reduce_sum(scatter)
        self.precision = spd_inverse(scatter / count)

    def _score(self, batch) -> np.ndarray:
        def rows(_, block: np.ndarray) -> np.ndarray:
            return -min_squared_mahalanobis(self._rows(block), self.mean[None], self.precision, desc=self.name)

        return streaming.map_rows(rows, stored_features(batch, self.name))

    def state(self) -> dict[str, np.ndarray]:
        return {**super().state(), "mean": self.mean, "precision": self.precision}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        super().load_state(state)
        self.mean, self.precision = state["mean"], state["precision"]
