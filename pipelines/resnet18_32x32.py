"""OpenOOD's ResNet-18 for 32x32 images (`openood/networks/resnet18_32x32.py`, Jingkang50/OpenOOD 3c35632), the
network of its CIFAR-10 / CIFAR-100 v1.5 checkpoints, with its parameter names, so its `best.ckpt` loads strictly.

A 3x3/1 stem (no max-pool), four stages of two basic blocks (widths w, 2w, 4w, 8w; stride 2 from the second stage),
each block conv3x3-BN-ReLU-conv3x3-BN plus the shortcut (identity, or `shortcut.0` 1x1 conv + `shortcut.1` BN where the
shape changes), ReLU; global average pooling; `fc`. The reference's width is w = 64 (`width` shrinks it for tiny
stand-ins only). `forward` returns `(logits, features)`, the features being the pooled input of `fc`;
`hidden_states` the stem's and every stage's output, and `layer4` / `avgpool` are what RankFeat re-runs.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

WIDTH = 64
"""The reference's stem width (resnet18_32x32.py:85-93)."""
BLOCKS = (2, 2, 2, 2)


class BasicBlock(nn.Module):
    """conv3x3(stride)-BN-ReLU-conv3x3-BN + shortcut, ReLU (resnet18_32x32.py:5-39)."""

    def __init__(self, in_planes: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False),
                                          nn.BatchNorm2d(planes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet18_32x32(nn.Module):
    """OpenOOD's ResNet18_32x32 (module docstring); `width` is the stem's channel count (reference 64)."""

    def __init__(self, num_classes: int = 10, width: int = WIDTH, blocks: tuple[int, ...] = BLOCKS):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        in_planes = width
        for stage, count in enumerate(blocks, start=1):
            planes, stride = width * 2 ** (stage - 1), 1 if stage == 1 else 2
            layers = []
            for i in range(count):
                layers.append(BasicBlock(in_planes, planes, stride if i == 0 else 1))
                in_planes = planes
            setattr(self, f"layer{stage}", nn.Sequential(*layers))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_planes, num_classes)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layer4(self.layer3(self.layer2(self.layer1(out))))
        features = self.avgpool(out).flatten(1)
        return self.fc(features), features

    def hidden_states(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """(logits, [stem output, stage 1..4 outputs]): the maps a transformers ResNet's `hidden_states` holds (the
        reference's `return_feature_list`, its last map before pooling), read by Gram, MDSEns and RankFeat."""
        maps = [F.relu(self.bn1(self.conv1(x)))]
        for stage in (self.layer1, self.layer2, self.layer3, self.layer4):
            maps.append(stage(maps[-1]))
        return self.fc(self.avgpool(maps[-1]).flatten(1)), maps
