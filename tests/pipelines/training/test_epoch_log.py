"""pipelines.training.epoch_log: a log line per epoch (epoch, loss, val top-1, elapsed, ETA) and, off a terminal, a
progress line every interval across the whole run, even when every epoch is shorter than the interval."""
import io
import logging

import numpy as np

from pipelines.progress import LineProgress
from pipelines.training.epoch_log import EpochLog, epoch_line


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_epoch_line_reads_as_promised():
    entry = {"epoch": 3, "loss": 0.41234, "acc_label": 0.81333}
    assert epoch_line("finetune", 3, 10, entry, 62.0, 100.0) == (
        "finetune epoch 3/10: loss 0.4123, val top-1 81.33%, elapsed 62 s, ETA 100 s")
    assert epoch_line("t", 10, 10, {"epoch": 10, "loss": float("nan")}, 300.0, None) == (
        "t epoch 10/10: loss n/a, elapsed 5 minutes")


def test_eta_is_the_mean_epoch_time_times_the_epochs_left(monkeypatch, caplog):
    monkeypatch.setenv("OODFORGE_PROGRESS", "off")
    clock = Clock()
    report = EpochLog("train", epochs=5, first=1, batches=4, enabled=True, clock=clock)  # resumed after epoch 1
    assert report.eta(1) is None  # nothing timed yet
    clock.now = 20.0
    with caplog.at_level(logging.INFO, logger="pipelines.training.epoch_log"):
        line = report.epoch_done({"epoch": 2, "loss": 1.0, "acc_label": 0.5})
    assert line == "train epoch 2/5: loss 1.0000, val top-1 50.00%, elapsed 20 s, ETA 60 s"  # 20 s an epoch x 3 left
    assert caplog.messages == [line]
    quiet = EpochLog("train", epochs=2, first=0, batches=1, enabled=False, clock=clock)
    caplog.clear()
    quiet.epoch_done({"epoch": 1, "loss": 1.0})
    assert caplog.messages == []  # only the reporting process logs


def test_lines_span_the_run_so_short_epochs_still_print(monkeypatch):
    """Ten epochs of 10 s each with a 30 s interval: a per-epoch display would never print; the run-wide one prints
    every 30 s with the epoch, the loss, the last val top-1 and the ETA."""
    out, clock = io.StringIO(), Clock()
    monkeypatch.setenv("OODFORGE_PROGRESS", "lines")
    report = EpochLog("train", epochs=10, first=0, batches=2, enabled=True, clock=clock)
    report.bar = LineProgress(desc="train", total=20, unit="step", leave=False, interval=30.0, stream=out, clock=clock)
    for epoch in range(10):
        for _ in range(2):
            clock.now += 5.0
            report.step(epoch, 0.5)
        report.epoch_done({"epoch": epoch + 1, "loss": 0.5, "acc_label": 0.9})
    report.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 3  # at 30, 60 and 90 s
    assert lines[0] == ("train: 6/20 step (30%), 30 s, 0.2 step/s, epoch=3/10, loss=0.5000, val_top1=90.00%, "
                        "ETA=70 s")


def test_a_training_run_logs_every_epoch(monkeypatch, caplog):
    from pipelines.training.loop import train_heads

    monkeypatch.setenv("OODFORGE_PROGRESS", "off")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 6)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    with caplog.at_level(logging.INFO, logger="pipelines.training.epoch_log"):
        _, result = train_heads((np.zeros((2, 6)), np.zeros(2)), x, y, epochs=3, batch_size=8, lr=0.1,
                                val_features=x, val_labels=y)
    lines = [r.getMessage() for r in caplog.records if r.name == "pipelines.training.epoch_log"]
    assert [m.split(":")[0] for m in lines] == [f"train_heads epoch {e}/3" for e in (1, 2, 3)]
    last = result.history[-1]
    assert f"loss {last['loss']:.4f}, val top-1 {100 * last['acc_label']:.2f}%" in lines[-1]
    assert "ETA" in lines[0] and "ETA" not in lines[-1]
