"""RELATION (Kim et al., NeurIPS 2023, the neural relation graph): the summed relation of a sample to the training set.

OpenOOD (`openood/postprocessors/relation_postprocessor.py`, from snu-mllab/Neural-Relation-Graph) banks every ID
training row's L2-normalised features (`:14-23`, sqrt(sum h^2 + 1e-10)) and softmax probabilities (`:106-112`); a
sample's relation to a banked row is max(<f, f_t>, 0) * <p, p_t> (`:26-44`), edges of magnitude at most 0.03 are cut
(`:73-74`, `thres` of `get_relation`, `:47`) and the score sums sign(r) |r|^pow over the bank (`:75`), with pow 1 and
the sweep 1, 2, 4, 6, 8 under APS (`configs/postprocessors/relation.yml:3, 5, 7`). The bank holds every training row:
scoring costs N_test x N_train products, computed here in blocks of test rows.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from detectors.base import Detector, FeatureSet
from detectors.posthoc import streaming
from detectors.posthoc.common import logits_of, softmax, stored_features
from detectors.registry import register_detector
from pipelines.params import Params, param

BLOCK_ENTRIES = 1 << 22
"""Relations held at once while scoring (test rows x banked rows): 16 MiB of float32."""


def unit_rows(h: np.ndarray) -> np.ndarray:
    """Rows over sqrt(sum h^2 + 1e-10), float32 (the reference's `normalize`; a zero row stays zero)."""
    h = np.asarray(h, dtype=np.float32)
    return h / np.sqrt(np.einsum("nd,nd->n", h, h) + np.float32(1e-10))[:, None]


def relation_sum(feat: np.ndarray, prob: np.ndarray, bank_feat: np.ndarray, bank_prob: np.ndarray, power: int,
                 threshold: float) -> np.ndarray:
    """sum over the bank of r^power where r = max(<f, f_t>, 0) <p, p_t> exceeds `threshold` (r >= 0, so the
    reference's sign(r) |r|^pow is r^pow), per row: products in float32 as there, the sum in float64."""
    out = np.empty(len(feat))
    rows = max(1, BLOCK_ENTRIES // max(1, len(bank_feat)))
    for start in range(0, len(feat), rows):
        stop = start + rows
        rel = np.maximum(feat[start:stop] @ bank_feat.T, np.float32(0)) * (prob[start:stop] @ bank_prob.T)
        rel = np.where(np.abs(rel) > np.float32(threshold), rel, np.float32(0))
        out[start:stop] = (rel.astype(np.float64) ** power).sum(axis=1)
    return out


@register_detector("relation")
class Relation(Detector):
    """s(x) = sum_t [r > 0.03] r^pow, r = max(<f(x), f(t)>, 0) <p(x), p(t)> over the ID training rows t (f unit-norm
    features, p softmax probabilities): a sample related to many training rows of its class scores high."""

    label = "RELATION"
    reference_code = "OpenOOD openood/postprocessors/relation_postprocessor.py"
    family = "posthoc"
    inputs = frozenset({"features", "logits"})
    paper = ("Kim et al., Neural Relation Graph: A Unified Framework for Identifying Label Noise and Outlier Data, "
             "NeurIPS 2023")

    @dataclass(frozen=True)
    class Params(Params):
        pow: int = param(1, "power of each kept relation (relation.yml:5)", ge=1)
        threshold: float = param(0.03, "relations of magnitude at most this are cut (get_relation's thres, "
                                 "relation_postprocessor.py:47)", ge=0)

    search_space = {"pow": [1, 2, 4, 6, 8]}  # configs/postprocessors/relation.yml:7 (APS_mode: True)

    def _fit(self, id_train: FeatureSet, *, id_val=None, ood_val=None) -> None:
        h = stored_features(id_train, self.name)
        if len(h) == 0:
            raise ValueError("relation: the training set has no rows to relate to")
        self.bank_feat = np.concatenate([unit_rows(block) for _, block in streaming.chunks(h)]).astype(np.float32)
        self.bank_prob = softmax(logits_of(id_train, self.name)).astype(np.float32)

    def _score(self, batch) -> np.ndarray:
        prob = softmax(logits_of(batch, self.name)).astype(np.float32)
        return streaming.map_rows(
            lambda rows, h: relation_sum(unit_rows(h), prob[rows], self.bank_feat, self.bank_prob, self.params["pow"],
                                         self.params["threshold"]),
            stored_features(batch, self.name))

    def state(self) -> dict[str, np.ndarray]:
        return {**super().state(), "bank_feat": self.bank_feat, "bank_prob": self.bank_prob}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        super().load_state(state)
        self.bank_feat, self.bank_prob = state["bank_feat"], state["bank_prob"]
