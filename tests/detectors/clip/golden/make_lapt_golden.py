"""Makes lapt.json: LAPT's official negative-label selection, training loss and score re-expressed on plain torch
tensors (no CLIP, no OpenOOD: fixed random features stand in for the network's) for
tests/detectors/clip/test_clip_lapt.py to compare against.

Source: YBZh/OpenOOD-VLM at commit 804f3310d3045c24fdd896da6c508c919fb47f0c:
- openood/networks/clip_coop_negprompt.py:398-474 `get_selected_ood_text_list` (selection, on given cosine matrices);
- openood/trainers/oodmixup_trainer.py:180-203 `create_mixed_indices`, :205-268 `mixup_data` ('cross_dis', 'wccm'),
  :744-765 and :861-865 (`OodMixupTrainer_idood`, mix 'wccm' / 'wccm_cd', loss 'multice', beta 0), with
  openood/losses/sce.py `SoftCrossEntropyFunction`. The soft label is the dataset's C+K one-hot: the official line
  :714-720 appends an OOD column to it (n_output != n_cls), which the loss's size assert then rejects against the
  [B, C+K] logits; the column's weight is 0 with beta 0, so it is left out here. The random draws (np.random.beta,
  torch.randint) are recorded and written out, for the test to replay;
- openood/postprocessors/oneoodprompt_postprocessor.py:30-75 `postprocess` (pred, grouped ID mass), with its
  `class_num = 1000` read as C.
Run on the CPU in float32 (the official: CUDA, fp16 CLIP).

Run: `python tests/detectors/clip/golden/make_lapt_golden.py` (writes lapt.json next to it).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

COMMIT = "804f3310d3045c24fdd896da6c508c919fb47f0c"
C, K, T, D = 3, 9, 4, 16  # ID classes, training negatives, mixing templates, embedding width


def unit(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=-1, keepdim=True)


# -- selection (clip_coop_negprompt.py:398-474, from the loaded cosine matrices on) ---------------------------------
def official_selection(can_cos_adj, can_cos_noun, total_ood_num):
    adj_num = int(total_ood_num * (can_cos_adj.size(0) / (can_cos_adj.size(0) + can_cos_noun.size(0))))
    noun_num = total_ood_num - adj_num
    cate_num = can_cos_adj.size(1)
    cos_sim_indice_selected = int(cate_num * 0.95)
    value_cos_adj, _ = can_cos_adj.sort(1)
    value_cos_noun, _ = can_cos_noun.sort(1)
    selected_value_cos_adj = value_cos_adj[:, cos_sim_indice_selected]
    selected_value_cos_noun = value_cos_noun[:, cos_sim_indice_selected]
    _, indice_sim_adj = selected_value_cos_adj.sort(0)
    _, indice_sim_noun = selected_value_cos_noun.sort(0)
    return indice_sim_adj[:adj_num].tolist(), indice_sim_noun[:noun_num].tolist()


# -- training loss (oodmixup_trainer.py) ------------------------------------------------------------------------------
class SoftCrossEntropyFunction(torch.autograd.Function):
    """openood/losses/sce.py, without the weight branch."""

    @staticmethod
    def forward(ctx, logit, label):
        assert logit.size() == label.size(), 'logit.size() != label.size()'
        dim = logit.dim()
        max_logit = logit.max(dim - 1, keepdim=True)[0]
        logit = logit - max_logit
        exp_logit = logit.exp()
        exp_sum = exp_logit.sum(dim - 1, keepdim=True)
        prob = exp_logit / exp_sum
        neg_log_prob = exp_sum.log() - logit
        ctx.save_for_backward(label, prob)
        return (neg_log_prob * label).sum(dim - 1)

    @staticmethod
    def backward(ctx, grad_output):
        weighted_label, prob = ctx.saved_tensors
        B, K_ = weighted_label.numel() // weighted_label.size(-1), weighted_label.size(-1)
        grad_output = grad_output.view(B, 1)
        grad_input = grad_output * (prob.view(B, K_) * weighted_label.view(B, K_).sum(1, True)
                                    - weighted_label.view(B, K_))
        return grad_input.view(weighted_label.size()), None


def soft_cross_entropy(logit, label):
    return SoftCrossEntropyFunction.apply(logit, label).mean()


DRAWS: dict[str, list] = {"beta": [], "randint": []}


def recorded_beta(alpha):
    lam = np.random.beta(alpha, alpha)
    DRAWS["beta"].append(float(lam))
    return lam


def recorded_randint(*args, **kwargs):
    out = torch.randint(*args, **kwargs)
    DRAWS["randint"].append(out.tolist())
    return out


def create_mixed_indices(y, n_cls):
    indices_id = torch.where(y < n_cls)[0]
    indices_ood = torch.where(y >= n_cls)[0]
    if len(indices_id) == 0 or len(indices_ood) == 0:
        return torch.arange(len(y))
    mixed_indices = torch.arange(len(y))
    for idx in indices_id:
        mixed_indices[idx] = indices_ood[recorded_randint(len(indices_ood), (1,))]
    for idx in indices_ood:
        mixed_indices[idx] = indices_id[recorded_randint(len(indices_id), (1,))]
    return mixed_indices


def mixup_data(x, y, soft_y, alpha, mix_strategy, n_cls):
    lam = recorded_beta(alpha) if alpha > 0 else 1
    if mix_strategy == 'cross_dis':
        index = create_mixed_indices(y, n_cls)
        soft_ya, soft_yb = soft_y, soft_y[index]
        mixed_x = lam * x + (1 - lam) * x[index]
        mixed_x = mixed_x / mixed_x.norm(dim=-1, keepdim=True)
        return mixed_x, soft_ya, soft_yb, lam, index
    image_features, text_feats = x  # 'wccm'
    batch_size = image_features.size()[0]
    text_num = text_feats.size()[1]
    random_indices = recorded_randint(0, text_num, (batch_size,))
    selected_text_feat = text_feats[y, random_indices, :]
    mixed_x = lam * image_features + (1 - lam) * selected_text_feat
    mixed_x = mixed_x / mixed_x.norm(dim=-1, keepdim=True)
    return mixed_x, soft_y, soft_y, lam, random_indices


def official_loss(image_features, text_features, text_feats, y, logit_scale, mix_strategy, alpha=1.0, beta=0.0):
    """One training step's loss (the prompts' text features stand in for the network's output)."""
    soft_y = F.one_hot(y, text_features.size(0)).float()
    mixup_x_wccm, part_y_a, part_y_b, lam, idx = mixup_data([image_features, text_feats], y, soft_y, alpha, 'wccm',
                                                            C)
    logits_all = logit_scale * mixup_x_wccm @ text_features.t()
    loss = soft_cross_entropy(logits_all, soft_y)
    out = {"template_idx": idx.tolist(), "lam": float(lam)}
    if mix_strategy == 'wccm_cd':
        mixup_x_cd, part_y_a, part_y_b, lam, pair = mixup_data(image_features, y, soft_y, alpha, 'cross_dis', C)
        logits_cd = logit_scale * mixup_x_cd @ text_features.t()
        ood_lam = min(beta * lam, 1)
        id_lam = 1 - ood_lam
        mixup_y = id_lam * (lam * part_y_a + (1 - lam) * part_y_b)  # + ood_lam * ood_label, 0 at beta 0
        loss = loss + soft_cross_entropy(logits_cd, mixup_y)
        out.update(pair=pair.tolist(), lam_cd=float(lam))
    return loss, out


# -- score (oneoodprompt_postprocessor.py:30-75) ----------------------------------------------------------------------
def official_score(image_features, text_features, logit_scale, class_num, group_num, random_permute=True):
    output = logit_scale * image_features @ text_features.t()
    _, pred_in = torch.max(output[:, :class_num], dim=1)
    pos_logit = output[:, :class_num]
    neg_logit = output[:, class_num:]
    drop = neg_logit.size(1) % group_num
    if drop > 0:
        neg_logit = neg_logit[:, :-drop]
    if random_permute:
        torch.manual_seed(0)
        idx = torch.randperm(neg_logit.shape[1])
        neg_logit = neg_logit.T[idx].T.reshape(pos_logit.shape[0], group_num, -1).contiguous()
    else:
        neg_logit = neg_logit.reshape(pos_logit.shape[0], group_num, -1).contiguous()
    scores = []
    for i in range(group_num):
        full_sim = torch.cat([pos_logit, neg_logit[:, i, :]], dim=-1).softmax(dim=-1)
        scores.append(full_sim[:, :pos_logit.shape[1]].sum(dim=-1).unsqueeze(-1))
    return pred_in, torch.cat(scores, dim=-1).mean(dim=-1)


def inputs() -> dict[str, torch.Tensor]:
    """C ID classes and K training negatives in D dimensions, T mixing templates per label; 10 images (6 ID, 4 of
    negative labels) near their label; 21 test negatives for the score; cosine matrices of 7 adjective and 11 noun
    candidates against 20 ID classes."""
    g = torch.Generator().manual_seed(39)
    text = unit(torch.randn(C + K, D, generator=g))
    mix_text = unit(text[:, None, :] + 1.0 * torch.randn(C + K, T, D, generator=g) / 4)
    labels = torch.tensor([0, 1, 2, 0, 1, 2, 3, 5, 8, 11])
    images = unit(text[labels] + 3.0 * torch.randn(len(labels), D, generator=g) / 4)
    score_text = unit(torch.randn(C + 21, D, generator=g))
    return {"text": text, "mix_text": mix_text, "labels": labels, "images": images, "score_text": score_text,
            "adj_cos": torch.rand(7, 20, generator=g) * 2 - 1, "noun_cos": torch.rand(11, 20, generator=g) * 2 - 1}


SCALE = 20.0  # a milder logit scale than CLIP's 100, so that the probabilities spread


def main() -> None:
    x = inputs()
    out: dict = {"commit": COMMIT, "scale": SCALE, "C": C, "K": K}
    out["selection"] = {str(total): official_selection(x["adj_cos"], x["noun_cos"], total) for total in (3, 10, 18)}
    for strategy, seed in (("wccm", 0), ("wccm_cd", 1)):
        np.random.seed(seed)
        torch.manual_seed(seed)
        DRAWS["beta"].clear()
        DRAWS["randint"].clear()
        text = x["text"].clone().requires_grad_(True)
        loss, draws = official_loss(x["images"], text, x["mix_text"], x["labels"], SCALE, strategy)
        loss.backward()
        out[strategy] = {"loss": float(loss.detach()), "grad": text.grad.double().tolist(), **draws}
    for group_num in (1, 4, 21):
        pred, score = official_score(x["images"], x["score_text"], SCALE, C, group_num)
        out[f"score_g{group_num}"] = {"pred": pred.tolist(), "score": score.double().tolist()}
    path = Path(__file__).with_name("lapt.json")
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
