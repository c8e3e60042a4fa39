"""The best epoch kept beside the last (pipelines.training.loop): the reference's rule (a replica of
`BaseRecorder.save_model`), the weights of that epoch returned or kept, and a killed run resuming to the same best.

Validation curves are scripted (the loop's own accuracy replaced by a known curve), so the best epoch is known."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import pipelines.training.loop as loop
from pipelines.checkpoints import best_epoch_saved, best_path, read_metadata
from pipelines.training import train_heads
from pipelines.training.loop import BEST_METRIC, best_epoch

pytestmark = pytest.mark.usefixtures("single_torch_thread")
NAN = float("nan")


def reference_recorder(accuracies):
    """Open-Insect's BaseRecorder.save_model (src/openood/recorders/base_recorder.py:12-13, 40-55) restated: the epoch
    `best.ckpt` holds after epochs 1..N with these validation accuracies (None: never written)."""
    best_acc, best = 0.0, None
    for epoch, acc in enumerate(accuracies, start=1):
        if acc >= best_acc:
            best_acc, best = acc, epoch
    return best


CURVES = {"peak before the last": [0.2, 0.7, 0.5, 0.4], "a later tie wins": [0.2, 0.6, 0.4, 0.6, 0.5, 0.3],
          "rising": [0.1, 0.2, 0.3], "all zero": [0.0, 0.0, 0.0], "one epoch": [0.5], "flat": [0.4, 0.4],
          "a NaN epoch": [0.3, NAN, 0.2]}


@pytest.mark.parametrize("case", sorted(CURVES))
def test_best_epoch_is_the_recorders(case):
    curve = CURVES[case]
    history = [{"epoch": i + 1, "loss": 1.0, BEST_METRIC: acc} for i, acc in enumerate(curve)]
    assert best_epoch(history) == reference_recorder(curve)


def test_no_validation_accuracy_keeps_no_best():
    assert best_epoch([{"epoch": 1, "loss": 1.0}, {"epoch": 2, "loss": 0.5}]) is None
    assert best_epoch([]) is None


def _scripted(monkeypatch, curve):
    """Replace the loop's validation accuracy of epoch i (0-based, the history's length before it is appended) with
    curve[i]; the real pass still runs."""
    real = loop._Loop.evaluate

    def evaluate(self, loader, targets, split):
        out = real(self, loader, targets, split)
        if split == "val":
            out = {**out, BEST_METRIC: curve[len(self.result.history)]}
        return out

    monkeypatch.setattr(loop._Loop, "evaluate", evaluate)


def _per_epoch_heads(monkeypatch):
    """The head's weights after every epoch (recorded where the loop saves its checkpoint)."""
    seen: dict[int, torch.Tensor] = {}
    real = loop._Loop.save

    def save(self, epochs_done):
        seen[epochs_done] = self.acc.unwrap_model(self.step_module).model.head.weight.detach().clone()
        return real(self, epochs_done)

    monkeypatch.setattr(loop._Loop, "save", save)
    return seen


def _heads_data(seed=0):
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 2, (3, 6))
    labels = rng.integers(0, 3, 60)
    feats = (centres[labels] + rng.normal(size=(60, 6))).astype(np.float32)
    return torch.nn.Linear(6, 3), feats, labels


@pytest.mark.parametrize("weights", ["best", "last"])
def test_train_heads_returns_the_chosen_epochs_head(monkeypatch, weights):
    curve = [0.2, 0.6, 0.4, 0.6, 0.5, 0.3]  # best: epoch 4 (ties with 2, the later wins); last: 6
    _scripted(monkeypatch, curve)
    seen = _per_epoch_heads(monkeypatch)
    head, feats, labels = _heads_data()
    layer, result = train_heads(head, feats, labels, epochs=6, lr=0.05, batch_size=16, warmup_epochs=0,
                                val_features=feats, val_labels=labels, weights=weights)
    assert not torch.equal(seen[4], seen[6])
    torch.testing.assert_close(layer.weight.detach(), seen[4 if weights == "best" else 6], rtol=0, atol=0)
    if weights == "best":
        assert result.best == 4 == reference_recorder(curve) and result.kept == "best"
        assert result.best_entry[BEST_METRIC] == 0.6 and result.best_entry["epoch"] == 4
    else:  # nothing asked for the best epoch: none is kept
        assert result.best is None and result.kept == "last"


def test_best_needs_validation_rows():
    head, feats, labels = _heads_data()
    with pytest.raises(ValueError, match="ID validation"):
        train_heads(head, feats, labels, epochs=2, batch_size=16, weights="best")


# -- on images, with a checkpoint: the best file beside it, and a killed run ------------------------------------------
def _images(tmp_path):
    from tests.pipelines.test_training import _colour_manifest

    rng = np.random.default_rng(0)
    return _colour_manifest(tmp_path / "train", 6, "train", rng), _colour_manifest(tmp_path / "val", 2, "val", rng)


def _finetune(tmp_path, folder, train, val, **options):
    from pipelines.classifier import ImageClassifier
    from pipelines.training import finetune
    from tests.pipelines.test_training import TinyNet

    torch.manual_seed(0)
    clf = ImageClassifier.from_module(TinyNet(), image_size=16)
    folder.mkdir(parents=True, exist_ok=True)
    result = finetune(clf, train, val=val, test=val, epochs=6, lr=2e-2, batch_size=8, warmup_epochs=1, seed=0,
                      checkpoint=folder / "ckpt.safetensors", checkpoint_key="run", keep_best=True, **options)
    return clf, result


class Killed(Exception):
    """Stands for kill -9 at a chosen point of the loop (nothing after it runs)."""


@pytest.mark.parametrize("where", ["before the best epoch's weights are written", "after a later checkpoint"])
def test_a_killed_run_resumes_to_the_uninterrupted_best(monkeypatch, tmp_path, where):
    """Killed right after epoch 4's checkpoint (epoch 4 the best, its weights not yet written), or after epoch 5's
    checkpoint (epoch 4's weights kept before it): the resumed run keeps epoch 4's weights, as the whole run does."""
    curve = [0.2, 0.6, 0.4, 0.6, 0.5, 0.3]
    _scripted(monkeypatch, curve)
    train, val = _images(tmp_path)
    whole, whole_result = _finetune(tmp_path, tmp_path / "whole", train, val, weights="best")
    assert whole_result.best == 4 and best_epoch_saved(best_path(tmp_path / "whole" / "ckpt.safetensors"), "run") == 4

    real_save, real_best = loop._Loop.save, loop.save_best
    stop_at = 4 if where.startswith("before") else 5

    def save(self, epochs_done):
        real_save(self, epochs_done)
        if epochs_done == stop_at and stop_at == 5:
            raise Killed

    def save_best(path, key, epoch, *args):
        if epoch == stop_at:
            raise Killed
        return real_best(path, key, epoch, *args)

    monkeypatch.setattr(loop._Loop, "save", save)
    monkeypatch.setattr(loop, "save_best", save_best)
    with pytest.raises(Killed):
        _finetune(tmp_path, tmp_path / "killed", train, val, weights="best")
    ckpt = tmp_path / "killed" / "ckpt.safetensors"
    assert int(read_metadata(ckpt)["epoch"]) == stop_at
    assert best_epoch_saved(best_path(ckpt), "run") == (2 if stop_at == 4 else 4)
    monkeypatch.setattr(loop._Loop, "save", real_save)
    monkeypatch.setattr(loop, "save_best", real_best)
    resumed, result = _finetune(tmp_path, tmp_path / "killed", train, val, weights="best")
    assert result.best == 4 and result.kept == "best" and best_epoch_saved(best_path(ckpt), "run") == 4
    for key, value in whole.state_dict().items():
        torch.testing.assert_close(resumed.state_dict()[key], value, rtol=0, atol=0)
    assert result.best_test == whole_result.best_test and result.history == whole_result.history


def test_a_best_file_that_does_not_match_the_history_starts_over(monkeypatch, tmp_path, capsys):
    """The best epoch's weights gone (deleted, or written by an older version): the checkpoint cannot give the run's
    best, so training starts over (one warning) and ends as the whole run does."""
    _scripted(monkeypatch, [0.2, 0.6, 0.4, 0.6, 0.5, 0.3])
    train, val = _images(tmp_path)
    whole, whole_result = _finetune(tmp_path, tmp_path / "run", train, val, weights="best")
    best_path(tmp_path / "run" / "ckpt.safetensors").unlink()
    capsys.readouterr()
    again, result = _finetune(tmp_path, tmp_path / "run", train, val, weights="best")
    assert "training starts over" in capsys.readouterr().err
    assert result.best == 4 and len(result.history) == 6 and result.steps == whole_result.steps
    for key, value in whole.state_dict().items():
        torch.testing.assert_close(again.state_dict()[key], value, rtol=0, atol=0)


def test_last_weights_stay_and_the_best_tests_on_its_own_weights(monkeypatch, tmp_path):
    _scripted(monkeypatch, [0.2, 0.6, 0.4, 0.6, 0.5, 0.3])
    train, val = _images(tmp_path)
    last, result = _finetune(tmp_path, tmp_path / "a", train, val)
    best, best_result = _finetune(tmp_path, tmp_path / "b", train, val, weights="best")
    assert result.kept == "last" and result.best == 4 and best_result.best_test == result.best_test
    assert any(not torch.equal(last.state_dict()[k], v) for k, v in best.state_dict().items())
    assert result.test.keys() == result.best_test.keys() and not math.isnan(result.best_test[BEST_METRIC])


def test_a_planted_checkpoint_index_cannot_point_outside_the_model_folder(tmp_path):
    import json

    from pipelines.checkpoints import CHECKPOINT_INDEX, INDEX_FORMAT, checkpoint_folder
    from pipelines.errors import UserInputError

    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text("{}")
    model = tmp_path / "model"
    (model / "best").mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (model / "best" / "config.json").write_text("{}")
    for folder, ok in (("best", True), (".", True), ("../other", False), (str(tmp_path / "other"), False),
                       ("missing", False), (3, False)):
        (model / CHECKPOINT_INDEX).write_text(json.dumps({"format": INDEX_FORMAT, "best": {"folder": folder},
                                                          "last": None}))
        if ok:
            assert checkpoint_folder(model, "best") == (model / folder).resolve()
        else:
            with pytest.raises(UserInputError, match="not a model folder inside"):
                checkpoint_folder(model, "best")
    assert checkpoint_folder(model, "last") is None
    (model / CHECKPOINT_INDEX).write_text('{"format": "something else"}')
    with pytest.raises(UserInputError, match="not an oodforge checkpoint index"):
        checkpoint_folder(model, "best")
    assert checkpoint_folder(tmp_path / "other", "best") is None  # no index: nothing kept
