"""Golden scores of OpenOOD's MC-dropout postprocessor (dropout_postprocessor.py with the DropoutNet of
networks/dropout_net.py, at openood_ref.COMMIT), on fixed features through a stand-in backbone whose feature extractor
is the identity (`backbone(x, return_feature=True)` = (fc(x), x), `backbone.fc`), batch by batch as OpenOOD's loader
feeds it, after `torch.manual_seed(seed)` (the reference draws its masks from the global generator, unseeded).
Writes dropout.json beside this file."""
from __future__ import annotations

import numpy as np
import openood_ref
import torch

D, C = 12, 4
POINTS = ((0.5, 5, 8, 0), (0.5, 5, 8, 1), (0.2, 3, 5, 7), (0.9, 10, 30, 2))  # (p, times, batch rows, seed)


class Backbone(torch.nn.Module):
    def __init__(self, weight: np.ndarray, bias: np.ndarray):
        super().__init__()
        self.fc = torch.nn.Linear(D, C)
        with torch.no_grad():
            self.fc.weight.copy_(torch.from_numpy(weight))
            self.fc.bias.copy_(torch.from_numpy(bias))

    def forward(self, x, return_feature=False):
        return (self.fc(x), x) if return_feature else self.fc(x)


def main() -> None:
    module = openood_ref.load("dropout_postprocessor", extra=("openood/networks/dropout_net.py",))
    from openood.networks.dropout_net import DropoutNet

    rng = np.random.default_rng(44)
    weight, bias = openood_ref.rounded(rng, (C, D), 0.8), openood_ref.rounded(rng, (C,))
    test = np.round(np.maximum(openood_ref.rounded(rng, (30, D)) + np.float32(0.5), 0), 4).astype(np.float32)
    cases = []
    for p, times, rows, seed in POINTS:
        net = DropoutNet(Backbone(weight, bias), dropout_p=p)
        post = module.DropoutPostProcessor(openood_ref.config(dropout_p=p, dropout_times=times))
        torch.manual_seed(seed)
        conf = [post.postprocess(net, torch.from_numpy(test[i:i + rows].copy()))[1] for i in range(0, len(test), rows)]
        cases.append({"p": p, "times": times, "batch_rows": rows, "seed": seed,
                      "scores": openood_ref.as_list(torch.cat(conf).numpy().astype(np.float64))})
    payload = {"inputs": {"weight": openood_ref.as_list(weight), "bias": openood_ref.as_list(bias),
                          "test": openood_ref.as_list(test)},
               "cases": cases}
    print(openood_ref.write("dropout", "make_dropout.py", payload))


if __name__ == "__main__":
    main()
