"""OODD (Yang et al., CVPR 2025): a test-time OOD dictionary. A priority queue keeps the features of the test images
with the lowest base scores seen so far (the most OOD-like); an image's score is its base score minus its k-th
largest cosine to the queue. Zero-shot CLIP variants: NegLabel + OODD (`oodd`) and MCM + OODD (`mcm_oodd`).

Reference: zxk1212/OODD at edbb1a3, NegLabel/tools/ood_test.py:92-129, 260-298 (NegLabel + OODD) and
MCM/eval_ood_detection.py:60-104, 168-205 (MCM + OODD; MCM from MCM/utils/detection_util.py:311-337).

Stream order: every `score` call is one stream over its images in the order given, from an empty queue, in batches
of `batch_size` (a batch's images enter the queue first, then the batch is scored against it, as the official code).
The harness scores the ID test set and each OOD set in separate calls, so each is its own stream; the official scores
one union of the ID test set and one OOD set, permuted with np.random.seed(110), the queue emptied per OOD set. To
run that protocol, score one ImageSet holding both sets in a shuffled order and split the scores.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from detectors.clip import scores
from detectors.clip.mcm import MCM
from detectors.clip.neglabel import NegLabel
from detectors.registry import register_detector
from pipelines.params import Params, param


class _Entry:
    """A queue entry ordered as the official `ScoreData` (ood_test.py:92-98): "less" is the higher score, so the
    heap's head, the one popped, is the highest base score. Python's heapq is what `queue.PriorityQueue` runs, so ties
    resolve as there."""

    __slots__ = ("score", "row")

    def __init__(self, score: float, row: int) -> None:
        self.score, self.row = score, row

    def __lt__(self, other: _Entry) -> bool:
        return self.score > other.score


def oodd_stream(base: np.ndarray, feats: torch.Tensor, queue_size: int = 2048, k: int = 5,
                batch_size: int = 64) -> np.ndarray:
    """OODD scores [N] of a stream (rows in order): per batch, each image's (base score, feature) pushed on the queue,
    the highest base score popped whenever it holds more than `queue_size`; then score = base - the k-th largest
    cosine of the image to the queue's features (k capped at the queue's length; the official needs >= k). float64;
    `feats` are normalised here."""
    feats = F.normalize(feats.double(), dim=-1)
    base = np.asarray(base, dtype=np.float64)
    heap: list[_Entry] = []
    out = []
    for s in range(0, len(base), batch_size):
        for j in range(s, min(s + batch_size, len(base))):
            heapq.heappush(heap, _Entry(float(base[j]), j))
            if len(heap) > queue_size:
                heapq.heappop(heap)
        dictionary = feats[[e.row for e in heap]]
        sims = dictionary @ feats[s:s + batch_size].T  # [Q, B]
        kth = sims.topk(min(k, len(heap)), dim=0).values[-1]
        out.append(base[s:s + batch_size] - kth.numpy())
    return np.concatenate(out) if out else np.zeros(0)


@dataclass(frozen=True)
class OODDParams(Params):
    """The dictionary settings both variants share (ood_test.py:261, 273, 294)."""

    queue_size: int = param(2048, "features kept in the OOD dictionary (lowest base scores)", ge=1)
    k: int = param(5, "the k-th largest cosine to the dictionary is subtracted", ge=1)
    batch_size: int = param(64, "images per queue update (a batch enters the queue, then is scored)", ge=1)


@register_detector("oodd")
class OODD(NegLabel):
    """NegLabel + OODD: NegLabel's score with its defaults, minus the 5th largest cosine of the image to a queue of
    the 2048 stream features with the lowest NegLabel scores, queue updated per batch of 64."""

    label = "OODD"
    paper = ("Yang et al., OODD: Test-time Out-of-Distribution Detection with Dynamic Dictionary, CVPR 2025 "
             "(NegLabel + OODD)")
    reference_code = "zxk1212/OODD NegLabel/tools/ood_test.py"

    @dataclass(frozen=True)
    class Params(OODDParams, NegLabel.Params):
        pass

    def _score(self, batch: Any) -> np.ndarray:
        p = self.params
        g = self.features(batch).global_
        base = scores.neglabel(g, self.class_text(), self.negative_text(), p["temperature"], self.groups(), p["seed"])
        return oodd_stream(base, g, p["queue_size"], p["k"], p["batch_size"])


@register_detector("mcm_oodd")
class MCMOODD(MCM):
    """MCM + OODD: MCM (prompt "a photo of a {}", T = 1) minus the 5th largest cosine of the image to a queue of the
    2048 stream features with the lowest MCM scores, queue updated per batch of 64."""

    label = "MCM+OODD"
    paper = ("Yang et al., OODD: Test-time Out-of-Distribution Detection with Dynamic Dictionary, CVPR 2025 "
             "(MCM + OODD)")
    reference_code = "zxk1212/OODD MCM/eval_ood_detection.py"

    @dataclass(frozen=True)
    class Params(OODDParams, MCM.Params):
        pass

    def _score(self, batch: Any) -> np.ndarray:
        g = self.features(batch).global_
        base = scores.mcm(g, self.class_text(), self.params["temperature"])
        return oodd_stream(base, g, self.params["queue_size"], self.params["k"], self.params["batch_size"])
