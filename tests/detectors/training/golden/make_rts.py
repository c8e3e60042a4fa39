"""Golden numbers of OpenOOD's RTS (rts_net.py, rts_trainer.py, rts_postprocessor.py at openood_trainers.COMMIT): one
epoch of the reference trainer over a few fixed batches on a stand-in backbone whose penultimate features are the
inputs (`forward(x, return_feature=True)` = (fc(x), x), `feature_size` D) wrapped in the reference's RTSNet, torch's
global generator seeded right before `train_epoch` (the trainer's epsilon draws); the trainer's own SGD (nesterov),
cosine LambdaLR and gradient clipping step. Recorded: the starting fc and variance head, every step's loss (read at
`backward`) and total gradient norm before clipping (read at `clip_grad_norm_`), both after the epoch (batch-norm
running statistics included), and the postprocessor's (pred, conf) on a test batch in eval mode for ood_score `var`
and `msp`. Writes rts.json beside this file."""
from __future__ import annotations

import numpy as np
import openood_trainers as ref
import torch
from torch import nn

D = 5
CASES = (  # (classes, dof, kl_scale, batch sizes, input scale, seed)
    (3, 32, 0.1, (6, 6, 5), 1.0, 0),  # rts_net.yml's dof and kl_scale
    (2, 4, 0.5, (4, 3, 4), 3.0, 1),
    (3, 3, 0.1, (5, 2), 0.5, 2),  # the smallest dof whose temperature is defined (dof - 2 = 1)
)


class Backbone(nn.Module):
    def __init__(self, classes: int):
        super().__init__()
        self.fc = nn.Linear(D, classes)
        self.feature_size = D

    def forward(self, x, return_feature=False):
        return (self.fc(x), x) if return_feature else self.fc(x)


def case(modules, classes, dof, kl_scale, sizes, scale, seed) -> dict:
    net_module, trainer_module, post_module = modules
    rng = np.random.default_rng(seed)
    torch.manual_seed(100 + seed)
    net = net_module.RTSNet(Backbone(classes), feature_size=D, num_classes=classes, dof=dof)
    start = {k: ref.as_list(v) for k, v in net.state_dict().items()}
    batches = []
    for i, n in enumerate(sizes):
        y = np.arange(n) % classes if i == 0 else rng.integers(0, classes, n)
        x = ref.rounded(rng, (n, D), scale) + np.float32(0.5) * y[:, None].astype(np.float32)
        batches.append({"data": torch.from_numpy(x), "label": torch.from_numpy(y)})
    config = ref.namespace({"network": {"dof": dof, "kl_scale": kl_scale},
                            "optimizer": {"num_epochs": 100, "lr": 0.1, "momentum": 0.9, "weight_decay": 5.0e-4}})
    trainer = trainer_module.RTSTrainer(net, ref.Batches(batches), config)
    losses, norms = [], []
    backward, clip = torch.Tensor.backward, nn.utils.clip_grad_norm_

    def record(self, *args, **kwargs):
        losses.append(float(self.detach()))
        return backward(self, *args, **kwargs)

    def recorded_clip(*args, **kwargs):
        norm = clip(*args, **kwargs)
        norms.append(float(norm))
        return norm

    torch.Tensor.backward, nn.utils.clip_grad_norm_ = record, recorded_clip
    torch.manual_seed(seed)
    trainer.train_epoch(1)
    torch.Tensor.backward, nn.utils.clip_grad_norm_ = backward, clip
    test = ref.rounded(rng, (7, D), 2.0)
    net.eval()
    scores = {}
    for rule in ("var", "msp"):
        args = {"postprocessor": {"postprocessor_args": {"ood_score": rule}}}
        post = post_module.RTSPostprocessor(ref.namespace(args))
        with torch.no_grad():
            pred, conf = post.postprocess(net, torch.from_numpy(test))
        scores[rule] = {"pred": pred.tolist(), "conf": ref.as_list(conf)}
    return {"classes": classes, "dof": dof, "kl_scale": kl_scale, "seed": seed,
            "inputs": {"state": start, "batches": [{"x": ref.as_list(b["data"]), "y": b["label"].tolist()}
                                                   for b in batches], "test": ref.as_list(test)},
            "losses": losses, "grad_norms": norms,
            "state": {k: ref.as_list(v) for k, v in net.state_dict().items()}, "scores": scores}


def main() -> None:
    modules = ref.load("openood/networks/rts_net.py", "openood/trainers/rts_trainer.py",
                       "openood/postprocessors/rts_postprocessor.py", "openood/trainers/lr_scheduler.py",
                       "openood/postprocessors/base_postprocessor.py")[:3]
    torch.set_num_threads(1)
    cases = [case(modules, *c) for c in CASES]
    print(ref.write("rts", "make_rts.py", {"defaults": {"dof": 32, "kl_scale": 0.1, "score_rule": "var"},
                                           "max_grad_norm": 2.5, "cases": cases}))


if __name__ == "__main__":
    main()
