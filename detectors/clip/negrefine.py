"""NegRefine (Ansari et al., ICCV 2025): CSP's negative labels filtered by an LLM (subcategories and proper nouns of
the ID classes removed), scored by NegLabel's grouped ID mass plus 2 x a multi-matching score: per image, its top ID
labels joined with its top negative labels ("dog and fence"), each pair's logit against the negative label's alone,
the largest sigmoid kept.

The LLM filter (Qwen2.5-14B-Instruct in the official code) is not run here: give the filtered labels
(`negative_nouns` and `negative_adjectives`, the latter conjugated labels such as "wooden object"; the official
repository ships ImageNet's as output/imagenet/seed_0/neg_labels_{noun,adj}.pkl), else the unfiltered initial
labels (CSP's selection with NegRefine's settings) are used, with a warning.

Reference: ah-ansari/NegRefine at 72e4b82, src/clip_ood.py:36-208 (labels, embeddings, scores), src/create_negs.py
(initial labels), src/neg_filter.py (the LLM filter), scripts/imagenet.sh.
"""
from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from detectors.clip import scores
from detectors.clip.csp import CSP
from detectors.registry import register_detector
from pipelines.params import param


def multi_matching(image: torch.Tensor, pos_logits: torch.Tensor, neg_logits: torch.Tensor,
                   pos_labels: Sequence[str], neg_labels: Sequence[str], embed: Callable[[list[str]], torch.Tensor],
                   k_pos: int = 5, k_neg: int = 5, scale: float = 100.0) -> np.ndarray:
    """Multi-matching scores [N] (clip_ood.py:168-191): per image the top min(k_pos, C) ID labels and top k_neg
    negative labels by logit, the texts "<ID label> and <negative label>" embedded by `embed` (normalised [T,P]),
    s = max over pairs of exp(a) / (exp(a) + exp(b)) = sigmoid(a - b), a = scale cos(image, pair), b = the negative
    label's logit; float64. k_neg is capped at the number of negatives (the official needs >= 5)."""
    k_pos, k_neg = min(k_pos, pos_logits.shape[1]), min(k_neg, neg_logits.shape[1])
    if not len(image) or not k_neg:
        return np.zeros(len(image))
    top_pos = pos_logits.topk(k_pos, dim=1).indices
    neg_vals, top_neg = neg_logits.topk(k_neg, dim=1)
    texts = [[f"{pos_labels[p]} and {neg_labels[n]}" for p in top_pos[i].tolist() for n in top_neg[i].tolist()]
             for i in range(len(image))]
    unique = list(dict.fromkeys(t for row in texts for t in row))
    table = dict(zip(unique, embed(unique).double()))
    image = F.normalize(image.double(), dim=-1)
    out = []
    for i, row in enumerate(texts):
        pair = scale * torch.stack([table[t] for t in row]) @ image[i]  # [k_pos * k_neg], ID label major
        out.append(torch.sigmoid(pair - neg_vals[i].double().repeat(k_pos)).max())
    return torch.stack(out).numpy()


@register_detector("negrefine")
class NegRefine(CSP):
    """Defaults as the official code: CSP's prompt ensembles, corpus and conjugation; initial labels kept by the
    largest cosine to the ID classes (`percentile=1`, create_negs.py:12), ID class names removed from the nouns,
    15% per part; score = NegLabel's grouped ID mass (100 groups, logits 100 cos) + 2 x the multi-matching score over
    the top 5 ID and top 5 negative labels. `negative_nouns` / `negative_adjectives`: the LLM-filtered labels."""

    label = "NegRefine"
    paper = "Ansari et al., NegRefine: Refining Negative Label-Based Zero-Shot OOD Detection, ICCV 2025"
    reference_code = "ah-ansari/NegRefine src/clip_ood.py"

    @dataclass(frozen=True)
    class Params(CSP.Params):
        percentile: float = param(1.0, "quantile of a candidate's cosines to the ID classes (1: the largest)", ge=0,
                                  le=1)
        drop_class_names: bool = param(True, "remove the ID class names from the candidate nouns")
        negative_nouns: list[str] | None = param(None, "the LLM-filtered negative nouns (skips the selection)")
        negative_adjectives: list[str] | None = param(None, "the LLM-filtered conjugated labels ('wooden object')")
        k_pos: int = param(5, "top ID labels paired per image (capped at the number of classes)", ge=1)
        k_neg: int = param(5, "top negative labels paired per image", ge=1)
        mm_weight: float = param(2.0, "weight of the multi-matching score", ge=0)

    def negative_text(self) -> torch.Tensor:
        """The filtered labels' embeddings when given (nouns, then conjugated labels), else CSP's selection with
        NegRefine's settings (unfiltered: a warning)."""
        if "negatives" in self._text_cache:
            return self._text_cache["negatives"]
        p = self.params
        if p["negative_nouns"] is None and p["negative_adjectives"] is None:
            warnings.warn("negrefine: no LLM-filtered negative labels given (negative_nouns / negative_adjectives); "
                          "scoring with the unfiltered initial labels", stacklevel=2)
            return super().negative_text()
        nouns, adjectives = list(p["negative_nouns"] or []), list(p["negative_adjectives"] or [])
        self._negatives = nouns + adjectives
        self._text_cache["negatives"] = torch.cat([self.ensemble(nouns, p["templates"]),
                                                   self.ensemble(adjectives, p["conjugate_templates"])])
        return self._text_cache["negatives"]

    def pair_text(self, texts: list[str]) -> torch.Tensor:
        """Ensemble embeddings of multi-matching texts (the noun prompts, clip_ood.py:184), cached per text."""
        cache = self.__dict__.setdefault("_pairs", {})
        new = [t for t in texts if t not in cache]
        if new:
            cache.update(zip(new, self.ensemble(new, self.params["templates"])))
        return torch.stack([cache[t] for t in texts])

    def _score(self, batch: Any) -> np.ndarray:
        p = self.params
        g = self.features(batch).global_
        pos, neg = self.class_text(), self.negative_text()
        base = scores.neglabel(g, pos, neg, p["temperature"], self.groups(), p["seed"])
        logits = scores.cosine(g, torch.cat([pos, neg])).double() / p["temperature"]
        n_cls = pos.shape[0]
        mm = multi_matching(g, logits[:, :n_cls], logits[:, n_cls:], self.require_classes(), self.negative_words,
                            self.pair_text, p["k_pos"], p["k_neg"], 1.0 / p["temperature"])
        return base + p["mm_weight"] * mm
