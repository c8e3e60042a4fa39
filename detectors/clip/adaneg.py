"""AdaNeg (Zhang & Zhang, NeurIPS 2024): test-time adaptive negative proxies. NegLabel-style negative labels, plus a
memory per label (ID class or negative label) of confident test features; each label's adaptive proxy is its text
embedding and stored features pooled; the score adds the grouped ID mass over the adaptive proxies to lambda times the
static (text-only) one.

Reference: YBZh/OpenOOD-VLM at 804f331, openood/postprocessors/ttaprompt_postprocessor.py:664-950
(TTAPromptPostprocessor_noadagap, "the adopted one"), openood/networks/clip_fixed_ood_prompt.py:538-707 (negative
labels and prompts), openood/networks/clip_for_wordnet_prepare.py:84-136 (corpus), scripts/ood/adaneg/imagenet.sh
(defaults), openood/evaluators/fsood_evaluator_clip.py:354-394 (the stream).

Stream order: the memory makes a score depend on the images scored before it. Here every `score` call is one stream
over its images in the order given, from an empty memory, in batches of `batch_size` (a batch first updates the
memory, then all its images are scored with it, as the official code). The harness scores the ID test set and each
OOD set in separate calls, so each is its own stream; the official evaluator instead streams a shuffled union of one
OOD set and the ID test set (unseeded `shuffle=True`, memory reset per OOD set). To run that protocol, score one
ImageSet holding both sets in a shuffled order and split the scores.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F

from detectors.clip.common import ClipDetector
from detectors.clip.neglabel import read_words
from detectors.clip.wordnet import NEGLABEL_EXCLUDED, neglabel_corpus
from detectors.registry import register_detector
from pipelines.params import param

ID_TEMPLATE = "The nice {}."         # get_templates('nice'), clip_fixed_ood_prompt.py:415-416, ID classes and nouns
ADJ_TEMPLATE = "This is a {} photo."  # clip_fixed_ood_prompt.py:646
SCORE_RULES = ("combine", "adaonly", "vanillaonly", "multiply")


def select_negatives(noun_text: torch.Tensor, adj_text: torch.Tensor, class_text: torch.Tensor,
                     n_negatives: int = 10_000, percentile: float = 0.95) -> tuple[torch.Tensor, torch.Tensor]:
    """(kept adjective indices, kept noun indices), clip_fixed_ood_prompt.py:566-584: M split between the parts in
    proportion to their sizes (adjectives int(M nA / (nA + nN)), nouns the rest); per candidate its sorted cosines to
    the ID classes read at index int(C * percentile); lowest first (ties in candidate order)."""
    n_adj, n_noun = len(adj_text), len(noun_text)
    adj_num = int(n_negatives * (n_adj / max(1, n_adj + n_noun)))
    col = int(class_text.shape[0] * percentile)

    def lowest(text: torch.Tensor, k: int) -> torch.Tensor:
        if not len(text):
            return torch.zeros(0, dtype=torch.long)
        key = (text.float() @ class_text.float().T).sort(dim=1).values[:, col]
        return key.argsort(stable=True)[:k]

    return lowest(adj_text, adj_num), lowest(noun_text, n_negatives - adj_num)


def group_permutation(n_neg: int, ngroup: int, seed: int = 0) -> torch.Tensor:
    """The negatives' grouping order (ttaprompt_postprocessor.py:788-801): the last n_neg % ngroup dropped, the rest
    permuted by torch.randperm after torch.manual_seed(seed) (a CPU draw, as the official)."""
    keep = n_neg - n_neg % ngroup
    return torch.randperm(keep, generator=torch.Generator().manual_seed(seed))


def grouped_id_mass(logits: torch.Tensor, n_cls: int, ngroup: int, order: torch.Tensor) -> torch.Tensor:
    """Mean over `ngroup` groups of the ID mass of softmax([ID logits, one group's negative logits]) (:802-809)."""
    neg = logits[:, n_cls:][:, order].reshape(len(logits), ngroup, len(order) // ngroup)
    full = torch.cat([logits[:, None, :n_cls].expand(-1, ngroup, -1), neg], dim=-1)
    return torch.softmax(full, dim=-1)[..., :n_cls].sum(-1).mean(-1)


@dataclass
class Memory:
    """Per label (ID classes then negatives) `1 + length` slots: its text embedding, then stored test features (the
    last slot stays empty, as the official fills slots 1..length-1 and then replaces), and their entropies."""

    feats: torch.Tensor
    entropy: torch.Tensor
    filled: torch.Tensor

    @classmethod
    def empty(cls, text: torch.Tensor, length: int) -> Memory:
        feats = torch.zeros(text.shape[0], length + 1, text.shape[1], dtype=text.dtype)
        feats[:, 0] = text
        return cls(feats, torch.zeros(text.shape[0], length + 1, dtype=text.dtype),
                   torch.ones(text.shape[0], dtype=torch.long))

    def insert(self, label: int, feat: torch.Tensor, entropy: torch.Tensor) -> None:
        """Append while slots remain, else replace the highest-entropy slot if its entropy exceeds this one's
        (ttaprompt_postprocessor.py:825-837); among tied highest entropies the last slot."""
        length = self.feats.shape[1] - 1
        if self.filled[label] == length:
            if not (entropy < self.entropy[label]).any():
                return
            slot = int(torch.sort(self.entropy[label], stable=True).indices[-1])
        else:
            slot = int(self.filled[label])
            self.filled[label] += 1
        self.feats[label, slot] = feat
        self.entropy[label, slot] = entropy


def entropy_of(logits: torch.Tensor) -> torch.Tensor:
    """-sum p log(p + 1e-8) of softmax(logits) per row (:822)."""
    p = torch.softmax(logits, dim=-1)
    return -(p * torch.log(p + 1e-8)).sum(-1)


def adaneg_stream(image: torch.Tensor, text: torch.Tensor, n_cls: int, scale: float = 100.0, ngroup: int = 5,
                  seed: int = 0, memory_length: int = 10, thres: float = 0.5, gap: float = 0.5, lam: float = 0.1,
                  beta: float = 5.0, sample_adaptive: bool = False, score_rule: str = "combine",
                  batch_size: int = 256) -> np.ndarray:
    """AdaNeg scores [N] of `image` [N,D] scored as one stream in row order (ttaprompt_postprocessor.py:768-950), `text`
    [C+M,D] the ID class then negative label embeddings; float64. Per batch: the static score s0 (grouped ID mass of
    scale * cos over the text embeddings); images with s0 > thres + gap (1 - thres) stored under their predicted ID
    class (entropy of the ID softmax), then those with s0 < thres - gap * thres under their nearest negative label
    (entropy of the negative softmax); proxies = each label's slots averaged (or, with `sample_adaptive`, weighted by
    exp(-beta (1 - cos)) to each image), renormalised; s = grouped ID mass over the proxies; "combine" gives
    s + lam * s0."""
    if score_rule not in SCORE_RULES:
        raise ValueError(f"adaneg: score_rule must be one of {SCORE_RULES}, got {score_rule!r}")
    image, text = F.normalize(image.double(), dim=-1), F.normalize(text.double(), dim=-1)
    n_neg = text.shape[0] - n_cls
    ngroup = max(1, min(ngroup, n_neg)) if n_neg else 1
    order = group_permutation(n_neg, ngroup, seed)
    memory = Memory.empty(text, memory_length)
    out = []
    for s in range(0, len(image), batch_size):
        x = image[s:s + batch_size]
        logits = scale * x @ text.T
        vanilla = grouped_id_mass(logits, n_cls, ngroup, order)
        id_pred, id_entropy = logits[:, :n_cls].argmax(1), entropy_of(logits[:, :n_cls])
        for i in torch.nonzero(vanilla > thres + gap * (1 - thres)).flatten().tolist():
            memory.insert(int(id_pred[i]), x[i], id_entropy[i])
        if n_neg:
            neg_pred, neg_entropy = logits[:, n_cls:].argmax(1), entropy_of(logits[:, n_cls:])
            for i in torch.nonzero(vanilla < thres - gap * thres).flatten().tolist():
                memory.insert(n_cls + int(neg_pred[i]), x[i], neg_entropy[i])
        if sample_adaptive:
            weights = torch.exp(-beta * (1.0 - memory.feats @ x.T))  # [K, L, B]
            proxies = F.normalize(torch.einsum("klb,kld->bkd", weights, memory.feats), dim=-1)
            ada_logits = scale * (x[:, None, :] * proxies).sum(-1)
        else:
            ada_logits = scale * x @ F.normalize(memory.feats.mean(1), dim=-1).T
        ada = grouped_id_mass(ada_logits, n_cls, ngroup, order)
        out.append({"combine": ada + lam * vanilla, "adaonly": ada, "vanillaonly": vanilla,
                    "multiply": ada * vanilla}[score_rule])
    return torch.cat(out).numpy() if out else np.zeros(0)


@register_detector("adaneg")
class AdaNeg(ClipDetector):
    """Defaults as the official ImageNet script (scripts/ood/adaneg/imagenet.sh, the first run, samada False):
    M = 10,000 negative labels from WordNet (NegLabel's corpus, ID class names removed), ID classes and nouns "The
    nice {}.", adjectives "This is a {} photo.", selected by the 0.95 point of the sorted cosines to the ID classes;
    logits 100 cos; 5 groups, permuted with seed 0; memory of 10 slots per label; thresholds thres 0.5, gap 0.5
    (store as ID above 0.75, as negative below 0.25); lambda 0.1; beta 5 (the script's 5.5 through the official
    int()); score "combine"; batches of 256 (the script's test batch size)."""

    label = "AdaNeg"
    paper = ("Zhang & Zhang, AdaNeg: Adaptive Negative Proxy Guided OOD Detection with Vision-Language Models, "
             "NeurIPS 2024")
    reference_code = "YBZh/OpenOOD-VLM openood/postprocessors/ttaprompt_postprocessor.py"
    aliases = {"ttapromptnoadagap": "OpenOOD-VLM's"}

    @dataclass(frozen=True)
    class Params(ClipDetector.Params):
        templates: list[str] | None = param([ID_TEMPLATE], "ID-class and noun prompt")
        adj_template: str = param(ADJ_TEMPLATE, "adjective prompt")
        words: list[str] | None = param(None, "candidate negative nouns replacing WordNet's")
        words_file: str | None = param(None, "a file of candidate nouns, one per line")
        adjectives: list[str] | None = param(None, "candidate adjectives (with words / words_file)")
        wordnet_dir: str | None = param(None, "WordNet 3.0 database folder (None: the system's)")
        wordnet_exclude: list[str] = param(list(NEGLABEL_EXCLUDED), "WordNet lexicographer files left out")
        n_negatives: int = param(10_000, "negative labels M (ood_number)", ge=0)
        percentile: float = param(0.95, "point of a candidate's sorted cosines to the ID classes", ge=0, lt=1)
        temperature: float = param(0.01, "softmax temperature (CLIP's logit scale 100)", gt=0)
        ngroup: int = param(5, "groups the negatives are split into (group_num)", ge=1)
        seed: int = param(0, "seed of the group permutation")
        memory_length: int = param(10, "memory slots per label (memleng)", ge=1)
        thres: float = param(0.5, "threshold on the static score", ge=0, le=1)
        gap: float = param(0.5, "margin around thres outside which a test feature is stored", ge=0, le=1)
        lam: float = param(0.1, "weight of the static score (lambdaval)", ge=0)
        beta: float = param(5.0, "sharpness of the sample-adaptive weights exp(-beta (1 - cos))", ge=0)
        sample_adaptive: bool = param(False, "pool the memory with per-image weights (samada)")
        score_rule: Literal["combine", "adaonly", "vanillaonly", "multiply"] = param(
            "combine", "s + lam s0, s, s0 or s * s0 (in_score)")
        batch_size: int = param(256, "images per memory update (a batch is stored, then scored)", ge=1)

    def candidates(self) -> tuple[list[str], list[str]]:
        """(nouns, adjectives): WordNet's by default, else `words`/`words_file` (and `adjectives`); each word once;
        the ID class names removed (clip_for_wordnet_prepare.py:121-125)."""
        p = self.params
        if p["words"] or p["words_file"]:
            nouns = list(p["words"] or read_words(p["words_file"]))
            adjectives = list(p["adjectives"] or [])
        else:
            nouns, adjectives = neglabel_corpus(p["wordnet_dir"], tuple(p["wordnet_exclude"]))
        classes = set(self.require_classes())
        nouns = [w for w in dict.fromkeys(nouns) if w not in classes]
        noun_set = set(nouns)
        adjectives = [w for w in dict.fromkeys(adjectives) if w not in classes and w not in noun_set]
        return nouns, adjectives

    @property
    def negative_words(self) -> list[str]:
        """The negative labels in use, adjectives then nouns (selected once)."""
        self.negative_text()
        return self._negatives

    def negative_text(self) -> torch.Tensor:
        """Normalised embeddings [M,P] of the negative labels, adjectives then nouns (selected on first use)."""
        if "negatives" not in self._text_cache:
            p = self.params
            nouns, adjectives = self.candidates()
            encode = self.backbone.encode_class_prompts
            dim = self.class_text().shape[1]
            noun_t = encode(nouns, p["templates"]).cpu() if nouns else torch.zeros(0, dim)
            adj_t = encode(adjectives, [p["adj_template"]]).cpu() if adjectives else torch.zeros(0, dim)
            keep_a, keep_n = select_negatives(noun_t, adj_t, self.class_text(), p["n_negatives"], p["percentile"])
            self._negatives = [adjectives[i] for i in keep_a.tolist()] + [nouns[i] for i in keep_n.tolist()]
            self._text_cache["negatives"] = torch.cat([adj_t[keep_a], noun_t[keep_n]])
        return self._text_cache["negatives"]

    def _score(self, batch: Any) -> np.ndarray:
        p = self.params
        text = torch.cat([self.class_text(), self.negative_text()])
        return adaneg_stream(self.features(batch).global_, text, self.num_classes, 1.0 / p["temperature"],
                             p["ngroup"], p["seed"], p["memory_length"], p["thres"], p["gap"], p["lam"], p["beta"],
                             p["sample_adaptive"], p["score_rule"], p["batch_size"])
