"""CLIPN (Wang et al., ICCV 2023): CLIP that can say "no". A second ("no") text tower, a copy of CLIP's text tower
with 16 learnable prompt embeddings added over all token positions, learns to describe what an image is *not*.

Training (only the "no" parts learn) on image-text pairs: the image-text binary-opposite loss (matched pair ->
"yes", unmatched -> "no", from the two-way softmax over the yes/no logits) and the text semantic-opposite loss
(push the "no" text embedding away from the "yes" one). Scores: CTW (P(yes) at the predicted class) and ATD
(sum_i p_i (1 - P(no)_i)), higher = ID.
"""
from __future__ import annotations

import copy
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from detectors.base import ImageSet
from detectors.clip import scores
from detectors.clip.backbone import ClipBackbone
from detectors.clip.common import CLIP_DEFAULTS, ClipDetector
from detectors.clip.training import train_loop
from detectors.registry import register_detector

STATE_PREFIX = "no."


class NoTextTower(nn.Module):
    """The "no" text encoder: `text_model` (a CLIPTextModel), `projection` [P,W] and `prompt` [K, L, W]."""

    def __init__(self, text_model: nn.Module, projection: nn.Linear, n_prompts: int = 16) -> None:
        super().__init__()
        self.text_model = text_model
        self.projection = projection
        length = text_model.config.max_position_embeddings
        self.prompt = nn.Parameter(torch.zeros(n_prompts, length, text_model.config.hidden_size))

    @classmethod
    def from_clip(cls, model: Any, n_prompts: int = 16) -> "NoTextTower":
        """Initialised as a copy of CLIP's text tower and text projection (zero prompts)."""
        tower = cls(copy.deepcopy(model.text_model), copy.deepcopy(model.text_projection), n_prompts)
        return tower.requires_grad_(True)

    def prompt_for(self, batch: int, pick: torch.Tensor | None) -> torch.Tensor:
        """Prompts [B, L, W]: row `pick[b]` of the K prompts plus their mean (index K), or the mean when `pick` is None."""
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


def binary_opposite_losses(image: torch.Tensor, yes_text: torch.Tensor, no_text: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Image-text binary-opposite loss of a batch of N matched (image_i, text_i) pairs (normalised features):
    (mean over i of -log P(yes | i, i), mean over i != j of -log P(no | i, j)), P from softmax over the yes/no logits."""
    yes = scale * image @ yes_text.T
    no = scale * image @ no_text.T
    log_p = torch.log_softmax(torch.stack([yes, no], dim=-1), dim=-1)  # stable form of log(softmax)
    eye = torch.eye(len(image), device=image.device, dtype=torch.bool)
    nll_yes = -log_p[..., 0][eye]
    nll_no = -log_p[..., 1][~eye]
    return nll_yes.mean(), nll_no.mean() if nll_no.numel() else nll_yes.new_zeros(())


def semantic_opposite_loss(yes_text: torch.Tensor, no_text: torch.Tensor, eps: float = 1e-4) -> torch.Tensor:
    """Text semantic-opposite loss: mean of 2 - ||t_yes - t_no||_2 (normalised features; `eps` keeps sqrt smooth)."""
    return (2 - torch.sqrt(2 - 2 * (yes_text * no_text).sum(-1) + eps)).mean()


def pair_texts(images: ImageSet, class_names: Sequence[str], template: str) -> list[str]:
    """The caption of each image: the manifest's `text` field, else `template` filled with the class name."""
    if images.manifest is not None and all("text" in r for r in images.manifest.rows):
        return [str(r["text"]) for r in images.manifest.rows]
    if images.labels is None or not class_names:
        raise ValueError("clipn.fit needs image-text pairs: a manifest with a `text` field, or labels and class_names")
    return [template.format(class_names[int(y)]) for y in images.labels]


@register_detector("clipn")
class CLIPN(ClipDetector):
    """`score_rule` "atd" (default) or "ctw"; logits use scale 100 as the paper. Training defaults follow CLIPN's
    run script (AdamW lr 3e-4, betas (0.9, 0.98), eps 1e-6, weight decay 0.2, 10 epochs, batch 512 per GPU) and read
    cached image embeddings (frozen image tower) and the frozen "yes" text tower; only the "no" tower learns."""

    paper = "Wang et al., CLIPN for Zero-Shot OOD Detection: Teaching CLIP to Say No, ICCV 2023"
    defaults = {**CLIP_DEFAULTS, "score_rule": "atd", "scale": 100.0, "n_prompts": 16, "epochs": 10, "lr": 3e-4,
                "betas": (0.9, 0.98), "eps": 1e-6, "weight_decay": 0.2, "train_batch": 512, "seed": 0, "progress": True}
    search_space = {"score_rule": ["atd", "ctw"]}

    def __init__(self, model: Any = CLIP_DEFAULTS["model"], processor: Any = None, **params: Any) -> None:
        super().__init__(model, processor, **params)
        self._tower: NoTextTower | None = None
        self._tower_state: dict[str, np.ndarray] | None = None
        self.losses: list[float] = []

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
        texts = pair_texts(id_train, p["class_names"], p["templates"][0])
        image = F.normalize(self.features(id_train).global_, dim=-1)
        ids = backbone.tokenize(texts).cpu()
        yes_text = backbone.encode_texts(texts).cpu()
        gen = torch.Generator().manual_seed(p["seed"])
        n_choices = p["n_prompts"] + 1

        def step_loss(module: Any, batch: Any) -> torch.Tensor:
            img, tok, yes = batch
            pick = torch.randint(0, n_choices, (len(tok),), generator=gen).to(tok.device)
            no = module(backbone, tok, pick)
            bin_yes, bin_no = binary_opposite_losses(img, yes, no, p["scale"])
            return bin_yes + bin_no + semantic_opposite_loss(yes, no)

        tower = self.tower.train()
        optimizer = torch.optim.AdamW(tower.parameters(), lr=p["lr"], betas=tuple(p["betas"]), eps=p["eps"],
                                      weight_decay=p["weight_decay"])
        self.losses = train_loop(tower, TensorDataset(image, ids, yes_text), step_loss, epochs=p["epochs"],
                                 batch_size=p["train_batch"], optimizer=optimizer, seed=p["seed"],
                                 device=backbone.device, progress=p["progress"], desc="CLIPN")
        self._text_cache.pop("no", None)

    @torch.no_grad()
    def no_text(self) -> torch.Tensor:
        """Normalised "no" class embeddings [C,P] (mean prompt; templates averaged, renormalised)."""
        if "no" not in self._text_cache:
            names, templates = self.require_classes(), self.params["templates"]
            ids = self.backbone.tokenize([t.format(n) for n in names for t in templates])
            with self.backbone.autocast():
                emb = self.tower.eval()(self.backbone, ids)
            self._text_cache["no"] = F.normalize(emb.view(len(names), len(templates), -1).mean(1), dim=-1).cpu()
        return self._text_cache["no"]

    def _score(self, batch: Any) -> np.ndarray:
        p, p_no = scores.clipn_probabilities(self.features(batch).global_, self.class_text(), self.no_text(), self.params["scale"])
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
