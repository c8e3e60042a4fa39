"""Makes oodd.json: the official OODD stream (priority-queue dictionary, k-th largest cosine) re-expressed on plain
arrays and run on fixed random features and base scores (no CLIP), for tests/detectors/clip/test_clip_oodd.py.

Source: zxk1212/OODD at commit edbb1a32e5fe81e443942156f0a9cafb0297d95b, NegLabel/tools/ood_test.py:92-98 (ScoreData:
the higher score is "less", so get() pops it), :100-129 (k-th largest per column via torch.kthvalue), :279-298 (per
batch: put each (score, feature), get() while over queue_size, then score - k-th largest similarity);
MCM/eval_ood_detection.py:60-104, 187-205 is the same loop on MCM scores. Here the stream is the rows in order (the
official first permutes the ID + OOD union with np.random.seed(110)); float32 as the official's cached features.

Run: `python tests/detectors/clip/golden/make_oodd_golden.py` (writes oodd.json next to it).
"""
from __future__ import annotations

import json
from pathlib import Path
from queue import PriorityQueue

import numpy as np
import torch

COMMIT = "edbb1a32e5fe81e443942156f0a9cafb0297d95b"


class ScoreData:
    def __init__(self, score, data):
        self.score, self.data = score, data

    def __lt__(self, other):
        return float(self.score) > float(other.score)


def kth_largest_per_column(matrix, k):
    values, _ = torch.kthvalue(matrix, matrix.size(0) - k + 1, dim=0)
    return values.cpu().numpy()


def official_stream(base: np.ndarray, feats: np.ndarray, queue_size: int, k: int, batch_size: int) -> np.ndarray:
    queue = PriorityQueue()
    out = []
    for start in range(0, len(base), batch_size):
        batch_data, batch_score = feats[start:start + batch_size], base[start:start + batch_size]
        for j in range(batch_score.shape[0]):
            queue.put(ScoreData(batch_score[j], batch_data[j]))
            if queue.qsize() > queue_size:
                queue.get()
        dictionary = np.array([item.data for item in list(queue.queue)])
        sims = torch.tensor(dictionary) @ torch.tensor(batch_data).T
        out.append(batch_score - kth_largest_per_column(sims, k))
    return np.concatenate(out)


def inputs() -> dict[str, np.ndarray]:
    """40 unit features in 8 dimensions (float32) and base scores rounded to 0.1 (ties in the queue's order)."""
    rng = np.random.default_rng(110)
    feats = rng.normal(size=(40, 8)).astype(np.float32)
    feats /= np.linalg.norm(feats, axis=1, keepdims=True) + 1e-10
    base = np.round(rng.uniform(0, 1, 40), 1).astype(np.float32)
    return {"feats": feats, "base": base}


CONFIGS = {"q10_k3_b8": (10, 3, 8), "q10_k5_b8": (10, 5, 8), "q64_k5_b6": (64, 5, 6), "q7_k1_b5": (7, 1, 5)}


def main() -> None:
    x = inputs()
    out: dict = {"commit": COMMIT}
    for name, (queue_size, k, batch) in CONFIGS.items():
        out[name] = {"queue_size": queue_size, "k": k, "batch_size": batch,
                     "scores": official_stream(x["base"], x["feats"], queue_size, k, batch).astype(float).tolist()}
    path = Path(__file__).with_name("oodd.json")
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
