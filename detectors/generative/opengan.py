"""OpenGAN (Kong & Ramanan, ICCV 2021) on the classifier's penultimate features; architecture and training as OpenOOD's
port of the official code. Score = D's logit (monotone in D(x) = P(closed-set)), higher = ID.

- OpenGAN-0 (no outliers): D maximises log D(id) + log(1 - D(G(z))); G uses the non-saturating loss.
- Full OpenGAN (`fit(..., outliers=FeatureSet)`): + lambda_outlier * log(1 - D(outlier)), fakes weighted lambda_fake.
- Model selection: after each epoch D is scored on ID-val vs OOD-val and the epoch with the best AUROC is kept; without
  both (e.g. only id_val, as the evaluation runner passes) the last epoch is kept.
- BatchNorm in D (our choice, tested both ways). Training: the official code passes real, fake and outlier batches
  through D separately (`joint_batches=False`), so BN normalises each pure batch by its own statistics and D cannot
  see a shift of the batch mean: on blobs that differ only by a mean shift its eval-mode AUROC is 0.08-0.97 depending
  on the seed. The default `joint_batches=True` passes their concatenation in one forward, so BN sees the mixture, as
  eval-mode scoring later does (AUROC 1.0 for every seed tried). Scoring: `bn_mode="eval"` (default) uses the running
  statistics (deterministic, per-sample scores); `"batch"` the statistics of the scored set itself, so scores depend on
  what is scored together (a pure ID or pure OOD set is normalised by its own mean) and rank worse on mixed sets too.
"""
from __future__ import annotations

import copy
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from detectors.base import Detector, FeatureSet, LinearHead
from detectors.metrics import auroc
from detectors.registry import register_detector
from pipelines.runtime import resolve_device


def init_weights(module: nn.Module) -> None:
    """OpenGAN's init: linear (1x1 conv) weights N(0, 0.02); BatchNorm weight N(1, 0.02), bias 0."""
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, 0.0, 0.02)
    elif isinstance(module, nn.BatchNorm1d):
        nn.init.normal_(module.weight, 1.0, 0.02)
        nn.init.zeros_(module.bias)


class Generator(nn.Module):
    """nz -> 512 -> 256 -> 128 -> 256 -> feature_dim; BatchNorm + ReLU between, linear output (bias only there)."""

    def __init__(self, feature_dim: int, nz: int = 100, width: int = 64) -> None:
        super().__init__()
        sizes = [nz, width * 8, width * 4, width * 2, width * 4]
        layers: list[nn.Module] = []
        for a, b in zip(sizes[:-1], sizes[1:]):
            layers += [nn.Linear(a, b, bias=False), nn.BatchNorm1d(b), nn.ReLU()]
        self.net = nn.Sequential(*layers, nn.Linear(sizes[-1], feature_dim))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.net(z)


class Discriminator(nn.Module):
    """feature_dim -> 512 (LeakyReLU 0.2, no BN) -> 256 -> 128 -> 64 (BN + LeakyReLU 0.2) -> 1; no biases; returns
    the logit (sigmoid(logit) = D(x))."""

    def __init__(self, feature_dim: int, width: int = 64) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Linear(feature_dim, width * 8, bias=False), nn.LeakyReLU(0.2)]
        for a, b in ((width * 8, width * 4), (width * 4, width * 2), (width * 2, width)):
            layers += [nn.Linear(a, b, bias=False), nn.BatchNorm1d(b), nn.LeakyReLU(0.2)]
        self.net = nn.Sequential(*layers, nn.Linear(width, 1, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).view(-1)


@register_detector("opengan")
class OpenGAN(Detector):
    """Feature-space OpenGAN; `fit(id_train, id_val=..., ood_val=..., outliers=...)` on FeatureSets."""

    family = "generative"
    inputs = frozenset({"features"})
    paper = "Kong & Ramanan, OpenGAN: Open-Set Recognition via Open Data Generation, ICCV 2021"
    defaults: ClassVar[dict[str, Any]] = {
        "nz": 100,
        "width": 64,
        "epochs": 100,
        "batch_size": 128,
        "lr": 1e-4,
        "d_lr_divisor": 1.5,
        "beta1": 0.5,
        "lambda_outlier": 1.0,
        "lambda_fake": 0.2,
        "bn_mode": "eval",
        "joint_batches": True,
        "seed": 999,
        "device": None,
    }

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        if self.bn_mode not in ("eval", "batch"):
            raise ValueError(f"opengan: bn_mode must be 'eval' or 'batch', got {self.bn_mode!r}")
        self.discriminator: Discriminator | None = None
        self.history: list[dict[str, float]] = []
        self.best_epoch: int | None = None

    def fit(self, id_train: FeatureSet, *, head: Any = None, id_val: FeatureSet | None = None,
            ood_val: FeatureSet | None = None, outliers: FeatureSet | None = None, aux: FeatureSet | None = None) -> "OpenGAN":
        """Train G and D on ID features (plus real `outliers` for the full OpenGAN); select the epoch by val AUROC.

        `aux` is the evaluation runner's name for the auxiliary outlier features; it is used when `outliers` is None.
        """
        outliers = outliers if outliers is not None else aux
        if head is not None:
            self.head = head if isinstance(head, LinearHead) else LinearHead(*head)
        self._train(id_train, id_val, ood_val, outliers)
        self.fitted = True
        return self

    @staticmethod
    def _features(data: FeatureSet | None, what: str) -> np.ndarray | None:
        if data is None:
            return None
        data.require("features", who=f"opengan ({what})")
        return np.asarray(data.features, dtype=np.float32)

    def _train(self, id_train: FeatureSet, id_val: FeatureSet | None, ood_val: FeatureSet | None,
               outliers: FeatureSet | None) -> None:
        device = resolve_device(self.device)
        real = torch.from_numpy(self._features(id_train, "id_train")).to(device)
        out_np = self._features(outliers, "outliers")
        outlier = torch.from_numpy(out_np).to(device) if out_np is not None else None
        select = id_val is not None and ood_val is not None
        gen = torch.Generator(device="cpu").manual_seed(int(self.seed))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(self.seed))
            netG = Generator(real.shape[1], self.nz, self.width).apply(init_weights).to(device)
            netD = Discriminator(real.shape[1], self.width).apply(init_weights).to(device)
        opt_d = torch.optim.Adam(netD.parameters(), lr=self.lr / self.d_lr_divisor, betas=(self.beta1, 0.999))
        opt_g = torch.optim.Adam(netG.parameters(), lr=self.lr, betas=(self.beta1, 0.999))
        fake_weight = self.lambda_fake if outlier is not None else 1.0
        best_auroc, best_state = -np.inf, None
        self.history = []
        for epoch in tqdm(range(int(self.epochs)), desc="opengan", leave=False):
            netG.train()
            netD.train()
            order = torch.randperm(len(real), generator=gen).to(device)
            for start in range(0, len(real), int(self.batch_size)):
                batch = real[order[start:start + int(self.batch_size)]]
                if len(batch) < 2:  # BatchNorm needs two samples
                    continue
                z = torch.randn(len(batch), self.nz, generator=gen).to(device)
                fake = netG(z)
                groups = [batch, fake.detach()]
                weights = [1.0, fake_weight]
                if outlier is not None:
                    groups.append(outlier[torch.randint(0, len(outlier), (len(batch),), generator=gen).to(device)])
                    weights.append(self.lambda_outlier)
                opt_d.zero_grad()
                loss_d = sum(w * F.binary_cross_entropy_with_logits(out, torch.full_like(out, float(i == 0)))
                             for i, (w, out) in enumerate(zip(weights, self._discriminate(netD, groups))))
                loss_d.backward()
                opt_d.step()
                opt_g.zero_grad()
                fake_out = self._discriminate(netD, [batch, fake])[1] if self.joint_batches else netD(fake)
                loss_g = F.binary_cross_entropy_with_logits(fake_out, torch.ones_like(fake_out))
                loss_g.backward()
                opt_g.step()
            record = {"epoch": epoch, "loss_d": loss_d.item(), "loss_g": loss_g.item()}
            if select:
                self.discriminator = netD
                record["auroc"] = self.validation_auroc(id_val, ood_val)
                if record["auroc"] > best_auroc:
                    best_auroc, best_state, self.best_epoch = record["auroc"], copy.deepcopy(netD.state_dict()), epoch
            self.history.append(record)
        if best_state is not None:
            netD.load_state_dict(best_state)
        else:
            self.best_epoch = int(self.epochs) - 1
        self.discriminator = netD.eval()

    def _discriminate(self, netD: Discriminator, groups: list[torch.Tensor]) -> list[torch.Tensor]:
        """D's logits per group: one forward over the concatenation (`joint_batches`) or one forward per group."""
        if not self.joint_batches:
            return [netD(g) for g in groups]
        return list(torch.split(netD(torch.cat(groups)), [len(g) for g in groups]))

    def validation_auroc(self, id_val: FeatureSet, ood_val: FeatureSet) -> float:
        """AUROC of ID-val vs OOD-val scored in one pass (so that `bn_mode="batch"` sees the mixed set)."""
        both = np.concatenate([self._features(id_val, "id_val"), self._features(ood_val, "ood_val")])
        scores = self._score(FeatureSet(features=both))
        return auroc(scores[: len(id_val)], scores[len(id_val):])

    def _score(self, batch: FeatureSet) -> np.ndarray:
        if self.discriminator is None:
            raise RuntimeError("opengan is not fitted: call fit(id_train, ...) or load a saved one")
        x = torch.from_numpy(self._features(batch, "score")).to(next(self.discriminator.parameters()).device)
        net = self.discriminator
        if self.bn_mode == "batch":
            net = copy.deepcopy(net).train()
        else:
            net.eval()
        with torch.no_grad():
            return net(x).double().cpu().numpy()

    def state(self) -> dict[str, np.ndarray]:
        out = super().state()
        if self.discriminator is not None:
            out.update({f"D.{k}": v.detach().cpu().numpy() for k, v in self.discriminator.state_dict().items()})
        return out

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        super().load_state(state)
        weights = {k[2:]: torch.from_numpy(np.asarray(v)) for k, v in state.items() if k.startswith("D.")}
        if weights:
            net = Discriminator(weights["net.0.weight"].shape[1], self.width)
            net.load_state_dict(weights)
            self.discriminator = net.to(resolve_device(self.device)).eval()
