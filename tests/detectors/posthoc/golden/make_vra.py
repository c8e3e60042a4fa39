"""Golden scores of OpenOOD's VRA postprocessor (vra_postprocessor.py at openood_ref.COMMIT), on fixed features through
a stand-in net whose feature extractor is the identity (`net(x, return_feature=True)` = (fc(x), x), `net.fc`): `setup`
on the ID val batches, `set_hyperparam` with the point (as OpenOOD's APS sweep does), `postprocess` on the test rows.
Writes vra.json beside this file."""
from __future__ import annotations

import numpy as np
import openood_ref
import torch

D, C = 24, 6
POINTS = ((90, 10), (85, 1), (99, 15), (95, 5))  # (percentile_high, percentile_low)


class StandIn(torch.nn.Module):
    def __init__(self, weight: np.ndarray, bias: np.ndarray):
        super().__init__()
        self.fc = torch.nn.Linear(D, C)
        with torch.no_grad():
            self.fc.weight.copy_(torch.from_numpy(weight))
            self.fc.bias.copy_(torch.from_numpy(bias))

    def forward(self, x, return_feature=False):
        return (self.fc(x), x) if return_feature else self.fc(x)


def main() -> None:
    module = openood_ref.load("vra_postprocessor")
    torch.Tensor.cuda = lambda self, *a, **k: self  # the reference moves batches to CUDA; this runs on the CPU
    rng = np.random.default_rng(45)
    weight, bias = openood_ref.rounded(rng, (C, D), 0.4), openood_ref.rounded(rng, (C,))
    val = np.round(openood_ref.rounded(rng, (50, D)) + np.float32(0.4), 4).astype(np.float32)
    test = np.round(openood_ref.rounded(rng, (20, D), 1.5) + np.float32(0.3), 4).astype(np.float32)
    net = StandIn(weight, bias)
    cases = []
    for high, low in POINTS:
        post = module.VRAPostprocessor(openood_ref.config(percentile_high=high, percentile_low=low))
        post.setup(net, {"val": [{"data": torch.from_numpy(val[i:i + 16].copy())} for i in range(0, len(val), 16)]},
                   {})
        post.set_hyperparam([high, low])
        _, conf = post.postprocess(net, torch.from_numpy(test.copy()))
        cases.append({"percentile_high": high, "percentile_low": low,
                      "thresholds": [float(post.threshold_low), float(post.threshold_high)],
                      "scores": openood_ref.as_list(conf.numpy().astype(np.float64))})
    payload = {"inputs": {"weight": openood_ref.as_list(weight), "bias": openood_ref.as_list(bias),
                          "val": openood_ref.as_list(val), "test": openood_ref.as_list(test)},
               "cases": cases}
    print(openood_ref.write("vra", "make_vra.py", payload))


if __name__ == "__main__":
    main()
