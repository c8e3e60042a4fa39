"""NegLabel (Jiang et al., ICLR 2024): zero-shot OOD detection with negative labels mined from a large word list as
the words least similar to the ID classes; score = ID probability mass in a softmax over ID and negative labels,
averaged over random groups of the negatives."""
from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from detectors.clip import scores
from detectors.clip.common import CLIP_DEFAULTS, ClipDetector
from detectors.registry import register_detector


def default_words() -> list[str]:
    """The package's candidate word list (`detectors/clip/words.txt`, common English nouns)."""
    return read_words(resources.files("detectors.clip").joinpath("words.txt"))


def read_words(path: Any) -> list[str]:
    """Words of a text file, one per line; blank lines and `#` comments skipped."""
    lines = Path(str(path)).read_text(encoding="utf-8").splitlines()
    return [w.strip() for w in lines if w.strip() and not w.lstrip().startswith("#")]


def mine_negatives(candidate_text: torch.Tensor, class_text: torch.Tensor, fraction: float = 0.15,
                   percentile: float = 0.95) -> torch.Tensor:
    """Indices of the negative labels: candidates ranked by the `percentile` quantile of their cosine similarities
    to the ID class embeddings, lowest first; the first `fraction` of them (at least one) are kept."""
    sim = scores.cosine(candidate_text, class_text).double()
    distance_rank = torch.quantile(sim, q=percentile, dim=1).argsort()
    keep = max(1, int(len(distance_rank) * fraction))
    return distance_rank[:keep]


@register_detector("neglabel")
class NegLabel(ClipDetector):
    """`words`: candidate negative labels (default: the package word list); with `mine=False` they are used as given.
    Defaults as the official configuration: 15% of the candidates kept at the 0.95 similarity quantile, T = 0.01,
    groups of about 100 negatives (100 groups for the official 10,000)."""

    paper = "Jiang et al., Negative Label Guided OOD Detection with Pretrained Vision-Language Models, ICLR 2024"
    defaults = {**CLIP_DEFAULTS, "words": None, "words_file": None, "mine": True, "neg_fraction": 0.15,
                "percentile": 0.95, "temperature": 0.01, "ngroup": None, "seed": 0}
    search_space = {"neg_fraction": [0.05, 0.15, 0.3]}

    def candidate_words(self) -> list[str]:
        """Candidate words minus the ID class names (case-insensitive)."""
        p = self.params
        words: Sequence[str] = p["words"] or (read_words(p["words_file"]) if p["words_file"] else default_words())
        classes = {c.lower() for c in p["class_names"]}
        out = list(dict.fromkeys(w for w in words if w.lower() not in classes))
        if not out:
            raise ValueError("neglabel: no candidate negative word is left after removing the ID class names")
        return out

    @property
    def negative_words(self) -> list[str]:
        """The negative labels in use (mined once)."""
        self.negative_text()
        return self._negatives

    def negative_text(self) -> torch.Tensor:
        """Normalised embeddings [M,P] of the negative labels (mined on first use)."""
        if "negatives" not in self._text_cache:
            words = self.candidate_words()
            text = self.backbone.encode_class_prompts(words, self.params["templates"]).cpu()
            if self.params["mine"]:
                keep = mine_negatives(text, self.class_text(), self.params["neg_fraction"], self.params["percentile"])
                words, text = [words[i] for i in keep.tolist()], text[keep]
            self._negatives = words
            self._text_cache["negatives"] = text
        return self._text_cache["negatives"]

    def _score(self, batch: Any) -> np.ndarray:
        p = self.params
        return scores.neglabel(self.features(batch).global_, self.class_text(), self.negative_text(),
                               p["temperature"], self.groups(), p["seed"])

    def groups(self) -> int:
        """`ngroup`, or by default min(100, M // 100) groups of the M negatives (the official 100 groups of 100 of
        10,000 negatives; one group for short lists)."""
        if self.params["ngroup"] is not None:
            return int(self.params["ngroup"])
        return max(1, min(100, len(self.negative_text()) // 100))
