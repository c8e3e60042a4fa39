"""CLIPN (Wang et al., ICCV 2023): CLIP that can say "no". A second ("no") text tower, a copy of CLIP's text tower
with 16 learnable prompt embeddings added over all token positions, learns to describe what an image is *not*.

Training (only the "no" parts learn) on image-text pairs: the image-text binary-opposite loss (matched pair ->
"yes", unmatched -> "no", from the two-way softmax over the yes/no logits) and the text semantic-opposite loss
(push the "no" text embedding away from the "yes" one). Scores: CTW (P(yes) at the predicted class) and ATD
(sum_i p_i (1 - P(no)_i)), higher = ID.

Reference: xmed-lab/CLIPN, src/open_clip/loss.py (losses), src/training/main.py + train.py + scheduler.py (AdamW
without weight decay on gains and biases, cosine set every step, total loss halved), src/open_clip/model.py ("no"
tower, prompts), src/classification.py + src/prompt/prompt.txt (the 128 test templates, features summed).
"""
from __future__ import annotations

import copy
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
from detectors.clip.backbone import DEFAULT_CLIP, ClipBackbone
from detectors.clip.common import ClipDetector
from detectors.clip.prompt_training import Schedule, train_loop
from detectors.clip.templates import CLIPN_TEMPLATES
from detectors.registry import register_detector
from pipelines.params import param
from pipelines.training.settings import TrainSettings, setting

STATE_PREFIX = "no."
TEXT_BATCH = 256  # "no" prompts encoded at a time: peak memory independent of classes x templates


class NoTextTower(nn.Module):
    """The "no" text encoder: `text_model` (a CLIPTextModel), `projection` [P,W] and `prompt` [K, L, W]."""

    def __init__(self, text_model: nn.Module, projection: nn.Linear, n_prompts: int = 16) -> None:
        super().__init__()
        self.text_model = text_model
        self.projection = projection
        length = text_model.config.max_position_embeddings
        self.prompt = nn.Parameter(torch.zeros(n_prompts, length, text_model.config.hidden_size))

    @classmethod
    def from_clip(cls, model: Any, n_prompts: int = 16) -> NoTextTower:
        """Initialised as a copy of CLIP's text tower and text projection (zero prompts)."""
        tower = cls(copy.deepcopy(model.text_model), copy.deepcopy(model.text_projection), n_prompts)
        return tower.requires_grad_(True)

    def prompt_for(self, batch: int, pick: torch.Tensor | None) -> torch.Tensor:
        """Prompts [B, L, W]: row `pick[b]` of the K prompts plus their mean (index K), or the mean when `pick` is
        None."""
        bank = torch.cat([self.prompt, self.prompt.mean(0, keepdim=True)])
        if pick is None:
            return bank[-1:].expand(batch, -1, -1)
        return bank[pick]

    def forward(self, backbone: ClipBackbone, ids: torch.Tensor, pick: torch.Tensor | None = None) -> torch.Tensor:
        """Normalised "no" text embeddings [B,P] of token ids [B,L]."""
        embeds = self.text_model.embeddings.token_embedding(ids)
        embeds = embeds + self.prompt_for(len(ids), pick)[:, : ids.shape[1]].to(embeds.dtype)
        out = backbone.text_from_embeddings(embeds, backbone.eot_index(ids), self.text_model, self.projection)
        return F.normalize(out.float(), dim=-1)


@torch.no_grad()
def class_no_embeddings(tower: NoTextTower, backbone: ClipBackbone, names: Sequence[str], templates: Sequence[str],
                        batch_size: int = TEXT_BATCH) -> torch.Tensor:
    """Normalised "no" class embeddings [C,P]: each template's normalised embedding (mean prompt) averaged over the
    templates, renormalised. Texts go through the tower `batch_size` at a time and are summed into their class."""
    texts = [t.format(n) for n in names for t in templates]
    owner = torch.arange(len(texts)) // len(templates)
    total: torch.Tensor | None = None
    for start in range(0, len(texts), batch_size):
        ids = backbone.tokenize(texts[start:start + batch_size])
        with backbone.autocast():
            emb = tower(backbone, ids).float().cpu()
        total = torch.zeros(len(names), emb.shape[1]) if total is None else total
        total.index_add_(0, owner[start:start + batch_size], emb)
    return F.normalize(total / len(templates), dim=-1)


def same_caption(ids: torch.Tensor) -> torch.Tensor:
    """Boolean [N,N]: pairs (i, j) whose token ids are identical (the same caption)."""
    return (ids[:, None, :] == ids[None, :, :]).all(-1)


def binary_opposite_losses(image: torch.Tensor, yes_text: torch.Tensor, no_text: torch.Tensor, scale: float,
                           match: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Image-text binary-opposite loss of a batch of N (image_i, text_i) pairs (normalised features):
    (mean over matched pairs of -log P(yes | i, j), mean over unmatched pairs of -log P(no | i, j)), P from the softmax
    over the yes/no logits. `match` [N,N] marks the matched pairs: the identity by default, which is the official
    `eyes` (CC3M captions are unique); pass `same_caption(ids)` so that images sharing a caption (e.g. class-name
    captions) are never pushed to "no" for their own caption. With the identity the means are the official sums
    divided by N and N^2 - N."""
    yes = scale * image @ yes_text.T
    no = scale * image @ no_text.T
    log_p = torch.log_softmax(torch.stack([yes, no], dim=-1), dim=-1)  # stable form of log(softmax)
    if match is None:
        match = torch.eye(len(image), device=image.device, dtype=torch.bool)
    match = match.to(image.device, torch.bool)
    nll_yes = -log_p[..., 0][match]
    nll_no = -log_p[..., 1][~match]
    return nll_yes.mean(), nll_no.mean() if nll_no.numel() else nll_yes.new_zeros(())


def semantic_opposite_loss(yes_text: torch.Tensor, no_text: torch.Tensor, eps: float = 1e-4) -> torch.Tensor:
    """Text semantic-opposite loss: mean of 2 - ||t_yes - t_no||_2 (normalised features; `eps` keeps sqrt smooth)."""
    return (2 - torch.sqrt(2 - 2 * (yes_text * no_text).sum(-1) + eps)).mean()


def no_decay(name: str, param: torch.Tensor) -> bool:
    """The official rule for parameters trained without weight decay: gains and biases (1-d), norms, logit scale."""
    return param.ndim < 2 or any(key in name for key in ("bn", "ln", "norm", "bias", "logit_scale"))


def parameter_groups(module: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups as CLIPN's training: no decay for `no_decay` parameters, `weight_decay` for the rest."""
    named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    return [{"params": [p for n, p in named if no_decay(n, p)], "weight_decay": 0.0},
            {"params": [p for n, p in named if not no_decay(n, p)], "weight_decay": weight_decay}]


def pair_texts(images: ImageSet, class_names: Sequence[str], template: str) -> list[str]:
    """The caption of each image: the manifest's `text` field, else `template` filled with the class name."""
    if images.manifest is not None and all("text" in r for r in images.manifest.rows):
        return [str(r["text"]) for r in images.manifest.rows]
    if images.labels is None or not class_names:
        raise ValueError("clipn.fit needs image-text pairs: a manifest with a `text` field, or labels and class_names")
    return [template.format(class_names[int(y)]) for y in images.labels]


@register_detector("clipn")
class CLIPN(ClipDetector):
    """`score_rule` "atd" (default) or "ctw"; logits use scale 100 as the paper; class text = the official 128
    templates (features summed, normalised). Training defaults follow CLIPN's code and run script: AdamW lr 3e-4,
    betas (0.9, 0.98), eps 1e-6, weight decay 0.2 except on gains/biases/norms, a cosine set every step (no warm-up),
    10 epochs, batch 512 per GPU, loss = 0.5 (yes + no + semantic-opposite). Training reads cached image embeddings
    (frozen image tower) and the frozen "yes" text tower; only the "no" tower learns. Captions come from a
    manifest's `text` field, else `caption_template` with the class name; `match="caption"` treats pairs with the
    same caption as matched (the official identity when captions are unique), `match="index"` is the identity."""

    label = "CLIPN"
    reference_code = "xmed-lab/CLIPN src/open_clip/loss.py"
    trains_across_processes = True  # its "no" tower trains under accelerate on every process together
    paper = "Wang et al., CLIPN for Zero-Shot OOD Detection: Teaching CLIP to Say No, ICCV 2023"

    @dataclass(frozen=True)
    class Params(ClipDetector.Params):
        training: ClassVar[TrainSettings] = TrainSettings(epochs=10, lr=3e-4, weight_decay=0.2, batch_size=512)
        """The reference training (xmed-lab/CLIPN `src/training/main.py` and its run script): AdamW at lr 3e-4,
        weight decay 0.2, 10 epochs of batch 512 per GPU."""

        templates: list[str] | None = param(list(CLIPN_TEMPLATES), "class prompt templates (features summed)")
        caption_template: str = param("a photo of a {}.", "caption of a labelled image without a `text` field")
        score_rule: Literal["atd", "ctw"] = param("atd", "agreeing-to-differ or competing-to-win")
        scale: float = param(100.0, "logit scale", gt=0)
        n_prompts: int = param(16, "learnable 'no' prompt tokens", ge=1)
        epochs: int = setting("epochs", default=training.epochs)
        lr: float = setting("lr", default=training.lr)
        betas: tuple[float, float] = param((0.9, 0.98), "AdamW betas")
        eps: float = param(1e-6, "AdamW epsilon", gt=0)
        weight_decay: float = setting("weight_decay", " (not on gains, biases, norms)", default=training.weight_decay)
        schedule: Schedule = param("cosine_step", "learning-rate schedule")
        warmup_steps: int = param(0, "linear warm-up steps", ge=0)
        loss_weight: float = param(0.5, "weight of the summed losses", gt=0)
        match: Literal["caption", "index"] = param("caption", "which image-text pairs count as matched")
        train_batch: int = setting("batch_size", default=training.batch_size, doc="training batch size")
        seed: int = param(0, "shuffling seed")
        progress: bool = param(True, "show a progress bar", runtime=True)

    search_space = {"score_rule": ["atd", "ctw"]}

    def __init__(self, model: Any = DEFAULT_CLIP, processor: Any = None, **params: Any) -> None:
        super().__init__(model, processor, **params)
        self._tower: NoTextTower | None = None
        self._tower_state: dict[str, np.ndarray] | None = None
        self.losses: list[float] = []
        self.lrs: list[float] = []  # learning rate of each training step

    @property
    def tower(self) -> NoTextTower:
        """The "no" text tower (a copy of CLIP's text tower until trained or loaded)."""
        if self._tower is None:
            self._tower = NoTextTower.from_clip(self.backbone.model, self.params["n_prompts"]).to(self.backbone.device)
            if self._tower_state is not None:
                state = {k[len(STATE_PREFIX):]: torch.as_tensor(v) for k, v in self._tower_state.items()}
                self._tower.load_state_dict(state, strict=True)
        return self._tower

    def _fit(self, id_train: Any, *, id_val: Any = None, ood_val: Any = None) -> None:
        p, backbone = self.params, self.backbone
        if p["match"] not in ("caption", "index"):
            raise ValueError(f"clipn: match must be 'caption' or 'index', got {p['match']!r}")
        texts = pair_texts(id_train, p["class_names"], p["caption_template"])
        image = F.normalize(self.features(id_train).global_, dim=-1)
        ids = backbone.tokenize(texts).cpu()
        yes_text = backbone.encode_texts(texts).cpu()
        gen = torch.Generator().manual_seed(p["seed"])
        n_choices = p["n_prompts"] + 1

        def step_loss(module: Any, batch: Any) -> torch.Tensor:
            img, tok, yes = batch
            pick = torch.randint(0, n_choices, (len(tok),), generator=gen).to(tok.device)
            no = module(backbone, tok, pick)
            match = same_caption(tok) if p["match"] == "caption" else None
            bin_yes, bin_no = binary_opposite_losses(img, yes, no, p["scale"], match)
            return p["loss_weight"] * (bin_yes + bin_no + semantic_opposite_loss(yes, no))

        tower, settings = self.tower.train(), TrainSettings.read(self.Params, p)
        optimizer = torch.optim.AdamW(parameter_groups(tower, settings.weight_decay), lr=settings.lr,
                                      betas=tuple(p["betas"]), eps=p["eps"])
        self.lrs = []
        self.losses = train_loop(tower, TensorDataset(image, ids, yes_text), step_loss, epochs=settings.epochs,
                                 batch_size=settings.batch_size, optimizer=optimizer, seed=p["seed"],
                                 device=backbone.device, schedule=p["schedule"], warmup_steps=p["warmup_steps"],
                                 lr_log=self.lrs, progress=p["progress"], desc="CLIPN")
        self._text_cache.pop("no", None)

    def no_text(self) -> torch.Tensor:
        """Normalised "no" class embeddings [C,P] (mean prompt; templates averaged, renormalised)."""
        if "no" not in self._text_cache:
            names, templates = self.require_classes(), self.params["templates"]
            self._text_cache["no"] = class_no_embeddings(self.tower.eval(), self.backbone, names, templates)
        return self._text_cache["no"]

    def _score(self, batch: Any) -> np.ndarray:
        p, p_no = scores.clipn_probabilities(self.features(batch).global_, self.class_text(), self.no_text(),
                                             self.params["scale"])
        rule = self.params["score_rule"]
        if rule == "atd":
            return scores.clipn_atd(p, p_no)
        if rule == "ctw":
            return scores.clipn_ctw(p, p_no)
        raise ValueError(f"clipn: score_rule must be 'atd' or 'ctw', got {rule!r}")

    def state(self) -> dict[str, np.ndarray]:
        if self._tower is None and self._tower_state is not None:
            return dict(self._tower_state)
        return {STATE_PREFIX + k: v.detach().float().cpu().numpy() for k, v in self.tower.state_dict().items()}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        self._tower_state = {k: np.asarray(v) for k, v in state.items() if k.startswith(STATE_PREFIX)}
        self._tower = None
        self._text_cache.pop("no", None)
