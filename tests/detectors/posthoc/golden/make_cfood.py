"""Golden scores of OpenOOD's CF-OOD postprocessor (cfood_postprocessor.py at openood_ref.COMMIT), run on fixed
features through a stand-in net whose backbone is the identity: `net(x, return_feature=True)` = (W x + b, x). With
alpha < 1 the reference draws its reference rows with `torch.randperm` (seeded here): the rows drawn are written too.
Writes cfood.json beside this file."""
from __future__ import annotations

import numpy as np
import openood_ref
import torch

D, C = 8, 3


class StandIn(torch.nn.Module):
    """The backbone is the identity: the data are the penultimate features."""

    def __init__(self, weight: np.ndarray, bias: np.ndarray):
        super().__init__()
        self.fc = torch.nn.Linear(weight.shape[1], weight.shape[0])
        with torch.no_grad():
            self.fc.weight.copy_(torch.from_numpy(weight))
            self.fc.bias.copy_(torch.from_numpy(bias))

    def forward(self, x, return_feature=False):
        return (self.fc(x), x) if return_feature else self.fc(x)


def run(module, train: np.ndarray, test: np.ndarray, weight, bias, alpha: float, k: float):
    post = module.CFOODPostprocessor(openood_ref.config(alpha=alpha, k=k, avg_topk=False))
    net = StandIn(weight, bias)
    torch.manual_seed(0)
    batches = [{"data": torch.from_numpy(train[i:i + 32].copy())} for i in range(0, len(train), 32)]
    post.setup(net, {"train": batches})
    _, conf = post.postprocess(net, torch.from_numpy(test.copy()))
    return conf.numpy().astype(np.float64), post.index_id.numpy()


def main() -> None:
    module = openood_ref.load("cfood_postprocessor")
    rng = np.random.default_rng(41)
    weight, bias = openood_ref.rounded(rng, (C, D), 0.5), openood_ref.rounded(rng, (C,))
    # ReLU-like features in a cone (positive offset); test rows near it, scattered, and a few pointing away from it
    train = np.round(np.maximum(openood_ref.rounded(rng, (200, D)) + np.float32(1.0), 0.0), 4).astype(np.float32)
    near = np.round(np.maximum(openood_ref.rounded(rng, (24, D), 1.3) + np.float32(1.0), 0.0), 4).astype(np.float32)
    away = -np.abs(openood_ref.rounded(rng, (4, D))) - np.float32(1.0)
    test = np.concatenate([near, away, train[:3]])  # the last three: training rows themselves (distance 0)
    cases = []
    for alpha in (1.0, 0.5, 0.1):
        for k in (0.001, 0.005, 0.01, 0.05):
            scores, rows = run(module, train, test, weight, bias, alpha, k)
            cases.append({"alpha": alpha, "k": k, "rows": rows.tolist(), "scores": openood_ref.as_list(scores)})
    payload = {"inputs": {"weight": openood_ref.as_list(weight), "bias": openood_ref.as_list(bias),
                          "train": openood_ref.as_list(train), "test": openood_ref.as_list(test)},
               "cases": cases}
    print(openood_ref.write("cfood", "make_cfood.py", payload))


if __name__ == "__main__":
    main()
