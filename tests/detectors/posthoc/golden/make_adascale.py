"""Golden scores of OpenOOD's AdaScale postprocessor (adascale_postprocessor.py with the AdaScaleANet / AdaScaleLNet
wrappers of networks/adascale_net.py, at openood_ref.COMMIT), run as OpenOOD's evaluator runs it: the backbone
wrapped (evaluator.py:120-123), `setup` on the ID val batches, `set_hyperparam` with the point, `postprocess` on test
images. The backbone is a small fixed conv net. statsmodels (the reference's ECDF) is needed:
    pip install --no-deps --target /tmp/sm_ref statsmodels patsy
    PYTHONPATH=/tmp/sm_ref python tests/detectors/posthoc/golden/make_adascale.py
The reference draws its `num_samples` rows with `torch.randperm` (seeded here): the rows drawn are written too, and CUDA
calls run on the CPU. Writes adascale.json beside this file."""
from __future__ import annotations

import numpy as np
import openood_ref
import torch

D, C = 200, 5
POINTS = (  # (wrapper, percentile, k1, k2, lmbda, o)
    ("a", [75, 85], 5, 1, 10, 0.05), ("a", [60, 99], 5, 1, 10, 0.05), ("a", [90, 95], 20, 5, 1, 0.2),
    ("l", [75, 85], 5, 1, 10, 0.05), ("l", [60, 99], 5, 1, 10, 0.05), ("l", [90, 95], 20, 5, 1, 0.2),
)


class Backbone(torch.nn.Module):
    """conv 3 -> D (3x3), ReLU, global mean pool, minus 0.05 (some features negative), linear D -> C."""

    feature_size = D

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, D, 3, padding=1)
        self.fc = torch.nn.Linear(D, C)

    def forward(self, x, return_feature=False, return_feature_list=False):
        h = torch.relu(self.conv(x)).mean(dim=(2, 3)) - 0.05
        return (self.fc(h), h) if return_feature else self.fc(h)

    def get_fc_layer(self):
        return self.fc


def main() -> None:
    torch.Tensor.cuda = lambda self, *a, **k: self  # the reference moves tensors to CUDA; this runs on the CPU
    module = openood_ref.load("adascale_postprocessor", extra=("openood/networks/adascale_net.py",))
    import openood.networks.adascale_net as nets

    rng = np.random.default_rng(43)
    backbone = Backbone()
    with torch.no_grad():
        for p in backbone.parameters():
            p.copy_(torch.from_numpy(openood_ref.rounded(rng, tuple(p.shape), 0.3)))
    val = openood_ref.rounded(rng, (32, 3, 6, 6))
    test = openood_ref.rounded(rng, (12, 3, 6, 6), 1.2)
    cases = []
    for wrapper, percentile, k1, k2, lmbda, o in POINTS:
        net = (nets.AdaScaleANet if wrapper == "a" else nets.AdaScaleLNet)(backbone)
        post = module.AdaScalePostprocessor(openood_ref.config(num_samples=20, percentile=percentile, k1=k1, k2=k2,
                                                               lmbda=lmbda, o=o))
        torch.manual_seed(0)
        post.setup(net, {"val": [{"data": torch.from_numpy(val[i:i + 16].copy())} for i in (0, 16)]}, {})
        torch.manual_seed(0)
        rows = torch.randperm(len(val))[:20]  # the draw setup made (no other use of the generator in between)
        post.set_hyperparam([percentile, k1, k2, lmbda, o])
        _, conf = post.postprocess(net, torch.from_numpy(test.copy()))
        cases.append({"wrapper": wrapper, "percentile": percentile, "k1": k1, "k2": k2, "lmbda": lmbda, "o": o,
                      "rows": rows.tolist(), "scores": openood_ref.as_list(conf.numpy().astype(np.float64))})
    payload = {"inputs": {"val": openood_ref.as_list(val), "test": openood_ref.as_list(test),
                          "params": {k: openood_ref.as_list(v.numpy()) for k, v in backbone.state_dict().items()}},
               "cases": cases}
    print(openood_ref.write("adascale", "make_adascale.py", payload))


if __name__ == "__main__":
    main()
