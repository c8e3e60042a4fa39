"""Pure scoring rules of the CLIP detectors on embeddings (higher = more in-distribution), float64 results."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


def cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Cosine similarities [..., K] of rows of `a` [..., P] with rows of `b` [K, P] (float32 math)."""
    return F.normalize(a.float(), dim=-1) @ F.normalize(b.float(), dim=-1).T


def max_softmax(logits: torch.Tensor) -> torch.Tensor:
    """max_i softmax_i(logits) over the last axis, in float64."""
    return torch.softmax(logits.double(), dim=-1).amax(dim=-1)


def mcm(global_: torch.Tensor, text: torch.Tensor, temperature: float = 1.0) -> np.ndarray:
    """MCM: max_i softmax_i(cos(x, t_i) / T) on the raw cosine (no logit scale)."""
    return max_softmax(cosine(global_, text) / temperature).numpy()


def local_mcm(local: torch.Tensor, text: torch.Tensor, temperature: float = 1.0, batch_size: int = 64) -> np.ndarray:
    """Max over patches of MCM on local features [N,L,P], batched over images."""
    out = [max_softmax(cosine(local[s:s + batch_size], text) / temperature).amax(dim=-1)
           for s in range(0, len(local), batch_size)]
    return torch.cat(out).numpy() if out else np.zeros(0)


def glmcm(global_: torch.Tensor, local: torch.Tensor, text: torch.Tensor, temperature: float = 1.0,
          lam: float = 1.0) -> np.ndarray:
    """GL-MCM: MCM(global) + lambda * max over patches of MCM(local)."""
    return mcm(global_, text, temperature) + lam * local_mcm(local, text, temperature)


def neglabel(global_: torch.Tensor, pos_text: torch.Tensor, neg_text: torch.Tensor, temperature: float = 0.01,
             ngroup: int = 100, seed: int = 0, batch_size: int = 1024) -> np.ndarray:
    """NegLabel: ID probability mass in a softmax over ID and negative labels (logits cos / T), averaged over
    `ngroup` groups of the negatives. Grouping as the official code: the last M % ngroup negatives are dropped, the
    rest permuted (torch generator seeded with `seed`) and cut into `ngroup` consecutive groups."""
    n_neg = neg_text.shape[0]
    ngroup = max(1, min(ngroup, n_neg)) if n_neg else 1
    keep = n_neg - n_neg % ngroup
    order = torch.randperm(keep, generator=torch.Generator().manual_seed(seed))
    grouped = neg_text[:keep][order]
    out = []
    for s in range(0, len(global_), batch_size):
        pos = cosine(global_[s:s + batch_size], pos_text).double() / temperature
        neg = (cosine(global_[s:s + batch_size], grouped).double() / temperature).reshape(len(pos), ngroup, -1)
        full = torch.cat([pos[:, None, :].expand(-1, ngroup, -1), neg], dim=-1)
        out.append(torch.softmax(full, dim=-1)[..., : pos.shape[1]].sum(-1).mean(-1))
    return torch.cat(out).numpy() if out else np.zeros(0)


def clipn_probabilities(global_: torch.Tensor, yes_text: torch.Tensor, no_text: torch.Tensor,
                        scale: float = 100.0) -> tuple[torch.Tensor, torch.Tensor]:
    """CLIPN: class probabilities p [N,C] = softmax(scale cos(x, t_yes)) and, per class, P(no) [N,C] from the
    two-way softmax over (scale cos(x, t_yes_i), scale cos(x, t_no_i))."""
    yes = scale * cosine(global_, yes_text).double()
    no = scale * cosine(global_, no_text).double()
    return torch.softmax(yes, dim=-1), torch.sigmoid(no - yes)


def clipn_ctw(p: torch.Tensor, p_no: torch.Tensor) -> np.ndarray:
    """CTW (competing-to-win): P(yes) = 1 - P(no) at the predicted class."""
    pred = p.argmax(dim=-1, keepdim=True)
    return (1.0 - p_no.gather(1, pred)).squeeze(1).numpy()


def clipn_atd(p: torch.Tensor, p_no: torch.Tensor) -> np.ndarray:
    """ATD (agreeing-to-differ): sum_i p_i (1 - P(no)_i)."""
    return (p * (1.0 - p_no)).sum(-1).numpy()
