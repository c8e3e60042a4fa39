"""The "reference" schedule against a literal transcription of Open-Insect's trainer loop driving timm's
CosineLRScheduler (both written here by hand from the reference code), and through the real training loop."""
from __future__ import annotations

import math

import numpy as np
import pytest

from pipelines.errors import ConfigError
from pipelines.training.schedule import ReferenceSchedule, describe, planned_lrs


def timm_cosine(t: int, base: float, warmup_t: int, t_initial: int) -> float:
    """timm CosineLRScheduler._get_lr with warmup_lr_init 0, lr_min 0, warmup_prefix, cycle_limit 1, cycle_mul 1,
    cycle_decay 1, k_decay 1."""
    if t < warmup_t:
        return 0 + t * (base - 0) / warmup_t
    t = t - warmup_t
    i = t // t_initial
    if i < 1:
        return 0 + 0.5 * (base - 0) * (1 + math.cos(math.pi * (t - t_initial * i) / t_initial))
    return 0.0


def trainer_lrs(epochs: int, warmup_epochs: float, rows: int, batch_size: int, base: float,
                advances: bool = True) -> list[float]:
    """The lr each optimiser step of `base_trainer.train_epoch` (or, with advances=False, `logitnorm_trainer`) uses."""
    spe = int(rows / batch_size) + 1
    total, warm = int(epochs * spe), int(warmup_epochs * spe)
    lr = 0.0 if warm else base  # timm's __init__ sets warmup_lr_init when there is a warm-up
    batches = -(-rows // batch_size)  # DataLoader, drop_last False
    out = []
    for epoch_idx in range(1, epochs + 1):
        counter = spe * epoch_idx
        for _ in range(batches):
            out.append(lr)  # optimizer.step() runs at the current lr
            if advances:
                counter += 1
            lr = timm_cosine(counter, base, warm, total - warm)  # scheduler.step_update(num_updates=counter)
    return out


@pytest.mark.parametrize("epochs, warmup, rows, batch, advances", [
    (30, 2, 499, 4, True),   # steps_per_epoch 125 = batches
    (30, 2, 500, 4, True),   # rows divide by the batch: steps_per_epoch 126, batches 125
    (6, 1.5, 37, 8, True),
    (5, 0, 20, 8, True),     # no warm-up: the first step at the base lr
    (6, 2, 37, 8, False),    # LogitNorm / ARPL: the counter never advances
])
def test_reference_schedule_is_the_trainers(epochs, warmup, rows, batch, advances):
    batches = -(-rows // batch)
    ours = planned_lrs("reference", epochs=epochs, warmup_epochs=warmup, batches=batches, rows=rows, batch_size=batch,
                       lr=1e-3, advances=advances)
    assert ours == pytest.approx(trainer_lrs(epochs, warmup, rows, batch, 1e-3, advances), rel=1e-12, abs=1e-15)


def test_reference_values_warm_up_from_halfway_and_end_at_zero():
    lrs = planned_lrs("reference", epochs=30, warmup_epochs=2, batches=125, rows=499, batch_size=4, lr=1e-3)
    assert lrs[0] == 0.0 and lrs[1] == pytest.approx(5.04e-4, rel=1e-12)  # (125 + 1) / 250 of 1e-3
    assert lrs[124] == pytest.approx(1e-3 * 249 / 250)  # the last step of epoch 1, one before the warm-up's end
    assert lrs[125] == pytest.approx(1e-3)  # warm-up end (counter 250 = warmup_t): the cosine's top
    last_epoch = lrs[-125:]
    assert last_epoch == [0.0] * 125  # the counter starts the last epoch at total (30 * 125): lr_min throughout
    assert lrs[-126] > 0
    frozen = planned_lrs("reference", epochs=4, warmup_epochs=1, batches=10, rows=95, batch_size=10, lr=1.0,
                         advances=False)
    for e in range(1, 4):
        assert len(set(frozen[e * 10 + 1:(e + 1) * 10])) == 1  # constant after each epoch's first step


def test_clean_schedule_is_warm_up_then_cosine():
    lrs = planned_lrs("clean", epochs=4, warmup_epochs=1, batches=5, rows=40, batch_size=8, lr=1.0)
    assert lrs[:5] == pytest.approx([0, 0.2, 0.4, 0.6, 0.8])
    assert lrs[5] == pytest.approx(1.0) and lrs[-1] == pytest.approx(0.5 * (1 + math.cos(math.pi * 14 / 15)))


def test_warm_up_as_long_as_the_run_is_refused_under_the_reference_schedule():
    with pytest.raises(ConfigError, match=r"warmup_epochs \(6\) must be below epochs \(6\)"):
        planned_lrs("reference", epochs=6, warmup_epochs=6, batches=3, rows=20, batch_size=8, lr=0.1)


def test_the_summary_states_the_effective_schedule():
    lrs = planned_lrs("reference", epochs=3, warmup_epochs=1, batches=4, rows=30, batch_size=8, lr=0.01)
    line = describe("reference", lrs, epochs=3, batches=4, warmup_epochs=1, lr=0.01)
    assert line.startswith("schedule reference: 3 epochs x 4 steps, warm-up 1 epochs, base lr 0.01")
    assert "step 0 0," in line and "last epoch" in line


def test_the_loop_runs_the_reference_schedule_and_keeps_the_last_partial_batch(single_torch_thread):
    from pipelines.training import train_heads

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(37, 6)).astype(np.float32), rng.integers(0, 3, 37)
    head = (np.zeros((3, 6)), np.zeros(3))
    _, kept = train_heads(head, x, y, epochs=4, lr=0.01, batch_size=8, warmup_epochs=1, schedule="reference",
                          drop_last=False, precision="fp32")
    assert kept.steps == 4 * 5  # ceil(37 / 8): the partial batch of 5 kept
    assert kept.lrs == pytest.approx(trainer_lrs(4, 1, 37, 8, 0.01), rel=1e-6)
    _, dropped = train_heads(head, x, y, epochs=4, lr=0.01, batch_size=8, warmup_epochs=1, precision="fp32")
    assert dropped.steps == 4 * 4  # exact: the partial batch dropped
    one_left = ReferenceSchedule(2, 0, 33, 8, 4)  # 33 = 4 * 8 + 1: a last batch of one row cannot train batch norm
    from pipelines.training.loop import drop_last

    assert drop_last(33, 8, keep_partial=True) and not drop_last(37, 8, keep_partial=True)
    assert one_left.steps_per_epoch == 5


def test_a_set_without_a_batch_is_refused(single_torch_thread):
    from pipelines.training import train_heads

    with pytest.raises(ConfigError, match="no optimiser step"):
        train_heads((np.zeros((2, 3)), np.zeros(2)), np.zeros((0, 3), np.float32), np.zeros(0, np.int64), epochs=1)
