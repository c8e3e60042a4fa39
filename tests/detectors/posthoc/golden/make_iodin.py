"""Golden scores of OpenOOD's i-ODIN postprocessor (iodin_postprocessor.py, with the odin_postprocessor.py it
subclasses, at openood_ref.COMMIT), run on fixed normalised pixels through a small fixed conv net (`net(x)` = logits,
as OpenOOD calls it) with `dataset.name` cifar10 (the step divided by its normalisation std, transform.py:4).
torchvision, which transform.py imports for its interpolation modes only, is not installed here: a bare stand-in
module takes its place. Writes iodin.json beside this file."""
from __future__ import annotations

import sys
import types
from types import SimpleNamespace

import numpy as np
import openood_ref
import torch

CASES = ((1000.0, 0.0014), (10.0, 0.05), (1.0, 0.3), (100.0, 0.0028))


class SmallNet(torch.nn.Module):
    """conv 3 -> 4 (3x3), ReLU, global mean pool, linear 4 -> 3: its forward returns (logits, pooled features)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        h = torch.relu(self.conv(x)).mean(dim=(2, 3))
        return self.fc(h), h


def stand_in_torchvision() -> None:
    transforms = types.ModuleType("torchvision.transforms")
    transforms.InterpolationMode = SimpleNamespace(NEAREST="nearest", BILINEAR="bilinear")
    package = types.ModuleType("torchvision")
    package.transforms = transforms
    sys.modules.update({"torchvision": package, "torchvision.transforms": transforms})


def main() -> None:
    stand_in_torchvision()
    module = openood_ref.load("iodin_postprocessor", extra=("openood/postprocessors/odin_postprocessor.py",
                                                            "openood/preprocessors/transform.py"))
    rng = np.random.default_rng(42)
    net = SmallNet()
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.from_numpy(openood_ref.rounded(rng, tuple(p.shape), 0.5)))
    x = openood_ref.rounded(rng, (6, 3, 5, 5))
    cases = []
    for temperature, noise in CASES:
        config = openood_ref.config(temperature=temperature, noise=noise)
        config.dataset = SimpleNamespace(name="cifar10")
        post = module.IODINPostprocessor(config)
        _, conf = post.postprocess(lambda data: net(data)[0], torch.from_numpy(x.copy()))
        cases.append({"temperature": temperature, "noise": noise, "input_std": list(post.input_std),
                      "scores": openood_ref.as_list(conf.detach().numpy().astype(np.float64))})
    payload = {"inputs": {"x": openood_ref.as_list(x),
                          "params": {k: openood_ref.as_list(v.detach().numpy()) for k, v in net.state_dict().items()}},
               "cases": cases}
    print(openood_ref.write("iodin", "make_iodin.py", payload))


if __name__ == "__main__":
    main()
