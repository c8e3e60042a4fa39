"""Golden scores of OpenOOD's ensemble postprocessor (ensemble_postprocessor.py at openood_ref.COMMIT): five tiny conv
networks (conv + batch norm with set running statistics + ReLU + mean pool + fc) of one architecture, each saved as
`<root>/net<i>/best.ckpt` (`torch.save(net.state_dict())`, as OpenOOD's recorder), loaded by the postprocessor's own
`setup` from a template network and scored by its `postprocess` on fixed inputs with num_networks 5, 3 (the first three
names) and 1. Writes ensemble.json beside this file."""
from __future__ import annotations

import tempfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import openood_ref
import torch
from torch import nn

C_IN, WIDTH, CLASSES, SIZE, MEMBERS = 3, 4, 3, 5, 5


class TinyConv(nn.Module):
    """OpenOOD networks' forward: `net(x)` -> logits (`return_feature=True`: (logits, features))."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(C_IN, WIDTH, 3, padding=1)
        self.bn = nn.BatchNorm2d(WIDTH)
        self.fc = nn.Linear(WIDTH, CLASSES)

    def forward(self, x, return_feature=False):
        h = torch.relu(self.bn(self.conv(x))).mean((2, 3))
        return (self.fc(h), h) if return_feature else self.fc(h)


def member(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A state dict of rounded float32 draws (running variances positive)."""
    net = TinyConv()
    state = {}
    for k, v in net.state_dict().items():
        if k.endswith("num_batches_tracked"):
            state[k] = v
        elif k.endswith("running_var"):
            state[k] = torch.from_numpy(np.round(rng.uniform(0.5, 2.0, v.shape), 4).astype(np.float32))
        else:
            state[k] = torch.from_numpy(openood_ref.rounded(rng, tuple(v.shape), 0.6))
    return state


def main() -> None:
    module = openood_ref.load("ensemble_postprocessor")
    rng = np.random.default_rng(39)
    states = [member(rng) for _ in range(MEMBERS)]
    test = openood_ref.rounded(rng, (6, C_IN, SIZE, SIZE))
    names = [f"net{i + 1}" for i in range(MEMBERS)]
    cases = []
    with tempfile.TemporaryDirectory() as root:
        for name, state in zip(names, states):
            (Path(root) / name).mkdir()
            torch.save(state, Path(root) / name / "best.ckpt")
        for count in (5, 3, 1):
            args = SimpleNamespace(network_name="tiny", checkpoint_root=root, checkpoints=names, num_networks=count)
            config = SimpleNamespace(network=SimpleNamespace(name="tiny"),
                                     postprocessor=SimpleNamespace(postprocessor_args=args))
            post = module.EnsemblePostprocessor(config)
            template = TinyConv()  # random weights: the postprocessor loads every member over a copy of it
            post.setup(template, None, None)
            with torch.no_grad():
                pred, conf = post.postprocess(template, torch.from_numpy(test))
            cases.append({"num_networks": count, "pred": pred.tolist(),
                          "scores": np.asarray(conf, dtype=np.float64).tolist()})
    payload = {"defaults": {"checkpoints": names, "num_networks": 5},
               "inputs": {"members": [{k: openood_ref.as_list(v) for k, v in s.items()
                                       if not k.endswith("num_batches_tracked")} for s in states],
                          "test": openood_ref.as_list(test)},
               "cases": cases}
    print(openood_ref.write("ensemble", "make_ensemble.py", payload))


if __name__ == "__main__":
    main()
