"""Makes csp.json: the official CSP code's conjugation, selection and score, re-expressed on plain torch tensors and
run on fixed random features (no CLIP, no mmcls), for tests/detectors/clip/test_clip_csp.py to compare against.

Source: MengyuanChen21/NeurIPS2024-CSP at commit 3a7bdabeb89301053ba8bfc56b227b6d81b273e9:
- conjugation: mmcls/models/classifiers/multi_modal.py:87-88 (random.seed(seed)) and :110-113 (one
  random.choice of csp_templates per adjective, then the adjective prompt ensemble);
- selection: multi_modal.py:160-181 (per candidate the torch.quantile of its cosines to the ID classes; those with a
  cosine above 0.95 set to 1.0; per part argsort, the first int(n * neg_topk));
- score: mmcls/models/ood/clip_ood.py:25-49 (grouping; t = 1 on logits 100 cos; permutation after torch.manual_seed(0),
  here drawn on the CPU, the official draws it on CUDA).

Run: `python tests/detectors/clip/golden/make_csp_golden.py` (writes csp.json next to it).
"""
from __future__ import annotations

import json
import random
from pathlib import Path

import torch

COMMIT = "3a7bdabeb89301053ba8bfc56b227b6d81b273e9"
SUPERCLASSES = ["{} environment", "{} space", "{} object", "{} scene", "{} place", "{} item", "{} area", "{} view",
                "{} thing", "{} pattern", "{} structure", "{} landscape", "{} vista", "{} creature"]
ADJ_ENSEMBLE = ["{}", "a nice photo of {}", "a good photo of {}", "a close-up photo of {}"]


def inputs() -> dict[str, torch.Tensor]:
    """Fixed features: 7 images, 3 ID classes, 40 noun and 20 adjective candidates in 16 dimensions; noun 5 and
    adjective 2 lie within cosine 0.95 of an ID class (the rule that ranks them last)."""
    g = torch.Generator().manual_seed(1234)
    unit = lambda x: x / x.norm(dim=-1, keepdim=True)  # noqa: E731
    pos = unit(torch.randn(3, 16, generator=g))
    nouns = unit(torch.randn(40, 16, generator=g))
    adjs = unit(torch.randn(20, 16, generator=g))
    nouns[5] = unit(pos[1] + 0.05 * torch.randn(16, generator=g))
    adjs[2] = unit(pos[0] + 0.05 * torch.randn(16, generator=g))
    images = unit(torch.randn(7, 16, generator=g))
    return {"pos": pos, "nouns": nouns, "adjs": adjs, "images": images}


def official_conjugation(adjectives: list[str], seed: int = 0) -> list[str]:
    """multi_modal.py:87-88, 110-113: the prompts of each adjective's conjugated label, in order."""
    random.seed(seed)
    prompts = []
    for adj in adjectives:
        candidate = random.choice(SUPERCLASSES).format(adj)
        prompts += [t.format(candidate) for t in ADJ_ENSEMBLE]
    return prompts


def official_selection(neg: torch.Tensor, pos: torch.Tensor, noun_length: int, neg_topk: float,
                       percentile: float = 0.95, batch: int = 1000) -> tuple[torch.Tensor, torch.Tensor]:
    """multi_modal.py:160-181 on normalised [noun+adj, D] and [C, D]: (kept noun indices, kept adjective indices)."""
    sims = []
    for i in range(0, len(neg), batch):
        tmp = (neg[i:i + batch] @ pos.T).to(torch.float32)
        sim = torch.quantile(tmp, q=percentile, dim=-1)
        sim[torch.max(tmp, dim=1)[0] > 0.95] = 1.0
        sims.append(sim)
    sims = torch.cat(sims)
    ind_noun, ind_adj = torch.argsort(sims[:noun_length]), torch.argsort(sims[noun_length:])
    return ind_noun[:int(len(ind_noun) * neg_topk)], ind_adj[:int(len(ind_adj) * neg_topk)]


def official_score(pos: torch.Tensor, neg: torch.Tensor, ngroup: int, t: float = 1.0) -> torch.Tensor:
    """clip_ood.py:25-49 (random_permute=True, group_fuse_num=None) on logits [N, C] and [N, M]."""
    drop = neg.shape[1] % ngroup
    if drop > 0:
        neg = neg[:, :-drop]
    torch.manual_seed(0)
    idx = torch.randperm(neg.shape[1])
    negs = neg.T[idx].T.reshape(pos.shape[0], ngroup, -1).contiguous()
    scores = []
    for i in range(ngroup):
        full = torch.cat([pos, negs[:, i, :]], dim=-1) / t
        scores.append(full.softmax(dim=-1)[:, :pos.shape[1]].sum(dim=-1).unsqueeze(-1))
    return torch.cat(scores, dim=-1).mean(dim=-1)


def main() -> None:
    x = inputs()
    out: dict = {"commit": COMMIT, "conjugated_prompts": official_conjugation(["wooden", "shiny", "ancient", "blue"])}
    neg_all = torch.cat([x["nouns"], x["adjs"]])
    for topk in (0.15, 0.3):
        kn, ka = official_selection(neg_all, x["pos"], 40, topk)
        out[f"kept_nouns_{topk}"], out[f"kept_adjs_{topk}"] = kn.tolist(), ka.tolist()
    kn, ka = torch.tensor(out["kept_nouns_0.3"]), torch.tensor(out["kept_adjs_0.3"])
    neg = torch.cat([x["nouns"][kn], x["adjs"][ka]])  # 12 + 6 = 18 negatives
    for ngroup in (1, 4, 18):
        score = official_score(100.0 * x["images"] @ x["pos"].T, 100.0 * x["images"] @ neg.T, ngroup)
        out[f"score_ngroup{ngroup}"] = score.double().tolist()
    path = Path(__file__).with_name("csp.json")
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
