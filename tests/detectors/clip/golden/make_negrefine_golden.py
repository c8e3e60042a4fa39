"""Makes negrefine.json: the official NegRefine score (NegLabel grouping + 2 x multi-matching) re-expressed on plain
torch tensors, one image at a time as the official, with a stand-in text encoder (a fixed random vector per exact
string, seeded by its CRC-32), for tests/detectors/clip/test_clip_negrefine.py to compare against.

Source: ah-ansari/NegRefine at commit 72e4b82d8d48ae298ceabbb3322ac13799cd0c88, src/clip_ood.py:105-124 (prompt
ensemble: mean of raw embeddings, renormalised), :127-165 (NegLabel grouping, permutation after torch.manual_seed(0),
here drawn on the CPU), :168-191 (multi-matching), :195-208 (score = NegLabel + 2 x multi-matching).

Run: `python tests/detectors/clip/golden/make_negrefine_golden.py` (writes negrefine.json next to it).
"""
from __future__ import annotations

import json
import zlib
from pathlib import Path

import torch

COMMIT = "72e4b82d8d48ae298ceabbb3322ac13799cd0c88"
NOUN_TEMPLATES = ["a close-up photo of the nice {}.", "a photo with the nice {}.", "a good photo with the nice {}.",
                  "a photo of the nice {}.", "{}", "the {}", "the good {}", "the nice {}"]
DIM = 128
POS_LABELS = ["cat", "dog", "car", "cup", "tree", "boat"]
NEG_LABELS = [f"neg{i}" for i in range(12)]


def fake_encode_text(texts: list[str]) -> torch.Tensor:
    """A fixed random raw embedding per exact string."""
    return torch.stack([torch.randn(DIM, generator=torch.Generator().manual_seed(zlib.crc32(t.encode())))
                        for t in texts])


class OfficialNegRefine:
    """CLIPood's scoring on given label features, with `fake_encode_text` standing in for CLIP's text tower."""

    def __init__(self, pos_features, neg_features, ngroup, k_pos=5, k_neg=5):
        self.pos_features, self.neg_features = pos_features, neg_features
        self.pos_labels, self.neg_labels = POS_LABELS, NEG_LABELS
        self.noun_prompt_templates = NOUN_TEMPLATES
        self.k_pos, self.k_neg = min(k_pos, len(POS_LABELS)), k_neg
        self.ngroup, self.group_fuse_num = ngroup, None

    def _embed_text_labels(self, labels, prompt_templates):
        texts = [template.format(w) for w in labels for template in prompt_templates]
        features = fake_encode_text(texts)
        features = features.view(-1, len(prompt_templates), features.shape[-1]).mean(dim=1)
        features /= features.norm(dim=-1, keepdim=True)
        return features.to(torch.float32)

    def _grouping(self, pos, neg, ngroup):
        drop = neg.shape[1] % ngroup
        if drop > 0:
            neg = neg[:, :-drop]
        torch.manual_seed(0)
        idx = torch.randperm(neg.shape[1])
        negs = neg.T[idx].T.reshape(pos.shape[0], ngroup, -1).contiguous()
        scores = []
        for i in range(ngroup):
            full = torch.cat([pos, negs[:, i, :]], dim=-1).softmax(dim=-1)
            scores.append(full[:, :pos.shape[1]].sum(dim=-1).unsqueeze(-1))
        return torch.cat(scores, dim=-1).mean(dim=-1)

    def _neg_label_score(self, pos_sim, neg_sim):
        if self.ngroup > 1:
            return self._grouping(pos_sim, neg_sim, self.ngroup)
        return torch.cat([pos_sim, neg_sim], dim=-1).softmax(dim=-1)[:, :pos_sim.shape[1]].sum(dim=1)

    def _multi_matching_score(self, pos_sim, neg_sim, image_features):
        vals, ind = torch.topk(pos_sim, self.k_pos)
        top_pos_labels = [self.pos_labels[ind[0, i]] for i in range(self.k_pos)]
        vals, ind = torch.topk(neg_sim, self.k_neg)
        top_neg_labels = [self.neg_labels[ind[0, i]] for i in range(self.k_neg)]
        texts, neg_sims = [], []
        for p in top_pos_labels:
            for i, n in enumerate(top_neg_labels):
                neg_sims.append(vals[0, i])
                texts.append(p + " and " + n)
        features = self._embed_text_labels(texts, self.noun_prompt_templates)
        neg_sims = torch.tensor(neg_sims)
        sim = 100.0 * image_features @ features.T
        return torch.max(torch.exp(sim) / (torch.exp(sim) + torch.exp(neg_sims)))

    def detection_score(self, image_features):
        pos_sim = 100.0 * image_features @ self.pos_features.T
        neg_sim = 100.0 * image_features @ self.neg_features.T
        nl = self._neg_label_score(pos_sim, neg_sim)
        mm = self._multi_matching_score(pos_sim, neg_sim, image_features)
        return nl.item() + 2 * mm.item(), mm.item()


def inputs() -> dict[str, torch.Tensor]:
    """6 ID and 12 negative label features and 6 images in 128 dimensions (random cosines of about 0.1, so that
    logits of 100 cos neither saturate the sigmoids nor overflow the official exp() in float32)."""
    g = torch.Generator().manual_seed(72)
    unit = lambda x: x / x.norm(dim=-1, keepdim=True)  # noqa: E731
    pos, neg = unit(torch.randn(6, DIM, generator=g)), unit(torch.randn(12, DIM, generator=g))
    images = unit(torch.randn(6, DIM, generator=g))
    return {"pos": pos, "neg": neg, "images": images}


def main() -> None:
    x = inputs()
    out: dict = {"commit": COMMIT}
    for name, (ngroup, k_pos, k_neg) in {"g4": (4, 5, 5), "g1_k3_k2": (1, 3, 2)}.items():
        model = OfficialNegRefine(x["pos"], x["neg"], ngroup, k_pos, k_neg)
        rows = [model.detection_score(x["images"][i:i + 1]) for i in range(len(x["images"]))]
        out[name] = {"ngroup": ngroup, "k_pos": k_pos, "k_neg": k_neg, "score": [r[0] for r in rows],
                     "multi_matching": [r[1] for r in rows]}
    path = Path(__file__).with_name("negrefine.json")
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
