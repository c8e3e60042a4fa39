"""Makes adaneg.json: the official AdaNeg postprocessor re-expressed on plain torch tensors (no CLIP, no OpenOOD: a
stand-in for `net` hands it fixed image and text features) and run over a stream of fixed random features, for
tests/detectors/clip/test_clip_adaneg.py to compare against.

Source: YBZh/OpenOOD-VLM at commit 804f3310d3045c24fdd896da6c508c919fb47f0c,
openood/postprocessors/ttaprompt_postprocessor.py:664-950 (TTAPromptPostprocessor_noadagap): memory reset (:772-779),
static grouped score (:783-809), ID then negative insertion with entropy replacement (:813-868), proxies (:871-894),
adaptive grouped score and in_score (:900-946). `beta` enters as int(beta) (:669). Run on the CPU in float32 (the
official: CUDA, fp16 CLIP features).

Run: `python tests/detectors/clip/golden/make_adaneg_golden.py` (writes adaneg.json next to it).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

COMMIT = "804f3310d3045c24fdd896da6c508c919fb47f0c"


class OfficialAdaNeg:
    """The postprocessor's state and `postprocess`, on features instead of a network."""

    def __init__(self, memleng, thres, gap, lambdaval, beta, samada, in_score, group_num, random_permute=True):
        self.memory_size, self.thres, self.gap, self.lambda_val = memleng, thres, gap, lambdaval
        self.beta, self.samada, self.in_score = int(beta), samada, in_score
        self.group_num, self.random_permute, self.reset = group_num, random_permute, True
        self.replaced = 0

    def grouped(self, output, class_num):
        pos_logit, neg_logit = output[:, :class_num], output[:, class_num:]
        drop = neg_logit.size(1) % self.group_num
        if drop > 0:
            neg_logit = neg_logit[:, :-drop]
        if self.random_permute:
            torch.manual_seed(0)
            idx = torch.randperm(neg_logit.shape[1])
            neg_logit = neg_logit.T[idx].T.reshape(pos_logit.shape[0], self.group_num, -1).contiguous()
        else:
            neg_logit = neg_logit.reshape(pos_logit.shape[0], self.group_num, -1).contiguous()
        scores = []
        for i in range(self.group_num):
            full = torch.cat([pos_logit, neg_logit[:, i, :]], dim=-1).softmax(dim=-1)
            scores.append(full[:, :pos_logit.shape[1]].sum(dim=-1).unsqueeze(-1))
        return torch.cat(scores, dim=-1).mean(dim=-1)

    def store(self, indicator, pred_all, prob, offset, image_features):
        for i in range(indicator.size(0)):
            if not indicator[i].item():
                continue
            cate = pred_all[i].item() + offset
            p = prob[i]
            ent = -(p * torch.log(p + 1e-8)).sum()
            if self.indice_memory[cate] == self.memory_size:
                if (ent < self.entropy_memory[cate]).sum() == 0:
                    pass
                else:
                    _, indice = torch.sort(self.entropy_memory[cate])
                    self.feat_memory[cate][indice[-1]] = image_features[i]
                    self.entropy_memory[cate][indice[-1]] = ent
                    self.replaced += 1  # not in the official code: shows the test exercises this branch
            else:
                self.feat_memory[cate][self.indice_memory[cate].long()] = image_features[i]
                self.entropy_memory[cate][self.indice_memory[cate].long()] = ent
                self.indice_memory[cate] += 1

    @torch.no_grad()
    def postprocess(self, image_features, text_features, logit_scale, class_num):
        if self.reset:
            self.feat_memory = text_features.unsqueeze(1)
            empty = torch.zeros_like(self.feat_memory).repeat(1, self.memory_size, 1)
            self.feat_memory = torch.cat((self.feat_memory, empty), dim=1)
            self.indice_memory = torch.ones(text_features.size(0))
            self.entropy_memory = torch.zeros(self.feat_memory.size(0), self.feat_memory.size(1))
            self.reset = False
        output_vanilla = logit_scale * image_features @ text_features.t()
        conf_in_vanilla = self.grouped(output_vanilla, class_num)
        indicator = conf_in_vanilla > (self.thres + self.gap * (1 - self.thres))
        _, pred_all = torch.max(output_vanilla[:, :class_num], dim=1)
        self.store(indicator, pred_all, torch.softmax(output_vanilla[:, :class_num], dim=1), 0, image_features)
        indicator = conf_in_vanilla < (self.thres - self.gap * self.thres)
        _, pred_all = torch.max(output_vanilla[:, class_num:], dim=1)
        self.store(indicator, pred_all, torch.softmax(output_vanilla[:, class_num:], dim=1), class_num,
                   image_features)
        sim = torch.exp(-self.beta * (-(self.feat_memory @ image_features.t()) + 1))
        if self.samada:  # the official splits the labels in chunks of 1000; one chunk here (fewer labels)
            temp = sim.unsqueeze(0).transpose(0, -1) * self.feat_memory.unsqueeze(0)
            sa_text_features = temp.sum(2)
            sa_text_features /= sa_text_features.norm(dim=-1, keepdim=True)
        else:
            sa_text_features = self.feat_memory.mean(1)
            sa_text_features /= sa_text_features.norm(dim=-1, keepdim=True)
        output = logit_scale * (image_features.unsqueeze(1) * sa_text_features).sum(-1)
        conf_in = self.grouped(output, class_num)
        return {"adaonly": conf_in, "vanillaonly": conf_in_vanilla,
                "combine": conf_in + conf_in_vanilla * self.lambda_val,
                "multiply": conf_in * conf_in_vanilla}[self.in_score]


def inputs() -> dict[str, torch.Tensor]:
    """3 ID classes and 13 negative labels in 16 dimensions; a stream of 48 images, each near one label (a label
    drawn at random, noise 0.6), so that both memories fill and the entropy replacement runs."""
    g = torch.Generator().manual_seed(39)
    unit = lambda x: x / x.norm(dim=-1, keepdim=True)  # noqa: E731
    text = unit(torch.randn(16, 16, generator=g))
    near = torch.randint(0, 16, (48,), generator=g)
    images = unit(text[near] + 0.6 * torch.randn(48, 16, generator=g) / 4)
    return {"text": text, "images": images}


CONFIGS = {
    "combine": dict(memleng=3, thres=0.5, gap=0.5, lambdaval=0.1, beta=5.5, samada=False, in_score="combine",
                    group_num=4),
    "samada": dict(memleng=3, thres=0.5, gap=0.5, lambdaval=0.1, beta=5.5, samada=True, in_score="combine",
                   group_num=4),
    "multiply_gap0": dict(memleng=2, thres=0.4, gap=0.0, lambdaval=0.3, beta=2.0, samada=False, in_score="multiply",
                          group_num=13),
}
BATCH = 8
SCALE = 20.0  # a milder logit scale than CLIP's 100, so that the static scores spread over (0, 1)


def main() -> None:
    x = inputs()
    out: dict = {"commit": COMMIT, "batch": BATCH, "scale": SCALE, "n_cls": 3}
    for name, cfg in CONFIGS.items():
        post = OfficialAdaNeg(**cfg)
        scores = [post.postprocess(x["images"][s:s + BATCH], x["text"], SCALE, 3) for s in range(0, 48, BATCH)]
        out[name] = {"config": cfg, "scores": torch.cat(scores).double().tolist(),
                     "stored": (post.indice_memory - 1).long().tolist(), "replaced": post.replaced}
    path = Path(__file__).with_name("adaneg.json")
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
