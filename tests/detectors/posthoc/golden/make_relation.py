"""Golden scores of OpenOOD's RELATION postprocessor (relation_postprocessor.py at openood_ref.COMMIT), run on fixed
features through a stand-in net whose backbone is the identity: `net(x, return_feature=True)` = (W x + b, a copy of x;
the reference normalises the features in place). Writes relation.json beside this file."""
from __future__ import annotations

import numpy as np
import openood_ref
import torch

D, C = 16, 5


class StandIn(torch.nn.Module):
    """The backbone is the identity: the data are the penultimate features."""

    def __init__(self, weight: np.ndarray, bias: np.ndarray):
        super().__init__()
        self.fc = torch.nn.Linear(weight.shape[1], weight.shape[0])
        with torch.no_grad():
            self.fc.weight.copy_(torch.from_numpy(weight))
            self.fc.bias.copy_(torch.from_numpy(bias))

    def forward(self, x, return_feature=False):
        return (self.fc(x), x.clone()) if return_feature else self.fc(x)


def run(module, train: np.ndarray, test: np.ndarray, weight, bias, power: int) -> np.ndarray:
    post = module.RelationPostprocessor(openood_ref.config(pow=power))
    net = StandIn(weight, bias)
    batches = [{"data": torch.from_numpy(train[i:i + 16].copy())} for i in range(0, len(train), 16)]
    post.setup(net, {"train": batches}, {})
    _, score = post.postprocess(net, torch.from_numpy(test.copy()))
    return score.numpy().astype(np.float64)  # float32 there: written as float64


def main() -> None:
    module = openood_ref.load("relation_postprocessor")
    torch.Tensor.cuda = lambda self, *a, **k: self  # the reference moves batches to CUDA; this runs on the CPU
    rng = np.random.default_rng(40)
    weight, bias = openood_ref.rounded(rng, (C, D), 0.6), openood_ref.rounded(rng, (C,))
    # ReLU-like features with a shared offset: cosines spread over [-0.3, 1], so the clamp and the 0.03 cut both act
    train = np.round(np.maximum(openood_ref.rounded(rng, (60, D)) + np.float32(0.3), -0.2), 4).astype(np.float32)
    test = np.round(np.maximum(openood_ref.rounded(rng, (25, D), 1.2) + np.float32(0.2), -0.3), 4).astype(np.float32)
    cases = [{"pow": p, "scores": openood_ref.as_list(run(module, train, test, weight, bias, p))} for p in (1, 2, 4, 8)]
    payload = {"inputs": {"weight": openood_ref.as_list(weight), "bias": openood_ref.as_list(bias),
                          "train": openood_ref.as_list(train), "test": openood_ref.as_list(test)},
               "cases": cases}
    print(openood_ref.write("relation", "make_relation.py", payload))


if __name__ == "__main__":
    main()
