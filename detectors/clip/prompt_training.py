"""Training loop (accelerate) and the base class of the learned-prompt detectors (LoCoOp, ID-like)."""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from detectors.base import ImageSet
from detectors.clip.backbone import DEFAULT_CLIP
from detectors.clip.common import ClipDetector, few_shot_indices, labels_of
from detectors.clip.features import ClipImageFeatures, image_features
from detectors.clip.prompts import PromptLearner
from detectors.clip.scores import cosine
from pipelines.params import param
from pipelines.progress import progress as progress_bar


def make_accelerator(device: torch.device) -> Any:
    """An `Accelerator` with bf16 mixed precision on GPU and fp32 on the CPU."""
    from accelerate import Accelerator

    cpu = device.type != "cuda"
    return Accelerator(cpu=cpu, mixed_precision="no" if cpu else "bf16")


SCHEDULES = ("cosine_epoch", "cosine_step", "constant")
Schedule = Literal["cosine_epoch", "cosine_step", "constant"]


def epoch_lr_factor(epoch: int, epochs: int, base_lr: float, warmup_epochs: int = 0, warmup_lr: float = 1e-5) -> float:
    """Dassl/CoOp schedule as a multiplier of `base_lr`: constant `warmup_lr` for the first `warmup_epochs`, then a
    cosine over `epochs` stepped once per epoch."""
    if epoch < warmup_epochs:
        return warmup_lr / base_lr
    return 0.5 * (1.0 + math.cos(math.pi * (epoch - warmup_epochs) / max(1, epochs)))


def step_lr_factor(step: int, total_steps: int, warmup_steps: int = 0) -> float:
    """open_clip's `cosine_lr` (CLIPN) as a multiplier: linear warm-up (step + 1) / warmup_steps, then a cosine over
    the remaining steps, set before every optimiser step."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    return 0.5 * (1.0 + math.cos(math.pi * (step - warmup_steps) / max(1, total_steps - warmup_steps)))


def lr_factor(schedule: str, epoch: int, step: int, epochs: int, total_steps: int, base_lr: float,
              warmup_epochs: int = 0, warmup_lr: float = 1e-5, warmup_steps: int = 0) -> float:
    """The multiplier of the base learning rate at (epoch, global step) under `schedule` (one of SCHEDULES)."""
    if schedule == "cosine_epoch":
        return epoch_lr_factor(epoch, epochs, base_lr, warmup_epochs, warmup_lr)
    if schedule == "cosine_step":
        return step_lr_factor(step, total_steps, warmup_steps)
    if schedule == "constant":
        return 1.0
    raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")


def train_loop(module: torch.nn.Module, dataset: Dataset | Callable[[int], Dataset],
               step_loss: Callable[[Any, Any], torch.Tensor], *,
               epochs: int, batch_size: int, optimizer: torch.optim.Optimizer, seed: int, device: torch.device,
               schedule: str = "cosine_epoch", warmup_epochs: int = 0, warmup_lr: float = 1e-5, warmup_steps: int = 0,
               lr_log: list[float] | None = None, progress: bool = True, desc: str = "train") -> list[float]:
    """Train `module`'s parameters with `optimizer`; returns the loss of each step.

    `dataset` is one dataset for every epoch, or a function epoch -> dataset (fresh augmentations each epoch).
    The learning rate of each parameter group is its initial lr times `lr_factor(schedule, ...)`, set before every
    step (`lr_log` receives the first group's). `step_loss(module, batch)` computes the loss of one batch (already
    on the device) with the prepared module. Shuffling is seeded with `seed`.
    """
    accelerator = make_accelerator(device)
    gen = torch.Generator().manual_seed(seed)
    make = dataset if callable(dataset) and not isinstance(dataset, Dataset) else (lambda _epoch: dataset)
    base_lrs = [group["lr"] for group in optimizer.param_groups]
    module, optimizer = accelerator.prepare(module, optimizer)
    module.train()
    losses: list[float] = []
    bar = progress_bar(desc=desc, disable=not progress, leave=False)
    step = 0
    for epoch in range(epochs):
        loader = accelerator.prepare(DataLoader(make(epoch), batch_size=batch_size, shuffle=True, generator=gen))
        total = epochs * len(loader)
        for batch in loader:
            factor = lr_factor(schedule, epoch, step, epochs, total, base_lrs[0], warmup_epochs, warmup_lr,
                               warmup_steps)
            for group, base in zip(optimizer.param_groups, base_lrs):
                group["lr"] = base * factor
            if lr_log is not None:
                lr_log.append(optimizer.param_groups[0]["lr"])
            with accelerator.autocast():
                loss = step_loss(module, batch)
            optimizer.zero_grad(set_to_none=True)
            accelerator.backward(loss)
            optimizer.step()
            losses.append(float(loss.detach()))
            step += 1
            bar.update()
            bar.set_postfix(loss=f"{losses[-1]:.4f}")
    bar.close()
    module.eval()
    return losses


class PromptDetector(ClipDetector):
    """A CLIP detector with a learned `PromptLearner`; its context/OOD tokens are the saved state."""

    trains_across_processes = True  # its prompts train under accelerate on every process together

    @dataclass(frozen=True)
    class Params(ClipDetector.Params):
        n_ctx: int = param(16, "learned context tokens", ge=1)
        shots: int | None = param(16, "training images per class (None: all)", ge=1)
        seed: int = param(0, "seed of the few-shot draw, the context initialisation and the shuffling")
        progress: bool = param(True, "show a progress bar", runtime=True)

    n_ood_param: ClassVar[str | None] = None
    reads_train_features: ClassVar[bool] = False  # trains on the cached image features of its few-shot subset

    def __init__(self, model: Any = DEFAULT_CLIP, processor: Any = None, **params: Any) -> None:
        super().__init__(model, processor, **params)
        self._learner: PromptLearner | None = None
        self._prompt_state: dict[str, np.ndarray] | None = None
        self.losses: list[float] = []
        self.lrs: list[float] = []  # learning rate of each training step

    @property
    def n_ood(self) -> int:
        return int(self.params[self.n_ood_param]) if self.n_ood_param else 0

    @property
    def learner(self) -> PromptLearner:
        """The prompt learner (built on first use; restored from a loaded state when there is one)."""
        if self._learner is None:
            self._learner = PromptLearner(self.backbone, self.require_classes(), self.params["n_ctx"], self.n_ood,
                                          seed=self.params["seed"],
                                          shared_ood_ctx=bool(self.params.get("shared_ood_ctx", False))
                                          ).to(self.backbone.device)
            if self._prompt_state is not None:
                self._learner.load(self._prompt_state)
        return self._learner

    @torch.no_grad()
    def prompt_text(self) -> torch.Tensor:
        """Normalised text features [C+K, P] of the learned prompts (computed once per fit/load)."""
        if "prompts" not in self._text_cache:
            with self.backbone.autocast():
                self._text_cache["prompts"] = self.learner().float().cpu()
        return self._text_cache["prompts"]

    def predict(self, batch: Any) -> np.ndarray:
        """ID class predictions [N]: the nearest learned ID prompt (OOD prompts excluded)."""
        text = self.prompt_text()[: self.num_classes]
        return cosine(self.features(batch).global_, text).argmax(-1).numpy()

    def shot_indices(self, images: ImageSet) -> list[int]:
        """Rows of the `shots`-per-class subset of a labelled training ImageSet (seeded; all rows when shots is
        None)."""
        return few_shot_indices(labels_of(images, self.name).numpy(), self.params["shots"], self.params["seed"])

    def training_features(self, images: ImageSet) -> tuple[ClipImageFeatures, torch.Tensor]:
        """Image features and labels of the `shots`-per-class subset, sliced from the training set's cached features
        (rows already embedded for another subset of the same ImageSet are not embedded again)."""
        labels, idx = labels_of(images, self.name), self.shot_indices(images)
        p = self.params
        return image_features(self.backbone, images, p["cache_dir"], p["embed_batch_size"], rows=idx), labels[idx]

    def _after_fit(self, losses: list[float]) -> None:
        self.losses = losses
        self._text_cache.pop("prompts", None)

    def state(self) -> dict[str, np.ndarray]:
        if self._learner is None and self._prompt_state is not None:
            return dict(self._prompt_state)
        return {k: v.numpy() for k, v in self.learner.state().items()}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        self._prompt_state = {k: np.asarray(v) for k, v in state.items() if k.startswith("prompt.")}
        if self._learner is not None:
            self._learner.load(self._prompt_state)
        self._text_cache.pop("prompts", None)
