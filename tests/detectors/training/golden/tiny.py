"""The tiny network and batch the OpenOOD trainer goldens are made with (make_openood_trainers.py) and checked against
(test_train_openood_trainers.py): conv + batch norm + ReLU + mean pool + linear head (`width` features), 4 images of
3 x 6 x 6, 3 classes."""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

N, C, H, W, CLASSES = 4, 3, 6, 6, 3


class TinyNet(nn.Module):
    """`forward(x)` -> logits, `forward(x, return_feature=True)` -> (logits, features), as OpenOOD's networks."""

    def __init__(self, classes: int = CLASSES, width: int = 4):
        super().__init__()
        self.conv = nn.Conv2d(C, width, 3, padding=1)
        self.bn = nn.BatchNorm2d(width)
        self.fc = nn.Linear(width, classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x))).mean((2, 3))

    def forward(self, x: torch.Tensor, return_feature: bool = False):
        h = self.features(x)
        return (self.fc(h), h) if return_feature else self.fc(h)


class AsClassifier(nn.Module):
    """TinyNet as oodforge's loop calls a model: x -> (logits, features)."""

    def __init__(self, net: TinyNet):
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor):
        return self.net(x, return_feature=True)


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    x = np.random.default_rng(0).normal(size=(N, C, H, W)).astype(np.float32)
    return torch.from_numpy(x), torch.tensor([0, 1, 2, 1])


def state_to_json(net: nn.Module) -> dict:
    return {k: v.detach().double().tolist() for k, v in net.state_dict().items()}


def state_from_json(net: nn.Module, state: dict) -> None:
    own = net.state_dict()
    net.load_state_dict({k: torch.tensor(v, dtype=own[k].dtype) for k, v in state.items()})
