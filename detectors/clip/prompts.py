"""CoOp-style prompt learner on a frozen CLIP text tower, shared by LoCoOp and ID-like.

Prompt of class c: [SOS] ctx_1 .. ctx_M  <class-name tokens> . [EOS], with M learned context vectors (class token at
the end, as CoOp's default); optional extra OOD prompts [SOS] ctx_1 .. ctx_M  ood_j . [EOS] with one learned token each.
The text tower runs from embeddings (causal mask, pooling at the end-of-text token).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from detectors.clip.backbone import ClipBackbone

PLACEHOLDER = "X"


class PromptLearner(nn.Module):
    """Learned context (`ctx` [M,W]), OOD tokens (`ood` [K,W]) and the OOD prompts' own context (`ood_ctx` [M,W],
    ID-like's separate OOD prompt learner; empty with `shared_ood_ctx`, then OOD prompts use `ctx`); `forward()`
    returns normalised text features [C+K, P] (ID classes first). The CLIP model is frozen and not a registered
    submodule (it is not saved)."""

    def __init__(self, backbone: ClipBackbone, class_names: Sequence[str], n_ctx: int = 16, n_ood: int = 0,
                 init_std: float = 0.02, seed: int = 0, shared_ood_ctx: bool = False) -> None:
        super().__init__()
        self.backbone = backbone
        width = backbone.model.config.text_config.hidden_size
        gen = torch.Generator().manual_seed(seed)
        self.ctx = nn.Parameter(torch.randn(n_ctx, width, generator=gen) * init_std)
        self.ood = nn.Parameter(torch.randn(n_ood, width, generator=gen) * init_std)
        own = n_ctx if n_ood and not shared_ood_ctx else 0
        self.ood_ctx = nn.Parameter(torch.randn(own, width, generator=gen) * init_std)
        ctx_text = " ".join([PLACEHOLDER] * n_ctx)
        texts = [f"{ctx_text} {name}." for name in class_names] + [f"{ctx_text} {PLACEHOLDER}."] * n_ood
        with torch.no_grad():
            ids = backbone.tokenize(texts)
            embeds = backbone.token_embeddings(ids).float().cpu()
        self.n_ctx, self.n_cls, self.n_ood = n_ctx, len(class_names), n_ood
        self.register_buffer("prefix", embeds[:, :1], persistent=False)
        self.register_buffer("suffix", embeds[:, 1 + n_ctx:], persistent=False)
        self.register_buffer("eot", backbone.eot_index(ids).cpu(), persistent=False)

    def prompt_embeddings(self) -> torch.Tensor:
        """Token embeddings [C+K, L, W] of every prompt with the learned vectors inserted."""
        ctx = self.ctx[None].expand(self.n_cls, -1, -1)
        suffix = self.suffix
        if self.n_ood:
            ood_ctx = self.ood_ctx if self.ood_ctx.numel() else self.ctx
            ctx = torch.cat([ctx, ood_ctx[None].expand(self.n_ood, -1, -1)])
            ood_rows = torch.cat([suffix[self.n_cls:, :0], self.ood[:, None], suffix[self.n_cls:, 1:]], dim=1)
            suffix = torch.cat([suffix[: self.n_cls], ood_rows])
        return torch.cat([self.prefix, ctx.to(self.prefix.dtype), suffix.to(self.prefix.dtype)], dim=1)

    def forward(self) -> torch.Tensor:
        emb = self.prompt_embeddings().to(self.backbone.model.dtype)
        text = self.backbone.text_from_embeddings(emb, self.eot)
        return F.normalize(text.float(), dim=-1)

    def state(self) -> dict[str, torch.Tensor]:
        """The learned tensors (what `save_pretrained` stores)."""
        return {"prompt.ctx": self.ctx.detach().cpu(), "prompt.ood": self.ood.detach().cpu(),
                "prompt.ood_ctx": self.ood_ctx.detach().cpu()}

    def load(self, state: dict) -> None:
        """Restore tensors from `state()` (numpy or torch); a state saved without `prompt.ood_ctx` (OOD prompts on
        the shared context) gives the OOD prompts a copy of `ctx`, which computes the same prompts."""
        with torch.no_grad():
            self.ctx.copy_(torch.as_tensor(state["prompt.ctx"]))
            self.ood.copy_(torch.as_tensor(state["prompt.ood"]))
            if self.ood_ctx.numel():
                self.ood_ctx.copy_(torch.as_tensor(state.get("prompt.ood_ctx", state["prompt.ctx"])))


def entropy(p: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """Shannon entropy per row of probabilities [..., C] (log(p + eps), as LoCoOp's code)."""
    return -(p * torch.log(p + eps)).sum(-1)


def locoop_ood_patches(local_logits: torch.Tensor, labels: torch.Tensor, top_k: int) -> torch.Tensor:
    """Boolean mask [B,L]: patches whose top-`top_k` classes do not include the image's label (LoCoOp's rule)."""
    top = local_logits.topk(top_k, dim=-1).indices
    return ~(top == labels[:, None, None]).any(-1)


def locoop_loss(global_logits: torch.Tensor, local_logits: torch.Tensor, labels: torch.Tensor, top_k: int,
                lam: float = 0.25) -> tuple[torch.Tensor, dict[str, float]]:
    """LoCoOp: CE(global) + lam * (-mean entropy of the class softmax over OOD patches) (0 when no patch is OOD)."""
    ce = F.cross_entropy(global_logits, labels)
    mask = locoop_ood_patches(local_logits, labels, top_k)
    probs = torch.softmax(local_logits[mask], dim=-1)
    ent = entropy(probs).mean() if mask.any() else global_logits.new_zeros(())
    return ce - lam * ent, {"ce": float(ce.detach()), "entropy": float(ent.detach()),
                            "ood_patches": float(mask.float().mean())}


def idlike_loss(id_logits: torch.Tensor, labels: torch.Tensor, ood_logits: torch.Tensor, ood_text: torch.Tensor,
                n_cls: int, lam_ood: float = 0.3, lam_div: float = 0.2) -> tuple[torch.Tensor, dict[str, float]]:
    """ID-like: CE of ID crops over ID+OOD prompts + lam_ood * mean log(ID probability mass on ID-like OOD crops
    + 1e-16, as the official code) + lam_div * mean over pairs j != k of max(0, cos(o_j, o_k)) among the
    (normalised) OOD prompt features (the official mean of cosine_embedding_loss(target -1) over pairs j < k)."""
    ce = F.cross_entropy(id_logits, labels)
    id_mass = torch.softmax(ood_logits, dim=-1)[:, :n_cls].sum(-1)
    ood_term = torch.log(id_mass + 1e-16).mean()
    k = len(ood_text)
    if k > 1:
        sim = ood_text @ ood_text.T
        off = ~torch.eye(k, dtype=torch.bool, device=sim.device)
        div = sim[off].clamp_min(0).mean()
    else:
        div = ood_text.new_zeros(())
    loss = ce + lam_ood * ood_term + lam_div * div
    return loss, {"ce": float(ce.detach()), "ood": float(ood_term.detach()), "diversity": float(div.detach())}
