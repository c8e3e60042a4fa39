"""What a training run says while it runs: one progress display over the whole run (a bar on a terminal; off one, a
line every 30 s, `pipelines.progress`) whose postfix holds the epoch, the running loss, the last val top-1 and the ETA,
and one log line per finished epoch: `finetune epoch 3/10: loss 0.4123, val top-1 81.33%, elapsed 62 s, ETA 2
minutes`.

The display spans every step of the run rather than one epoch, so a run whose epochs are shorter than the line interval
still prints a line every interval. The ETA is the mean time of the epochs (of the steps, in the display) this process
ran times those left (a resumed run's earlier epochs are not timed here).
"""
from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

from pipelines.progress import duration_text, progress
from pipelines.training.objectives import PRIMARY

log = logging.getLogger(__name__)


def epoch_line(desc: str, epoch: int, epochs: int, entry: dict[str, float], elapsed: float,
               eta: float | None) -> str:
    """`<desc> epoch 3/10: loss 0.4123, val top-1 81.33%, elapsed 62 s, ETA 2 minutes` (no val part without val
    accuracy; no ETA after the last epoch)."""
    parts = [f"loss {entry['loss']:.4f}" if math.isfinite(entry.get("loss", math.nan)) else "loss n/a"]
    top1 = entry.get(f"acc_{PRIMARY}")
    if top1 is not None:
        parts.append(f"val top-1 {100 * top1:.2f}%")
    parts.append(f"elapsed {duration_text(elapsed)}")
    if eta is not None:
        parts.append(f"ETA {duration_text(eta)}")
    return f"{desc} epoch {epoch}/{epochs}: " + ", ".join(parts)


class EpochLog:
    """The run-wide progress display and the per-epoch log lines of one training run (`enabled`: this process
    reports, i.e. the main one)."""

    def __init__(self, desc: str, epochs: int, first: int, batches: int, enabled: bool,
                 clock: Callable[[], float] = time.monotonic):
        self.desc, self.epochs, self.first, self.enabled, self.clock = desc, epochs, first, enabled, clock
        self.start = clock()
        self.top1: float | None = None
        self.steps, self.total = 0, max(epochs - first, 0) * batches
        self.bar = progress(desc=desc, total=self.total, unit="step", leave=False, disable=not enabled)

    def eta(self, epochs_done: int) -> float | None:
        """Seconds left by the mean time of the epochs run so far (None when none ran here or none is left)."""
        ran = epochs_done - self.first
        if ran <= 0 or epochs_done >= self.epochs:
            return None
        return (self.clock() - self.start) / ran * (self.epochs - epochs_done)

    def step(self, epoch: int, running_loss: float) -> None:
        """One optimiser step of epoch `epoch` (0-based) done, with the epoch's running mean loss."""
        postfix: dict[str, Any] = {"epoch": f"{epoch + 1}/{self.epochs}", "loss": f"{running_loss:.4f}"}
        if self.top1 is not None:
            postfix["val_top1"] = f"{100 * self.top1:.2f}%"
        self.steps += 1
        if self.steps < self.total:  # the steps left at the mean time a step took so far (validation included)
            postfix["ETA"] = duration_text((self.clock() - self.start) / self.steps * (self.total - self.steps))
        self.bar.set_postfix(**postfix)
        self.bar.update(1)

    def epoch_done(self, entry: dict[str, float]) -> str:
        """Log (INFO, from the reporting process) and return the line of the finished epoch `entry` (its `epoch` is
        1-based)."""
        self.top1 = entry.get(f"acc_{PRIMARY}", self.top1)
        done = int(entry["epoch"])
        line = epoch_line(self.desc, done, self.epochs, entry, self.clock() - self.start, self.eta(done))
        if self.enabled:
            log.info("%s", line)
        return line

    def close(self) -> None:
        self.bar.close()
