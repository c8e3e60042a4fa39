"""Golden numbers of OpenOOD's VOS trainer (vos_trainer.py at openood_trainers.COMMIT) over one epoch of a few fixed
batches on a stand-in network whose penultimate features are the inputs (`forward(x, return_feature=True)` = (fc(x), x),
`net.fc`), so the queues fill, then virtual outliers are drawn (torch's global generator, seeded right before
`train_epoch(1)`) and the uncertainty loss joins; the trainer's own SGD + cosine LambdaLR steps. Recorded: the loss
of every step (read at `backward`), the starting fc and logistic-regression weights, and both after the epoch.
Writes vos.json beside this file."""
from __future__ import annotations

import numpy as np
import openood_trainers as ref
import torch

D = 5
CASES = (  # (classes, sample_number, sample_from, select, batch sizes, seed)
    (3, 4, 50, 2, (6, 6, 6, 6, 6, 1), 0),
    (2, 3, 40, 1, (4, 4, 4, 3, 5), 1),
)


class AttrDict(dict):
    """OpenOOD's Config: item and attribute access."""

    def __getattr__(self, name):
        return self[name]


class Net(torch.nn.Module):
    def __init__(self, classes: int):
        super().__init__()
        self.fc = torch.nn.Linear(D, classes)

    def forward(self, x, return_feature=False):
        return (self.fc(x), x) if return_feature else self.fc(x)


def case(module, classes, sample_number, sample_from, select, sizes, seed) -> dict:
    rng = np.random.default_rng(seed)
    torch.manual_seed(100 + seed)
    net = Net(classes)
    fc = {"weight": ref.rounded(rng, (classes, D), 0.5), "bias": ref.rounded(rng, (classes,), 0.5)}
    with torch.no_grad():
        net.fc.weight.copy_(torch.from_numpy(fc["weight"]))
        net.fc.bias.copy_(torch.from_numpy(fc["bias"]))
    batches = []
    for i, n in enumerate(sizes):
        y = np.arange(n) % classes if i < 2 else rng.integers(0, classes, n)
        x = ref.rounded(rng, (n, D)) + np.float32(0.5) * y[:, None].astype(np.float32)
        batches.append({"data": torch.from_numpy(x), "label": torch.from_numpy(y)})
    config = AttrDict(num_classes=classes, sample_number=sample_number, sample_from=sample_from, select=select,
                      feature_dim=D, start_epoch=0, trainer=AttrDict(loss_weight=0.1),
                      optimizer=AttrDict(num_epochs=100, lr=0.1, momentum=0.9, weight_decay=5.0e-4))
    trainer = module.VOSTrainer(net, ref.Batches(batches), config)
    lr_start = {k: ref.as_list(v) for k, v in trainer.logistic_regression.state_dict().items()}
    losses = []
    backward = torch.Tensor.backward

    def record(self, *args, **kwargs):
        losses.append(float(self.detach()))
        return backward(self, *args, **kwargs)

    torch.Tensor.backward = record
    torch.manual_seed(seed)
    trainer.train_epoch(1)
    torch.Tensor.backward = backward
    return {"classes": classes, "sample_number": sample_number, "sample_from": sample_from, "select": select,
            "seed": seed, "inputs": {"fc": {k: ref.as_list(v) for k, v in fc.items()}, "logistic": lr_start,
                                     "batches": [{"x": ref.as_list(b["data"]), "y": b["label"].tolist()}
                                                 for b in batches]},
            "losses": losses, "fc": {k: ref.as_list(v) for k, v in net.fc.state_dict().items()},
            "logistic": {k: ref.as_list(v) for k, v in trainer.logistic_regression.state_dict().items()}}


def main() -> None:
    [module] = ref.load("openood/trainers/vos_trainer.py")
    eye = torch.eye
    torch.eye = lambda *args, device=None, **kwargs: eye(*args, **kwargs)  # its `device='cuda'`: the CPU here
    cases = [case(module, *c) for c in CASES]
    print(ref.write("vos", "make_vos.py", {"defaults": {"sample_number": 1000, "sample_from": 10000, "select": 1,
                                                        "loss_weight": 0.1}, "cases": cases}))


if __name__ == "__main__":
    main()
