"""LAPT (Zhang et al., ECCV 2024): label-driven prompt tuning. Negative labels are mined from WordNet as AdaNeg's
(same repository); ID prompts "[ctx] class." and negative prompts "[ood_ctx] label." (one learned context per
distribution, shared by its labels) are trained with cross-entropy over ID classes + negative labels on images of
both, each image embedding mixed with a random prompt-template embedding of its own label (cross-modal mixing; with
`mix_strategy="wccm_cd"` also ID/negative image pairs mixed, cross-distribution). Score: NegLabel's grouped ID mass
over the learned prompts, with 10x more negative labels at test than in training (the context carries over).

Reference: YBZh/OpenOOD-VLM at 804f331: openood/trainers/oodmixup_trainer.py:180-203 (`create_mixed_indices`),
:205-268 (`mixup_data`: 'cross_dis', 'wccm'), :605-955 (`OodMixupTrainer_idood`: SGD nesterov, per-step cosine,
'wccm' and 'wccm_cd' with loss 'multice'); openood/networks/clip_coop_negprompt.py:341-349 (the 7 mixing templates),
:398-474 (negative labels), :516-714 (prompt learner, 'dis_aware'), :781-869 (mixing text features);
openood/postprocessors/oneoodprompt_postprocessor.py:30-75 (score); scripts/ood/lapt/train.sh and test.sh (defaults).

Not reproduced: the official training images are collected for every ID class and negative label by text-to-image
generation (SDXL, guidance 7.5) and retrieval, then filtered with CLIP ViT-L/14 (openood/datasets/
syntext_generation_clip_filter_ood.py); the collection does not run here, the filter does (`filter_collected`).
The user gives the images: ID images in `fit`'s ImageSet (labels 0..C-1; labels C + j are images of the j-th
training negative label, the official label layout), and/or a manifest whose OOD rows name their negative label in
`ood_set` (`negative_manifest`). Training reads cached embeddings of the images as given (the official draws a
random-resized crop + flip each epoch).
"""
from __future__ import annotations

import html
import random
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from detectors.base import ImageSet
from detectors.clip import scores
from detectors.clip.adaneg import ADJ_TEMPLATE, ID_TEMPLATE, AdaNeg, select_negatives
from detectors.clip.backbone import ClipBackbone
from detectors.clip.common import labels_of
from detectors.clip.features import image_features
from detectors.clip.prompt_training import PromptDetector, Schedule, train_loop
from detectors.clip.prompts import PromptLearner
from detectors.clip.wordnet import NEGLABEL_EXCLUDED
from detectors.registry import register_detector
from pipelines.params import param
from pipelines.training.settings import TrainSettings, setting

# clip_coop_negprompt.py:341-349, `text_prompt tip` of train.sh: the label texts image embeddings are mixed with
MIX_TEMPLATES = ("a bad photo of the {}.", "a {} in a video game.", "a origami {}.", "a photo of the small {}.",
                 "art of the {}.", "a photo of the large {}.", "itap of a {}.")
TEXT_CHUNK = 2048  # prompts per text-tower pass
FILTER_TEMPLATE = "a photo of a {}."  # syntext_generation_clip_filter_ood.py:333


class NegativePromptLearner(PromptLearner):
    """ID prompts "[SOS] ctx . class-name . [EOS]" and negative prompts with the negative label's tokens after their own
    context `ood_ctx` ('dis_aware', clip_coop_negprompt.py:560-569, 598-602); `forward()` gives normalised text
    features [C+K, P], ID classes first. `ood` is empty (no learned label token)."""

    def __init__(self, backbone: ClipBackbone, class_names: Sequence[str], negative_names: Sequence[str],
                 n_ctx: int = 4, init_std: float = 0.02, seed: int = 0) -> None:
        super().__init__(backbone, [*class_names, *negative_names], n_ctx, 0, init_std, seed)
        width = self.ctx.shape[1]
        gen = torch.Generator().manual_seed(seed)
        torch.randn(n_ctx, width, generator=gen)  # the draw of `ctx` again: `ood_ctx` is the next one
        self.ood_ctx = nn.Parameter(torch.randn(n_ctx, width, generator=gen) * init_std)
        self.n_id, self.n_neg = len(class_names), len(negative_names)

    def prompt_embeddings(self) -> torch.Tensor:
        ctx = torch.cat([self.ctx[None].expand(self.n_id, -1, -1), self.ood_ctx[None].expand(self.n_neg, -1, -1)])
        return torch.cat([self.prefix, ctx.to(self.prefix.dtype), self.suffix.to(self.prefix.dtype)], dim=1)

    def forward(self) -> torch.Tensor:
        emb = self.prompt_embeddings().to(self.backbone.model.dtype)
        parts = [self.backbone.text_from_embeddings(emb[s:s + TEXT_CHUNK], self.eot[s:s + TEXT_CHUNK])
                 for s in range(0, len(emb), TEXT_CHUNK)]
        return F.normalize(torch.cat(parts).float(), dim=-1)


def cross_distribution_pairs(labels: torch.Tensor, n_cls: int, generator: torch.Generator) -> torch.Tensor:
    """Partner index of every sample (create_mixed_indices, oodmixup_trainer.py:180-203, its 1000 being C): an ID
    sample gets a random negative-label sample of the batch, a negative-label sample a random ID sample (uniform, one
    draw each in batch order); the identity when either kind is missing."""
    is_id = labels < n_cls
    ids, negs = torch.nonzero(is_id).flatten(), torch.nonzero(~is_id).flatten()
    pair = torch.arange(len(labels))
    if not len(ids) or not len(negs):
        return pair
    for i in range(len(labels)):
        pool = negs if is_id[i] else ids
        pair[i] = pool[torch.randint(len(pool), (1,), generator=generator)]
    return pair


def lapt_loss(image: torch.Tensor, text: torch.Tensor, mix_text: torch.Tensor, labels: torch.Tensor, scale: float,
              lam: float, template_idx: torch.Tensor, pair: torch.Tensor | None = None,
              lam_cd: float | None = None) -> torch.Tensor:
    """LAPT's 'multice' loss (oodmixup_trainer.py:744-765, 861-865). Cross-modal ('wccm', mixup_data :258-267): x' =
    normalise(lam x + (1 - lam) t[y, j]) with t [C+K, T, P] the template text of each label and j = `template_idx`;
    loss = CE(scale cos(x', prompts), y) over the C+K labels. With `pair` (cross-distribution, 'cross_dis' :248-256):
    + CE of normalise(lam_cd x + (1 - lam_cd) x[pair]) against lam_cd onehot(y) + (1 - lam_cd) onehot(y[pair]).
    `image` is normalised here; `text` [C+K, P] and `mix_text` are normalised."""
    x = F.normalize(image.float(), dim=-1)
    text = text.float()
    mixed = F.normalize(lam * x + (1.0 - lam) * mix_text[labels, template_idx].float(), dim=-1)
    loss = F.cross_entropy(scale * mixed @ text.T, labels)
    if pair is not None:
        cd = F.normalize(lam_cd * x + (1.0 - lam_cd) * x[pair], dim=-1)
        onehot = F.one_hot(labels, text.shape[0]).float()
        target = lam_cd * onehot + (1.0 - lam_cd) * onehot[pair]
        loss = loss + F.cross_entropy(scale * cd @ text.T, target)
    return loss


def filter_name(name: str) -> str:
    """A label as the official filter writes it into its prompt (syntext_generation_clip_filter_ood.py:305-331):
    `_ ( ) [ ] /` as spaces, HTML unescaped twice, whitespace collapsed, lower case (the official also runs ftfy)."""
    for char in "_()[]/":
        name = name.replace(char, " ")
    return re.sub(r"\s+", " ", html.unescape(html.unescape(name)).strip()).strip().lower()


def select_collected(probs: torch.Tensor, labels: Sequence[int], shot: int = 8, seed: int = 0) -> list[int]:
    """Rows kept by LAPT's filter of collected images (select_by_clip_thres_RS, syntext_generation_clip_filter_ood.py:
    406-436), per label: those whose CLIP prediction over all labels is the label, `shot` of them drawn at random
    (Python `random.sample`, seeded here; unseeded in the official), or, when fewer than `shot` are, the `shot` with
    the highest probability of the label (ties in row order). `probs` [N, L] are softmax probabilities; sorted rows."""
    rng = random.Random(seed)
    labels = np.asarray(labels)
    pred = probs.argmax(1).numpy()
    kept: list[int] = []
    for label in np.unique(labels):
        rows = np.flatnonzero(labels == label).tolist()
        right = [r for r in rows if pred[r] == label]
        if len(right) < shot:
            kept += sorted(rows, key=lambda r: -float(probs[r, label]))[:shot]
        else:
            kept += rng.sample(right, k=shot)
    return sorted(kept)


@register_detector("lapt")
class LAPT(PromptDetector):
    """Defaults as the official scripts: negative labels as AdaNeg's (WordNet, "The nice {}." / "This is a {} photo.",
    0.95 point of the sorted cosines), 1,000 in training (train.sh OOD_NUM) and 10,000 at test (test.sh); 4 context
    tokens per distribution (test.sh N_CTX, the released checkpoint's; train.sh shows 2); every image given (few_shot
    0); SGD lr 0.01, momentum 0.9, nesterov, weight decay 1e-5, batch 32, 10 epochs, cosine per step; mixing
    'wccm' with lambda ~ Beta(1, 1) per batch over the 7 templates; score = ID mass of softmax(CLIP logit scale x
    cos) over ID + one group of negatives, mean over 100 groups (seed 0)."""

    label = "LAPT"
    reference_code = "YBZh/OpenOOD-VLM openood/trainers/oodmixup_trainer.py"
    paper = ("Zhang et al., LAPT: Label-driven Automated Prompt Tuning for OOD Detection with Vision-Language Models, "
             "ECCV 2024")
    aliases = {"oneoodprompt": "OpenOOD-VLM's postprocessor", "oodmixup_idood": "OpenOOD-VLM's trainer"}

    @dataclass(frozen=True)
    class Params(PromptDetector.Params):
        training: ClassVar[TrainSettings] = TrainSettings(epochs=10, lr=0.01, weight_decay=1e-5, batch_size=32)
        """The reference training (YBZh/OpenOOD-VLM `openood/trainers/oodmixup_trainer.py:605-955`,
        `scripts/ood/lapt/train.sh`): SGD (nesterov) at lr 0.01, weight decay 1e-5, 10 epochs of batch 32."""

        n_ctx: int = param(4, "learned context tokens of the ID prompts, and as many for the negative prompts", ge=1)
        shots: int | None = param(None, "training images per label (None: all)", ge=1)
        templates: list[str] | None = param([ID_TEMPLATE], "ID-class and noun prompt of the negative-label mining")
        adj_template: str = param(ADJ_TEMPLATE, "adjective prompt of the negative-label mining")
        words: list[str] | None = param(None, "candidate negative nouns replacing WordNet's")
        words_file: str | None = param(None, "a file of candidate nouns, one per line")
        adjectives: list[str] | None = param(None, "candidate adjectives (with words / words_file)")
        wordnet_dir: str | None = param(None, "WordNet 3.0 database folder (None: the system's)")
        wordnet_exclude: list[str] = param(list(NEGLABEL_EXCLUDED), "WordNet lexicographer files left out")
        percentile: float = param(0.95, "point of a candidate's sorted cosines to the ID classes", ge=0, lt=1)
        n_train_negatives: int = param(1_000, "negative labels trained on (their images are labels C..C+K-1)", ge=0)
        n_negatives: int = param(10_000, "negative labels at test (the learned negative context carries over)", ge=0)
        negative_manifest: str | None = param(None, "manifest folder whose OOD rows are images of the negative label "
                                                    "named in their `ood_set`")
        mix_strategy: Literal["wccm", "wccm_cd"] = param("wccm", "cross-modal mixing, + cross-distribution mixing")
        mix_templates: list[str] = param(list(MIX_TEMPLATES), "label texts the image embeddings are mixed with")
        alpha: float = param(1.0, "mixing weight lambda ~ Beta(alpha, alpha), one per batch", gt=0)
        epochs: int = setting("epochs", default=training.epochs)
        lr: float = setting("lr", default=training.lr, doc="SGD learning rate")
        momentum: float = param(0.9, "SGD momentum (nesterov)", ge=0)
        weight_decay: float = setting("weight_decay", default=training.weight_decay, doc="SGD weight decay")
        train_batch: int = setting("batch_size", default=training.batch_size, doc="training batch size")
        schedule: Schedule = param("cosine_step", "learning-rate schedule")
        ngroup: int = param(100, "groups the test negatives are split into (group_num)", ge=1)
        group_seed: int = param(0, "seed of the group permutation")

    search_space = {"n_ctx": [2, 4, 16]}
    candidates = AdaNeg.candidates  # the same corpus rule: WordNet or the given words, ID class names removed

    def __init__(self, *args: Any, **params: Any) -> None:
        super().__init__(*args, **params)
        self._negative_lists: tuple[list[str], list[str]] | None = None

    def negative_lists(self) -> tuple[list[str], list[str]]:
        """(training negatives, test negatives), each adjectives then nouns (get_selected_ood_text_list with OOD_NUM
        = n_train_negatives and n_negatives; mined once)."""
        if self._negative_lists is None:
            p = self.params
            nouns, adjectives = self.candidates()
            encode = self.backbone.encode_class_prompts
            dim = self.class_text().shape[1]
            noun_t = encode(nouns, p["templates"]).cpu() if nouns else torch.zeros(0, dim)
            adj_t = encode(adjectives, [p["adj_template"]]).cpu() if adjectives else torch.zeros(0, dim)
            lists = []
            for total in (p["n_train_negatives"], p["n_negatives"]):
                keep_a, keep_n = select_negatives(noun_t, adj_t, self.class_text(), total, p["percentile"])
                lists.append([adjectives[i] for i in keep_a.tolist()] + [nouns[i] for i in keep_n.tolist()])
            self._negative_lists = (lists[0], lists[1])
        return self._negative_lists

    @property
    def train_negative_words(self) -> list[str]:
        """The negative labels trained on; images of the j-th are label C + j."""
        return self.negative_lists()[0]

    @property
    def negative_words(self) -> list[str]:
        """The negative labels of the score."""
        return self.negative_lists()[1]

    def filter_collected(self, images: ImageSet, shot: int = 8, backbone: ClipBackbone | None = None,
                         seed: int = 0) -> ImageSet:
        """The subset of collected (generated / retrieved) training images LAPT keeps: CLIP (`backbone`; the official
        ViT-L/14, default this detector's) classifies each image over the ID classes + training negatives with
        "a photo of a {label}." (logit scale x cosine, softmax), then `select_collected` picks `shot` per label.
        Labels as `fit`'s: 0..C-1 the ID classes, C + j the j-th training negative."""
        from detectors.clip.features import subset_imageset

        backbone = backbone or self.backbone
        names = [filter_name(n) for n in [*self.require_classes(), *self.train_negative_words]]
        text = backbone.encode_texts([FILTER_TEMPLATE.format(n) for n in names]).cpu()
        feats = image_features(backbone, images, self.params["cache_dir"], self.params["embed_batch_size"],
                               local=False).global_
        probs = torch.softmax(backbone.logit_scale * scores.cosine(feats, text).double(), dim=-1)
        labels = np.asarray(images.labels)
        if labels.min(initial=0) < 0 or labels.max(initial=0) >= len(names):
            raise ValueError(f"lapt.filter_collected: labels must lie in [0, {len(names)})")
        return subset_imageset(images, select_collected(probs, labels, shot, seed))

    def make_learner(self, negatives: Sequence[str]) -> NegativePromptLearner:
        learner = NegativePromptLearner(self.backbone, self.require_classes(), negatives, self.params["n_ctx"],
                                        seed=self.params["seed"])
        return learner.to(self.backbone.device)

    @property
    def learner(self) -> NegativePromptLearner:
        """The scoring prompt learner (ID classes + test negatives), restored from a loaded state when there is one."""
        if self._learner is None:
            self._learner = self.make_learner(self.negative_words)
            if self._prompt_state is not None:
                self._learner.load(self._prompt_state)
        return self._learner

    @torch.no_grad()
    def mix_text(self) -> torch.Tensor:
        """Normalised template texts [C+K, T, P] of the ID classes and training negatives (get_text_features_neg,
        text_center unset: every template kept)."""
        names = [*self.require_classes(), *self.train_negative_words]
        templates = self.params["mix_templates"]
        emb = self.backbone.encode_texts([t.format(n) for n in names for t in templates]).cpu()
        return emb.view(len(names), len(templates), -1)

    def training_features(self, images: ImageSet) -> tuple[Any, torch.Tensor]:
        """Global embeddings and labels of the `shots`-per-label subset, sliced from the whole set's cached global
        embeddings (no patch embeddings: LAPT reads none)."""
        labels, idx = labels_of(images, self.name), self.shot_indices(images)
        return self.features(images).subset(idx), labels[idx]

    def training_set(self, id_train: ImageSet) -> tuple[torch.Tensor, torch.Tensor]:
        """Global embeddings and labels: `id_train`'s (its `shots` subset) and the negative manifest's OOD rows,
        labelled C + the index of their `ood_set` among the training negatives."""
        if not len(id_train):
            raise ValueError("lapt: no training image in fit's ImageSet")
        feats, labels = self.training_features(id_train)
        n_labels = self.num_classes + len(self.train_negative_words)
        if int(labels.max()) >= n_labels:
            raise ValueError(f"lapt: labels must lie in [0, {n_labels}) (C ID classes + {n_labels - self.num_classes} "
                             f"training negative labels), got {int(labels.max())}")
        global_, out = [feats.global_], [labels]
        if self.params["negative_manifest"]:
            from pipelines.data import read_manifest

            rows = read_manifest(self.params["negative_manifest"]).select(role="ood")
            index = {w: self.num_classes + j for j, w in enumerate(self.train_negative_words)}
            unknown = sorted({r["ood_set"] for r in rows.rows} - set(index))
            if unknown:
                raise ValueError(f"lapt: negative_manifest names labels that are not training negatives: "
                                 f"{unknown[:5]}{' ...' if len(unknown) > 5 else ''} (see `train_negative_words`)")
            negatives = ImageSet(manifest=rows, labels=np.array([index[r["ood_set"]] for r in rows.rows]))
            picked = self.shot_indices(negatives)
            global_.append(self.features(negatives).global_[picked])
            out.append(torch.as_tensor(negatives.labels[picked], dtype=torch.long))
        labels = torch.cat(out)
        if not (labels >= self.num_classes).any():
            warnings.warn("lapt: no negative-label images; LAPT trains on images of the negative labels too "
                          "(labels C + j in fit's ImageSet, or negative_manifest)", stacklevel=4)
        return torch.cat(global_), labels

    def _fit(self, id_train: Any, *, id_val: Any = None, ood_val: Any = None) -> None:
        p = self.params
        global_, labels = self.training_set(id_train)
        learner = self.make_learner(self.train_negative_words)
        mix_text, n_cls, scale = self.mix_text().to(self.backbone.device), self.num_classes, self.backbone.logit_scale
        rng = np.random.default_rng(p["seed"])
        gen = torch.Generator().manual_seed(p["seed"])
        n_templates = mix_text.shape[1]

        def step_loss(module: Any, batch: Any) -> torch.Tensor:
            x, y = batch
            lam = float(rng.beta(p["alpha"], p["alpha"]))
            idx = torch.randint(n_templates, (len(y),), generator=gen).to(y.device)
            pair, lam_cd = None, None
            if p["mix_strategy"] == "wccm_cd":
                lam_cd = float(rng.beta(p["alpha"], p["alpha"]))
                pair = cross_distribution_pairs(y.cpu(), n_cls, gen).to(y.device)
            return lapt_loss(x, module(), mix_text, y, scale, lam, idx, pair, lam_cd)

        settings = TrainSettings.read(self.Params, p)
        optimizer = torch.optim.SGD([learner.ctx, learner.ood_ctx], lr=settings.lr, momentum=p["momentum"],
                                    weight_decay=settings.weight_decay, nesterov=p["momentum"] > 0)
        self.lrs = []
        losses = train_loop(learner, TensorDataset(global_, labels), step_loss, epochs=settings.epochs,
                            batch_size=settings.batch_size, optimizer=optimizer, seed=p["seed"],
                            device=self.backbone.device, schedule=p["schedule"], lr_log=self.lrs,
                            progress=p["progress"], desc="LAPT")
        self.learner.load(learner.state())
        self._after_fit(losses)

    def _score(self, batch: Any) -> np.ndarray:
        text = self.prompt_text()
        return scores.neglabel(self.features(batch).global_, text[: self.num_classes], text[self.num_classes:],
                               1.0 / self.backbone.logit_scale, self.groups(), self.params["group_seed"])

    def groups(self) -> int:
        """`ngroup` (100, test.sh), at most the number of test negatives."""
        return max(1, min(int(self.params["ngroup"]), len(self.negative_words)))
