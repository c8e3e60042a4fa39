"""NegLabel (Jiang et al., ICLR 2024): zero-shot OOD detection with negative labels mined from WordNet as the words
least similar to the ID classes; score = ID probability mass in a softmax over ID and negative labels, averaged over
random groups of the negatives.

Reference: XueJiang16/NegLabel, mmcls/models/classifiers/multi_modal.py (corpus, templates, selection) and
mmcls/models/ood/clip_ood.py (grouping), custom_config/clip.py (defaults).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from detectors.clip import scores
from detectors.clip.common import ClipDetector
from detectors.clip.wordnet import NEGLABEL_EXCLUDED, neglabel_corpus
from detectors.registry import register_detector
from pipelines.params import param

NOUN_TEMPLATE = "the nice {}"          # the official prompt_templates[85], for ID classes and noun negatives
ADJ_TEMPLATE = "This is a {} photo"     # the official adjective template
PAPER_NEGATIVES = 10_000                # the paper's M (15% of WordNet's ~70,000 nouns + adjectives)


def read_words(path: Any) -> list[str]:
    """Words of a text file, one per line; blank lines and `#` comments skipped."""
    lines = Path(str(path)).read_text(encoding="utf-8").splitlines()
    return [w.strip() for w in lines if w.strip() and not w.lstrip().startswith("#")]


def mine_negatives(candidate_text: torch.Tensor, class_text: torch.Tensor, fraction: float = 0.15,
                   percentile: float = 0.95, chunk: int = 1000) -> torch.Tensor:
    """Indices of the negatives of one candidate part (nouns or adjectives): candidates ranked by the `percentile`
    quantile of their cosine similarities to the ID class embeddings, lowest first; the first int(n * fraction)."""
    quantiles = [torch.quantile(scores.cosine(candidate_text[s:s + chunk], class_text).double(), q=percentile, dim=1)
                 for s in range(0, len(candidate_text), chunk)]  # chunked: torch.quantile takes at most 16M values
    order = torch.cat(quantiles).argsort(stable=True) if quantiles else torch.zeros(0, dtype=torch.long)
    return order[: int(len(order) * fraction)]


@register_detector("neglabel")
class NegLabel(ClipDetector):
    """Defaults as the official code and config: corpus = WordNet 3.0 nouns (minus noun.animal and noun.food, as the
    official word lists) and adjectives, noun/ID prompt "the nice {}", adjective prompt "This is a {} photo";
    per part the 15% of candidates with the lowest 0.95-quantile similarity to the ID classes (~10,500 negatives);
    T = 0.01 (CLIP's logit scale 100); 100 groups, the remainder dropped, permuted with seed 0.

    `words` / `words_file` replace the WordNet nouns (then no adjectives unless `adjectives` is given); `n_negatives`
    (the paper's M) replaces `neg_fraction` by M / number of candidates; `mine=False` uses every candidate.
    """

    label = "NegLabel"
    reference_code = "XueJiang16/NegLabel mmcls/models/ood/clip_ood.py"
    paper = "Jiang et al., Negative Label Guided OOD Detection with Pretrained Vision-Language Models, ICLR 2024"

    @dataclass(frozen=True)
    class Params(ClipDetector.Params):
        templates: list[str] | None = param([NOUN_TEMPLATE], "noun and ID-class prompt")
        adj_template: str = param(ADJ_TEMPLATE, "adjective prompt")
        words: list[str] | None = param(None, "candidate negative nouns replacing WordNet's")
        words_file: str | None = param(None, "a file of candidate nouns, one per line")
        adjectives: list[str] | None = param(None, "candidate adjectives (with words / words_file)")
        wordnet_dir: str | None = param(None, "WordNet 3.0 database folder (None: the system's)")
        wordnet_exclude: list[str] = param(list(NEGLABEL_EXCLUDED), "WordNet lexicographer files left out")
        drop_class_names: bool = param(False, "remove the ID class names from the candidates")
        mine: bool = param(True, "keep the candidates least similar to the ID classes (False: all)")
        neg_fraction: float = param(0.15, "fraction of the candidates kept per part", gt=0, le=1)
        n_negatives: int | None = param(None, "the paper's M, replacing neg_fraction", ge=1)
        percentile: float = param(0.95, "quantile of a candidate's similarities to the ID classes", ge=0, le=1)
        temperature: float = param(0.01, "softmax temperature", gt=0)
        ngroup: int = param(100, "groups the negatives are split into", ge=1)
        seed: int = param(0, "seed of the group permutation")

    search_space = {"neg_fraction": [0.05, 0.15, 0.3]}

    def candidates(self) -> tuple[list[str], list[str]]:
        """(nouns, adjectives): WordNet's by default, else `words`/`words_file` (and `adjectives`); each word once;
        with `drop_class_names` the ID class names (case-insensitive) are removed."""
        p = self.params
        if p["words"] or p["words_file"]:
            nouns = list(p["words"] or read_words(p["words_file"]))
            adjectives = list(p["adjectives"] or [])
        else:
            nouns, adjectives = neglabel_corpus(p["wordnet_dir"], tuple(p["wordnet_exclude"]))
        nouns = list(dict.fromkeys(nouns))
        noun_set = set(nouns)
        adjectives = [w for w in dict.fromkeys(adjectives) if w not in noun_set]
        if p["drop_class_names"]:
            classes = {c.lower() for c in p["class_names"]}
            nouns, adjectives = ([w for w in nouns if w.lower() not in classes],
                                 [w for w in adjectives if w.lower() not in classes])
        if not nouns and not adjectives:
            raise ValueError("neglabel: the corpus holds no candidate negative label")
        return nouns, adjectives

    def fraction(self, n_candidates: int) -> float:
        """The share of each part kept: `neg_fraction`, or `n_negatives` / candidates."""
        if self.params["n_negatives"] is None:
            return float(self.params["neg_fraction"])
        return min(1.0, int(self.params["n_negatives"]) / max(1, n_candidates))

    @property
    def negative_words(self) -> list[str]:
        """The negative labels in use, nouns then adjectives (mined once)."""
        self.negative_text()
        return self._negatives

    def negative_text(self) -> torch.Tensor:
        """Normalised embeddings [M,P] of the negative labels (mined on first use)."""
        if "negatives" in self._text_cache:
            return self._text_cache["negatives"]
        p = self.params
        parts = [(w, t) for w, t in zip(self.candidates(), (p["templates"], [p["adj_template"]])) if w]
        words, texts = [], []
        n_candidates = sum(len(w) for w, _ in parts)
        fraction = self.fraction(n_candidates)
        for part, templates in parts:
            emb = self.backbone.encode_class_prompts(part, templates).cpu()
            if p["mine"]:
                keep = mine_negatives(emb, self.class_text(), fraction, p["percentile"])
                part, emb = [part[i] for i in keep.tolist()], emb[keep]
            words += part
            texts.append(emb)
        if len(words) < PAPER_NEGATIVES // 2:
            warnings.warn(f"neglabel: only {len(words)} negative labels from {n_candidates} candidates; the paper uses "
                          f"M = {PAPER_NEGATIVES:,} from WordNet's ~70,000 nouns and adjectives. For the paper's "
                          "setting "
                          f"install WordNet (apt-get install wordnet-base) and leave `words` unset.", stacklevel=2)
        self._negatives = words
        self._text_cache["negatives"] = torch.cat(texts)
        return self._text_cache["negatives"]

    def _score(self, batch: Any) -> np.ndarray:
        p = self.params
        return scores.neglabel(self.features(batch).global_, self.class_text(), self.negative_text(),
                               p["temperature"], self.groups(), p["seed"])

    def groups(self) -> int:
        """`ngroup` (100, official), at most the number of negatives."""
        return max(1, min(int(self.params["ngroup"]), len(self.negative_text())))
