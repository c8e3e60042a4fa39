"""OpenGAN (Kong & Ramanan, ICCV 2021) on the classifier's penultimate features, trained as its two references do.
Score = D's logit (monotone in D(x) = P(closed-set)), higher = ID.

- OpenGAN-0 (no outliers), as OpenOOD v1.5 ran it (Jingkang50/OpenOOD, openood/trainers/opengan_trainer.py and
  openood/pipelines/train_opengan_pipeline.py): D loss = BCE(D(real), 1) + BCE(D(G(z)), 0) with real and fake batches
  through D in separate forward passes; G's non-saturating loss on a separate pass of the fakes. OpenOOD validates D
  after every epoch (putting G and D in eval mode) and its trainer never switches back, so only the first epoch trains
  with batch statistics; later epochs train through BatchNorm's frozen running statistics (`bn_train="openood"`).
- Full OpenGAN (`fit(..., outliers=FeatureSet)`), as the official notebook trains it (aimerykong/OpenGAN,
  demo_OpenSetSegmentation_training.ipynb): one D forward over [B closed, B outliers, B/2 fakes] with per-sample BCE
  weights 1, 1, 0.2 (`lambda_outlier`, `lambda_fake`), averaged over all samples, i.e. group weights 1 : 1 : 0.1; BN in
  train mode throughout; G's loss on a separate pass of the fakes.
- Model selection: after each epoch D is scored on ID-val vs OOD-val and the epoch with the best AUROC is kept (ties go
  to the later epoch, as OpenOOD's recorder); without both (e.g. only id_val) the last epoch is kept.
- Options: `joint_batches=True` passes the real batch and the fakes (and outliers) through D together in both updates,
  so BN sees the mixture as eval-mode scoring later does (on blobs that differ only by a mean shift, trained with
  outliers, separate passes give an eval-mode AUROC anywhere in 0.08-0.97 depending on the seed; joint passes 1.0);
  `bn_train="train"` keeps batch statistics in every epoch. Scoring: `bn_mode="eval"` (default) uses the running
  statistics; `"batch"` the statistics of the scored set itself, so scores depend on what is scored together.
"""
from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from detectors.base import Detector, FeatureSet, LinearHead
from detectors.metrics import auroc
from detectors.registry import register_detector
from pipelines.params import Params, param
from pipelines.progress import progress
from pipelines.runtime import resolve_device
from pipelines.training.settings import TrainSettings, setting


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


def released_discriminator(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The Open-Insect zoo's OpenGAN discriminator (`opengan_DNet_<region>.ckpt`; the GNet name finds it beside) as
    `Discriminator` weights: its 1x1 convolutions `main.{0,2,5,8,11}` are the linear layers `net.*` at the same
    indices (kernel dims dropped), BatchNorm2d `main.{3,6,9}` the BatchNorm1d ones; the final Sigmoid is left out
    (scores are its logit, a monotone map of the reference's sigmoid score)."""
    from pipelines.zoo import files_read, parse_name, read_released

    name = parse_name(path)
    made = read_released(files_read(path)[0] if name is not None and name.method == "opengan" else path,
                         "opengan_discriminator")
    out = {}
    for key, value in made.state.items():
        if value.dim() == 4:
            if value.shape[2:] != (1, 1):
                raise made.fail(f"{key} is {tuple(value.shape)}: OpenGAN's discriminator has 1x1 convolutions")
            value = value[:, :, 0, 0]
        out["net." + key[len("main."):]] = value
    return out


@register_detector("opengan")
class OpenGAN(Detector):
    """Feature-space OpenGAN; `fit(id_train, id_val=..., ood_val=..., outliers=...)` on FeatureSets."""

    label = "OpenGAN"
    family = "generative"
    inputs = frozenset({"features"})
    paper = "Kong & Ramanan, OpenGAN: Open-Set Recognition via Open Data Generation, ICCV 2021"

    @dataclass(frozen=True)
    class Params(Params):
        training: ClassVar[TrainSettings] = TrainSettings(epochs=100, batch_size=128, lr=1e-4, weight_decay=0.0,
                                                          seed=999)
        """The reference training (Open-Insect `configs/pipelines/train/train_opengan.yml:26-30`, OpenOOD
        `openood/trainers/opengan_trainer.py`; docs/protocols.md, docs/generative.md): Adam without weight decay at lr
        1e-4 for G (D: lr / d_lr_divisor), 100 epochs of batch 128, seed 999."""

        nz: int = param(100, "latent size of the generator", ge=1)
        width: int = param(64, "hidden width of G and D", ge=1)
        epochs: int = setting("epochs", default=training.epochs)
        batch_size: int = setting("batch_size", default=training.batch_size, doc="training batch size")
        lr: float = setting("lr", default=training.lr, doc="generator Adam learning rate")
        d_lr_divisor: float = param(1.5, "discriminator lr = lr / d_lr_divisor", gt=0)
        beta1: float = param(0.5, "Adam beta1", ge=0, lt=1)
        lambda_outlier: float = param(1.0, "weight of the real-outlier loss", ge=0)
        lambda_fake: float = param(0.2, "weight of the generated-feature loss", ge=0)
        fake_fraction: float | None = param(None, "generated features per real one (None: OpenOOD's batch)", gt=0, le=4)
        bn_mode: Literal["eval", "batch"] = param("eval", "batch-norm statistics when scoring")
        bn_train: Literal["openood", "train"] | None = param(None, "batch-norm mode while training")
        joint_batches: bool | None = param(None, "ID and outlier rows in one batch (None: the method's choice)")
        seed: int = setting("seed", default=training.seed, doc="training seed")
        device: str | torch.device | None = param(None, "torch device", runtime=True)

    fit_inputs = frozenset({"id_val", "ood_val", "aux"})
    needs = frozenset({"device"})

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.discriminator: Discriminator | None = None
        self.history: list[dict[str, float]] = []
        self.best_epoch: int | None = None

    def fit(self, id_train: FeatureSet, *, head: Any = None, id_val: FeatureSet | None = None,
            ood_val: FeatureSet | None = None, outliers: FeatureSet | None = None,
            aux: FeatureSet | None = None) -> OpenGAN:
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

    def _networks(self, dim: int, device: torch.device,
                  settings: TrainSettings) -> tuple[nn.Module, nn.Module, Any, Any]:
        """G and D initialised from the seed (N(0, 0.02) weights) with their Adam optimisers."""
        p = self.params
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(settings.seed))
            netG = Generator(dim, p["nz"], p["width"]).apply(init_weights).to(device)
            netD = Discriminator(dim, p["width"]).apply(init_weights).to(device)
        opt_g = torch.optim.Adam(netG.parameters(), lr=settings.lr, betas=(p["beta1"], 0.999))
        opt_d = torch.optim.Adam(netD.parameters(), lr=settings.lr / p["d_lr_divisor"], betas=(p["beta1"], 0.999))
        return netG, netD, opt_g, opt_d

    def _train(self, id_train: FeatureSet, id_val: FeatureSet | None, ood_val: FeatureSet | None,
               outliers: FeatureSet | None) -> None:
        device = resolve_device(self.params["device"])
        real = torch.from_numpy(self._features(id_train, "id_train")).to(device)
        out_np = self._features(outliers, "outliers")
        outlier = torch.from_numpy(out_np).to(device) if out_np is not None else None
        select = id_val is not None and ood_val is not None
        settings = TrainSettings.read(self.Params, self.params)
        gen = torch.Generator(device="cpu").manual_seed(int(settings.seed))
        netG, netD, opt_g, opt_d = self._networks(real.shape[1], device, settings)
        plan = self.training_plan(outlier is not None)
        p = self.params
        weights = [1.0, float(p["lambda_fake"])] + ([float(p["lambda_outlier"])] if outlier is not None else [])
        if outlier is None:
            weights[1] = 1.0  # OpenGAN-0: errD_real + errD_fake
        best_auroc, best_state = -np.inf, None
        self.history = []
        for epoch in progress(range(int(settings.epochs)), desc="opengan", leave=False):
            train_mode = plan["bn_train"] == "train" or epoch == 0
            netG.train(train_mode)
            netD.train(train_mode)
            order = torch.randperm(len(real), generator=gen).to(device)
            for start in range(0, len(real), int(settings.batch_size)):
                batch = real[order[start:start + int(settings.batch_size)]]
                n_fake = int(len(batch) * plan["fake_fraction"])
                if n_fake < 1 or (train_mode and min(len(batch), n_fake) < 2):  # BatchNorm needs two samples
                    continue
                z = torch.randn(n_fake, self.params["nz"], generator=gen).to(device)
                fake = netG(z)
                groups = [batch, fake.detach()]
                if outlier is not None:
                    groups.append(outlier[torch.randint(0, len(outlier), (len(batch),), generator=gen).to(device)])
                opt_d.zero_grad()
                outs = self._discriminate(netD, groups, plan["joint_d"])
                losses = [F.binary_cross_entropy_with_logits(out, torch.full_like(out, float(i == 0)), reduction="sum")
                          for i, out in enumerate(outs)]
                if outlier is None:  # sum of the group means (OpenOOD)
                    loss_d = sum(w * l / len(g) for w, l, g in zip(weights, losses, groups))
                else:  # per-sample weighted mean over the concatenation (official notebook's BCELoss(weight=...))
                    loss_d = sum(w * l for w, l in zip(weights, losses)) / sum(len(g) for g in groups)
                loss_d.backward()
                opt_d.step()
                opt_g.zero_grad()
                fake_out = self._discriminate(netD, [batch, fake], True)[1] if plan["joint_g"] else netD(fake)
                loss_g = F.binary_cross_entropy_with_logits(fake_out, torch.ones_like(fake_out))
                loss_g.backward()
                opt_g.step()
            record = {"epoch": epoch, "loss_d": loss_d.item(), "loss_g": loss_g.item()}
            if select:
                self.discriminator = netD
                record["auroc"] = self.validation_auroc(id_val, ood_val)
                if record["auroc"] >= best_auroc:
                    best_auroc, best_state, self.best_epoch = record["auroc"], copy.deepcopy(netD.state_dict()), epoch
            self.history.append(record)
        if best_state is not None:
            netD.load_state_dict(best_state)
        else:
            self.best_epoch = int(settings.epochs) - 1
        self.discriminator = netD.eval()

    def training_plan(self, with_outliers: bool) -> dict[str, Any]:
        """The resolved training choices: each null parameter takes its reference's value (OpenOOD's trainer for
        OpenGAN-0, the official notebook with outliers)."""
        joint = self.params["joint_batches"]
        return {
            "joint_d": joint if joint is not None else with_outliers,
            "joint_g": joint is True,
            "bn_train": self.params["bn_train"] or ("train" if with_outliers else "openood"),
            "fake_fraction": (float(self.params["fake_fraction"]) if self.params["fake_fraction"] is not None
                              else (0.5 if with_outliers else 1.0)),
        }

    @staticmethod
    def _discriminate(netD: Discriminator, groups: list[torch.Tensor], joint: bool) -> list[torch.Tensor]:
        """D's logits per group: one forward over the concatenation (`joint`) or one forward per group."""
        if not joint:
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
        if self.params["bn_mode"] == "batch":
            net = copy.deepcopy(net).train()
        else:
            net.eval()
        with torch.no_grad():
            return net(x).double().cpu().numpy()

    @classmethod
    def from_released(cls, path: str | os.PathLike, **overrides: Any) -> OpenGAN:
        """D from the Open-Insect zoo's `opengan_DNet_<region>.ckpt` (`released_discriminator`), no training; it
        scores the run classifier's features (the reference's backbone: basics_<region>.pth)."""
        det = cls(**overrides)
        det.load_state({f"D.{k}": v.numpy() for k, v in released_discriminator(path).items()})
        det.fitted = True
        return det

    @classmethod
    def check_released(cls, path: str | os.PathLike) -> None:
        weights = released_discriminator(path)
        cls._discriminator_of({k: torch.as_tensor(v) for k, v in weights.items()}, str(path))

    @staticmethod
    def _discriminator_of(weights: dict[str, torch.Tensor], where: str) -> Discriminator:
        """A Discriminator of the widths the weights have, loaded strictly; a mismatch is one line naming `where`."""
        net = Discriminator(weights["net.0.weight"].shape[1], weights["net.11.weight"].shape[1])
        try:
            net.load_state_dict(weights)
        except RuntimeError as err:
            raise ValueError(f"{where}: not an OpenGAN discriminator of widths {net.net[0].out_features} / ... / "
                             f"{net.net[11].in_features} ({' '.join(str(err).split())[:200]})") from None
        return net

    def state(self) -> dict[str, np.ndarray]:
        out = super().state()
        if self.discriminator is not None:
            out.update({f"D.{k}": v.detach().cpu().numpy() for k, v in self.discriminator.state_dict().items()})
        return out

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        super().load_state(state)
        weights = {k[2:]: torch.from_numpy(np.asarray(v)) for k, v in state.items() if k.startswith("D.")}
        if weights:
            net = self._discriminator_of(weights, "opengan state")
            self.discriminator = net.to(resolve_device(self.params["device"])).eval()
