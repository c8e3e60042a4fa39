"""Golden scores of OpenOOD's Residual postprocessor (residual_postprocessor.py at openood_ref.COMMIT), run on fixed
features through a stand-in net whose backbone is the identity: `net(x, return_feature=True)` = (W x + b, x) and
`get_fc()` = (W, b) as numpy, as OpenOOD's networks return them. Writes residual.json beside this file."""
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
        return (self.fc(x), x) if return_feature else self.fc(x)

    def get_fc(self):
        return self.fc.weight.detach().numpy(), self.fc.bias.detach().numpy()


def loader(x: np.ndarray, batch: int = 16) -> list[dict]:
    return [{"data": torch.from_numpy(x[i:i + batch])} for i in range(0, len(x), batch)]


def run(module, fit: np.ndarray, test: np.ndarray, weight, bias, dim: int) -> np.ndarray:
    post = module.ResidualPostprocessor(openood_ref.config(dim=dim))
    net = StandIn(weight, bias)
    post.setup(net, {"val": loader(fit), "test": loader(fit[:4])}, {})
    _, score = post.postprocess(net, torch.from_numpy(test))
    return score.numpy().astype(np.float64)  # float32 there: written as float64


def main() -> None:
    module = openood_ref.load("residual_postprocessor")
    torch.Tensor.cuda = lambda self, *a, **k: self  # the reference moves batches to CUDA; this runs on the CPU
    rng = np.random.default_rng(39)
    weight, bias = openood_ref.rounded(rng, (C, D), 0.3), openood_ref.rounded(rng, (C,))
    fit = openood_ref.rounded(rng, (80, D)) * np.linspace(0.2, 2.0, D, dtype=np.float32) + np.float32(0.5)
    fit = np.round(fit, 4).astype(np.float32)
    test = openood_ref.rounded(rng, (30, D), 1.3)
    small = fit[:10]  # D > N: a singular covariance, its null space inside the residual for dim < 9
    cases = [{"fit": "fit", "dim": dim, "scores": openood_ref.as_list(run(module, fit, test, weight, bias, dim))}
             for dim in (1, 4, 8, 12)]
    cases += [{"fit": "small", "dim": dim, "scores": openood_ref.as_list(run(module, small, test, weight, bias, dim))}
              for dim in (2, 5)]
    payload = {"inputs": {"weight": openood_ref.as_list(weight), "bias": openood_ref.as_list(bias),
                          "fit": openood_ref.as_list(fit), "small_rows": 10, "test": openood_ref.as_list(test)},
               "cases": cases}
    print(openood_ref.write("residual", "make_residual.py", payload))


if __name__ == "__main__":
    main()
