"""Stand-ins for the Open-Insect model zoo (Hugging Face yuyan-chen/open-insect-model-weights): the reference networks
of RolnickLab/Open-Insect `src/openood/networks/` re-stated in plain torch, with their attribute names (so their state
dicts carry the released key names and shapes) at tiny widths, the real ResNet-50 depth (3, 4, 6, 3), and their own
forward passes: the independent computation the loaded files are compared with. Saved with `torch.save(state_dict)`
as the zoo has them, named `<method>_<region>.pth` (ARPL `arpl_{netF,criterion}_<region>.pth`, OpenGAN
`opengan_{GNet,DNet}_<region>.ckpt`)."""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

WIDTHS = (16, 32, 64, 128)  # ResNet-50's (256, 512, 1024, 2048) / 16
EMBEDDING = 8  # ResNet-50's 64 / 8
DEPTHS = (3, 4, 6, 3)


class Bottleneck(nn.Module):
    """torchvision's Bottleneck (v1.5: the stride on the 3x3), expansion 4."""

    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        mid = width // 4
        self.conv1, self.bn1 = nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid)
        self.conv2, self.bn2 = nn.Conv2d(mid, mid, 3, stride, 1, bias=False), nn.BatchNorm2d(mid)
        self.conv3, self.bn3 = nn.Conv2d(mid, width, 1, bias=False), nn.BatchNorm2d(width)
        self.relu = nn.ReLU()
        self.downsample = (nn.Sequential(nn.Conv2d(cin, width, 1, stride, bias=False), nn.BatchNorm2d(width))
                           if stride != 1 or cin != width else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + (x if self.downsample is None else self.downsample(x)))


class ResNet50(nn.Module):
    """networks/resnet50.py (torchvision's ResNet): forward(x, return_feature) -> logits[, pooled features]."""

    def __init__(self, num_classes: int, widths=WIDTHS, embedding: int = EMBEDDING) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, embedding, 7, 2, 3, bias=False), nn.BatchNorm2d(embedding)
        self.relu, self.maxpool = nn.ReLU(), nn.MaxPool2d(3, 2, 1)
        cin = embedding
        for stage, (width, depth) in enumerate(zip(widths, DEPTHS), start=1):
            blocks = []
            for i in range(depth):
                blocks.append(Bottleneck(cin, width, 2 if stage > 1 and i == 0 else 1))
                cin = width
            setattr(self, f"layer{stage}", nn.Sequential(*blocks))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.feature_size = cin
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor, return_feature: bool = False):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        feature = self.avgpool(x).flatten(1)
        logits = self.fc(feature)
        return (logits, feature) if return_feature else logits


def backbone(num_classes: int) -> ResNet50:
    """The wrapped networks' backbone: its fc replaced by nn.Identity (no backbone.fc keys)."""
    net = ResNet50(num_classes)
    net.fc = nn.Identity()
    return net


class ConfBranchNet(nn.Module):
    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.backbone = backbone(num_classes)
        self.fc = nn.Linear(self.backbone.feature_size, num_classes)
        self.confidence = nn.Linear(self.backbone.feature_size, 1)

    def forward(self, x):
        _, f = self.backbone(x, return_feature=True)
        return self.fc(f), self.confidence(f)


class CosineDeconf(nn.Module):
    def __init__(self, dim: int, num_classes: int) -> None:
        super().__init__()
        self.h = nn.Linear(dim, num_classes, bias=False)

    def forward(self, x):
        def norm(v):
            return v / (v.norm(p=2, dim=1, keepdim=True) + 1e-4)
        return norm(x) @ norm(self.h.weight).T


class GodinNet(nn.Module):
    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.backbone = backbone(num_classes)
        dim = self.backbone.feature_size
        self.h = CosineDeconf(dim, num_classes)
        self.g = nn.Sequential(nn.Linear(dim, 1), nn.BatchNorm1d(1), nn.Sigmoid())

    def forward(self, x):
        """(numerators h, denominator g), as forward(inference=True, score_func='h' / 'g')."""
        _, f = self.backbone(x, return_feature=True)
        return self.h(f), self.g(f)


class TwoHeadNet(nn.Module):
    """rot_net (`rot_fc`, 4), udg_net (`fc_aux`, clusters), extended_net (`fc_extended`, C+1 or C+A)."""

    def __init__(self, num_classes: int, second: str, second_size: int) -> None:
        super().__init__()
        self.backbone = backbone(num_classes)
        self.fc = nn.Linear(self.backbone.feature_size, num_classes)
        self.second = second
        setattr(self, second, nn.Linear(self.backbone.feature_size, second_size))

    def forward(self, x):
        _, f = self.backbone(x, return_feature=True)
        return self.fc(f), getattr(self, self.second)(f)


class ARPLayer(nn.Module):
    """networks/arpl_net.py: one reciprocal point a class in `Dist.centers`, also registered as `points`."""

    def __init__(self, dim: int, num_classes: int) -> None:
        super().__init__()
        self.Dist = nn.Module()
        self.Dist.centers = nn.Parameter(0.1 * torch.randn(num_classes, dim))
        self.points = self.Dist.centers
        self.radius = nn.Parameter(torch.zeros(1))

    def forward(self, f):
        dim = f.shape[1]
        l2 = ((f[:, None, :] - self.points[None]) ** 2).sum(2) / dim
        return l2 - f @ self.points.T


def _opengan_d(nc: int, ndf: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(nc, ndf * 8, 1, bias=False), nn.LeakyReLU(0.2),
                         nn.Conv2d(ndf * 8, ndf * 4, 1, bias=False), nn.BatchNorm2d(ndf * 4), nn.LeakyReLU(0.2),
                         nn.Conv2d(ndf * 4, ndf * 2, 1, bias=False), nn.BatchNorm2d(ndf * 2), nn.LeakyReLU(0.2),
                         nn.Conv2d(ndf * 2, ndf, 1, bias=False), nn.BatchNorm2d(ndf), nn.LeakyReLU(0.2),
                         nn.Conv2d(ndf, 1, 1, bias=False), nn.Sigmoid())


def _opengan_g(nz: int, ngf: int, nc: int) -> nn.Sequential:
    layers = []
    for a, b in ((nz, ngf * 8), (ngf * 8, ngf * 4), (ngf * 4, ngf * 2), (ngf * 2, ngf * 4)):
        layers += [nn.Conv2d(a, b, 1, bias=False), nn.BatchNorm2d(b), nn.ReLU()]
    return nn.Sequential(*layers, nn.Conv2d(ngf * 4, nc, 1))


class OpenGanD(nn.Module):
    def __init__(self, nc: int, ndf: int = 4) -> None:
        super().__init__()
        self.main = _opengan_d(nc, ndf)

    def forward(self, feats):
        return self.main(feats[:, :, None, None]).view(-1)


class OpenGanG(nn.Module):
    def __init__(self, nc: int, nz: int = 10, ngf: int = 4) -> None:
        super().__init__()
        self.main = _opengan_g(nz, ngf, nc)


def randomise(net: nn.Module, seed: int) -> nn.Module:
    """Random weights and batch-norm statistics (so every tensor matters), eval mode."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in net.state_dict().items():
            if t.dtype.is_floating_point:
                if name.endswith("running_var"):
                    t.copy_(torch.rand(t.shape, generator=gen) + 0.5)
                elif name.endswith(".weight") and t.dim() == 1:  # batch-norm scales
                    t.copy_(torch.rand(t.shape, generator=gen) * 0.5 + 0.5)
                else:
                    scale = t[0].numel() ** -0.5 if t.dim() > 1 else 0.1  # 1 / sqrt(fan-in): activations stay O(1)
                    t.copy_(torch.randn(t.shape, generator=gen) * scale)
            elif name.endswith("num_batches_tracked"):
                t.fill_(7)
    return net.eval()


def make_zoo(folder: Path, region: str, num_classes: int, aux: int = 3, clusters: int = 10) -> dict[str, nn.Module]:
    """Every released file of `region` under `folder` and the reference network behind each (by method name)."""
    folder.mkdir(parents=True, exist_ok=True)
    nets: dict[str, nn.Module] = {}
    for seed, method in enumerate(("basics", "logitnorm", "oe", "mixoe", "energy")):
        nets[method] = randomise(ResNet50(num_classes), seed)
    nets["conf_branch"] = randomise(ConfBranchNet(num_classes), 10)
    nets["godin"] = randomise(GodinNet(num_classes), 11)
    nets["rotpred"] = randomise(TwoHeadNet(num_classes, "rot_fc", 4), 12)
    nets["udg"] = randomise(TwoHeadNet(num_classes, "fc_aux", clusters), 13)
    nets["novel_branch"] = randomise(TwoHeadNet(num_classes, "fc_extended", num_classes + 1), 14)
    nets["extended"] = randomise(TwoHeadNet(num_classes, "fc_extended", num_classes + aux), 15)
    for method, net in nets.items():
        torch.save(net.state_dict(), folder / f"{method}_{region}.pth")
    nets["arpl_netF"] = randomise(backbone(num_classes), 16)
    nets["arpl_criterion"] = randomise(ARPLayer(WIDTHS[-1], num_classes), 17)
    torch.save(nets["arpl_netF"].state_dict(), folder / f"arpl_netF_{region}.pth")
    torch.save(nets["arpl_criterion"].state_dict(), folder / f"arpl_criterion_{region}.pth")
    nets["opengan_DNet"] = randomise(OpenGanD(WIDTHS[-1]), 18)
    torch.save(nets["opengan_DNet"].state_dict(), folder / f"opengan_DNet_{region}.ckpt")
    torch.save(randomise(OpenGanG(WIDTHS[-1]), 19).state_dict(), folder / f"opengan_GNet_{region}.ckpt")
    return nets
