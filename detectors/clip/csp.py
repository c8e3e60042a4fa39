"""CSP, the Conjugated Semantic Pool (Chen et al., NeurIPS 2024): NegLabel whose adjective negatives are replaced by
"conjugated" labels, an adjective modifying a superclass word ("wooden object", "sunny scene"), each a prompt
ensemble; the score is NegLabel's (ID mass in a softmax over ID and negative labels, averaged over groups).

Reference: MengyuanChen21/NeurIPS2024-CSP at 3a7bdab, mmcls/models/classifiers/multi_modal.py (corpus, prompt
ensembles, selection), mmcls/models/classifiers/class_names.py:1074-1107 (templates), mmcls/models/ood/clip_ood.py
(grouping and score), custom_config/clip-ViT-B16.py (defaults).
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from detectors.clip import scores
from detectors.clip.neglabel import NegLabel
from detectors.clip.wordnet import NEGLABEL_EXCLUDED
from detectors.registry import register_detector
from pipelines.params import param

# class_names.py:1074-1083, the ensemble of the ID classes and of the noun negatives
NOUN_TEMPLATES = ("a close-up photo of the nice {}.", "a photo with the nice {}.", "a good photo with the nice {}.",
                  "a photo of the nice {}.", "{}", "the {}", "the good {}", "the nice {}")
# class_names.py:1085-1100, the superclass words an adjective is conjugated with (one drawn per adjective)
SUPERCLASS_TEMPLATES = ("{} environment", "{} space", "{} object", "{} scene", "{} place", "{} item", "{} area",
                        "{} view", "{} thing", "{} pattern", "{} structure", "{} landscape", "{} vista", "{} creature")
# class_names.py:1102-1107, the ensemble of a conjugated label
CONJUGATE_TEMPLATES = ("{}", "a nice photo of {}", "a good photo of {}", "a close-up photo of {}")
# custom_config/clip-ViT-B16.py:23-25 leaves these files out, on top of the two NegLabel's lists lack
CSP_EXCLUDED = NEGLABEL_EXCLUDED + ("noun.person", "noun.quantity", "noun.group", "adj.pert")


def conjugate(adjectives: list[str], superclasses: tuple[str, ...] = SUPERCLASS_TEMPLATES, seed: int = 0) -> list[str]:
    """One conjugated label per adjective: a superclass template drawn with Python's `random.choice` after
    `random.seed(seed)`, in the adjectives' order (multi_modal.py:87-88, 111)."""
    rng = random.Random(seed)
    return [rng.choice(superclasses).format(a) for a in adjectives]


def mine_csp(candidate_text: torch.Tensor, class_text: torch.Tensor, fraction: float = 0.15,
             percentile: float = 0.95, max_sim: float = 0.95, chunk: int = 1000) -> torch.Tensor:
    """Indices of the negatives kept from one part (multi_modal.py:160-180): candidates ranked by the `percentile`
    quantile of their cosines to the ID classes, lowest first, a candidate whose largest cosine exceeds `max_sim`
    ranked last (its key set to 1); the first int(n * fraction). Ties keep the candidates' order (the official
    CUDA argsort leaves them unspecified)."""
    keys = []
    for s in range(0, len(candidate_text), chunk):
        sim = candidate_text[s:s + chunk].float() @ class_text.float().T
        key = torch.quantile(sim, q=percentile, dim=-1)
        key[sim.amax(dim=1) > max_sim] = 1.0
        keys.append(key)
    order = torch.cat(keys).argsort(stable=True) if keys else torch.zeros(0, dtype=torch.long)
    return order[: int(len(order) * fraction)]


@register_detector("csp")
class CSP(NegLabel):
    """Defaults as the official code and config: WordNet 3.0 nouns (every noun file except noun.animal, noun.food,
    noun.person, noun.quantity and noun.group) and adjectives (adj.all, adj.ppl); ID classes and nouns embedded as
    the mean of the raw embeddings of 8 prompts, renormalised; each adjective conjugated with one of 14 superclass
    words (Python `random`, seed 0) and embedded as the mean over 4 prompts; per part the 15% of candidates with the
    lowest 0.95-quantile cosine to the ID classes (those with a cosine above 0.95 last); score as NegLabel's at
    T = 0.01 (logits 100 cos, t = 1), 100 groups, seed 0. `words` / `adjectives` replace WordNet as in NegLabel;
    NegLabel's `adj_template` is unused (conjugated labels take `conjugate_templates`)."""

    label = "CSP"
    paper = ("Chen et al., Conjugated Semantic Pool Improves OOD Detection with Pre-trained Vision-Language Models, "
             "NeurIPS 2024")
    reference_code = "MengyuanChen21/NeurIPS2024-CSP mmcls/models/classifiers/multi_modal.py"

    @dataclass(frozen=True)
    class Params(NegLabel.Params):
        templates: list[str] | None = param(list(NOUN_TEMPLATES), "ID-class and noun prompt ensemble")
        superclass_templates: list[str] = param(list(SUPERCLASS_TEMPLATES), "superclass words conjugated with an "
                                                "adjective ('{}' = the adjective)")
        conjugate_templates: list[str] = param(list(CONJUGATE_TEMPLATES), "prompt ensemble of a conjugated label")
        conjugate_seed: int = param(0, "seed of Python's random.choice of each adjective's superclass word")
        wordnet_exclude: list[str] = param(list(CSP_EXCLUDED), "WordNet lexicographer files left out")
        max_sim: float = param(0.95, "a candidate with a cosine above this to an ID class is ranked last", le=1)

    def ensemble(self, words: list[str], templates: list[str]) -> torch.Tensor:
        """Normalised [W,P]: per word the mean of its prompts' raw (unnormalised) embeddings, renormalised, as the
        official code (multi_modal.py:66-70, 137-141)."""
        if not words:
            return torch.zeros(0, self.backbone.model.config.projection_dim)
        texts = [t.format(w) for w in words for t in templates]
        raw = self.backbone.encode_texts(texts, normalize=False).cpu()
        return F.normalize(raw.view(len(words), len(templates), -1).mean(1), dim=-1)

    def class_text(self) -> torch.Tensor:
        if "classes" not in self._text_cache:
            self._text_cache["classes"] = self.ensemble(self.require_classes(), self.params["templates"])
        return self._text_cache["classes"]

    def negative_text(self) -> torch.Tensor:
        """Normalised embeddings [M,P] of the kept nouns then conjugated labels (mined on first use)."""
        if "negatives" in self._text_cache:
            return self._text_cache["negatives"]
        p = self.params
        nouns, adjectives = self.candidates()
        conjugated = conjugate(adjectives, tuple(p["superclass_templates"]), p["conjugate_seed"])
        words, texts = [], []
        fraction = self.fraction(len(nouns) + len(adjectives))
        for part, templates in ((nouns, p["templates"]), (conjugated, p["conjugate_templates"])):
            emb = self.ensemble(part, templates)
            if p["mine"]:
                keep = mine_csp(emb, self.class_text(), fraction, p["percentile"], p["max_sim"])
                part, emb = [part[i] for i in keep.tolist()], emb[keep]
            words += part
            texts.append(emb)
        self._negatives = words
        self._text_cache["negatives"] = torch.cat(texts)
        return self._text_cache["negatives"]

    def _score(self, batch: Any) -> np.ndarray:
        p = self.params
        return scores.neglabel(self.features(batch).global_, self.class_text(), self.negative_text(),
                               p["temperature"], self.groups(), p["seed"])
