"""Learning-rate schedules of the training loop, as factors of the base lr per optimiser step (a `LambdaLR`).

- "clean" (protocol `exact`): linear warm-up over `round(warmup_epochs * steps)` steps, then a half cosine to 0 at the
  last step (transformers' `get_cosine_schedule_with_warmup`), one scheduler step per optimiser step.
- "reference" (protocol `open-insects`): what Open-Insect's trainers run (`src/openood/trainers/base_trainer.py`):
  timm's `CosineLRScheduler(t_initial=total - warmup, warmup_t=warmup, warmup_prefix=True, cycle_limit=1,
  t_in_epochs=False)` (warmup_lr_init 0, lr_min 0) with `steps_per_epoch = int(rows / batch_size) + 1`,
  `warmup = int(warmup_epochs * steps_per_epoch)`, `total = int(epochs * steps_per_epoch)`, driven by
  `step_update(num_updates=counter)` after every optimiser step, where the counter starts each epoch (`epoch_idx`
  from 1) at `steps_per_epoch * epoch_idx` and is incremented before each update. So the first epoch starts halfway
  through the warm-up (the first step at warmup_lr_init = 0), and the last epoch runs past `total`, at lr 0.
  `logitnorm_trainer.py` and `arpl_trainer.py` never increment the counter (`advances=False`): their lr is that of
  `steps_per_epoch * epoch_idx` for the whole epoch, after one first step at the previous epoch's value.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from pipelines.errors import ConfigError

Schedule = Literal["reference", "clean"]
SCHEDULES: tuple[str, ...] = ("reference", "clean")


@dataclass
class ReferenceSchedule:
    """The lr factor at every optimiser step under Open-Insect's step counter (module docstring). `rows` and
    `batch_size` give the reference's `steps_per_epoch`; `batches` is the loader's real number of batches an epoch."""

    epochs: int
    warmup_epochs: float
    rows: int
    batch_size: int
    batches: int
    advances: bool = True

    @property
    def steps_per_epoch(self) -> int:
        return int(self.rows / self.batch_size) + 1

    @property
    def warmup_t(self) -> int:
        return int(self.warmup_epochs * self.steps_per_epoch)

    @property
    def t_initial(self) -> int:
        return int(self.epochs * self.steps_per_epoch) - self.warmup_t

    def timm(self, t: int) -> float:
        """timm's `CosineLRScheduler._get_lr(t)` / base lr for this configuration (one cycle, no decay, k 1)."""
        if t < self.warmup_t:
            return t / self.warmup_t
        t -= self.warmup_t
        if t // self.t_initial >= 1:  # past the one cycle: lr_min
            return 0.0
        return 0.5 * (1 + math.cos(math.pi * t / self.t_initial))

    def counter(self, epoch_idx: int, done: int) -> int:
        """The counter after `done` steps of epoch `epoch_idx` (from 1)."""
        return self.steps_per_epoch * epoch_idx + (done if self.advances else 0)

    def __call__(self, step: int) -> float:
        """The factor the optimiser uses at global step `step` (from 0): the value of the last `step_update`."""
        epoch_idx, done = step // self.batches + 1, step % self.batches
        if done:
            return self.timm(self.counter(epoch_idx, done))
        if epoch_idx == 1:  # before any update: timm sets warmup_lr_init (0) when there is a warm-up
            return 0.0 if self.warmup_t else 1.0
        return self.timm(self.counter(epoch_idx - 1, self.batches))


def make_scheduler(optimizer: torch.optim.Optimizer, schedule: str, *, epochs: int, warmup_epochs: float,
                   batches: int, rows: int, batch_size: int,
                   advances: bool = True) -> torch.optim.lr_scheduler.LRScheduler:
    """The scheduler of `schedule`, stepped once per optimiser step."""
    if schedule == "reference":
        factor = ReferenceSchedule(epochs, warmup_epochs, rows, batch_size, batches, advances)
        if factor.t_initial <= 0:  # timm asserts t_initial > 0
            raise ConfigError(f"warmup_epochs ({warmup_epochs:g}) must be below epochs ({epochs}) under the reference "
                              "schedule (timm's cosine needs steps after the warm-up)")
        return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    if schedule == "clean":
        from transformers import get_cosine_schedule_with_warmup

        return get_cosine_schedule_with_warmup(optimizer, int(round(warmup_epochs * batches)), epochs * batches)
    raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")


def lr_landmarks(lrs: list[float], batches: int, warmup_epochs: float) -> dict[str, float]:
    """The lr at step 0, step 1, the first step after the warm-up, the last epoch's first step and the last step
    (`lrs`: the lr of every step in order, `batches` a epoch)."""
    if not lrs:
        return {}
    warm = min(int(round(warmup_epochs * batches)), len(lrs) - 1)
    return {"step_0": lrs[0], "step_1": lrs[min(1, len(lrs) - 1)], "warmup_end": lrs[warm],
            "last_epoch_first": lrs[max(len(lrs) - batches, 0)], "last": lrs[-1]}


def describe(schedule: str, lrs: list[float], *, epochs: int, batches: int, warmup_epochs: float, lr: float) -> str:
    """One line stating the effective schedule: its kind, steps, warm-up and the lr at its landmarks."""
    if not lrs:
        return f"schedule {schedule}: no optimiser step"
    at = lr_landmarks(lrs, batches, warmup_epochs)
    return (f"schedule {schedule}: {epochs} epochs x {batches} steps, warm-up {warmup_epochs:g} epochs, base lr "
            f"{lr:g}; "
            f"lr at step 0 {at['step_0']:.3g}, step 1 {at['step_1']:.3g}, warm-up end {at['warmup_end']:.3g}, "
            f"last epoch {at['last_epoch_first']:.3g} -> {at['last']:.3g}")


def planned_lrs(schedule: str, *, epochs: int, warmup_epochs: float, batches: int, rows: int, batch_size: int,
                lr: float, advances: bool = True) -> list[float]:
    """The lr of every optimiser step the schedule will run (for the printed summary and the tests)."""
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=lr)
    scheduler = make_scheduler(optimizer, schedule, epochs=epochs, warmup_epochs=warmup_epochs, batches=batches,
                               rows=rows, batch_size=batch_size, advances=advances)
    out = []
    for _ in range(epochs * batches):
        out.append(float(optimizer.param_groups[0]["lr"]))
        optimizer.step()
        scheduler.step()
    return out
