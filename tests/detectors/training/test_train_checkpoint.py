"""A training-time method's `checkpoint: last | best`: the fine-tune scores with its last epoch or its best ID-val epoch
(the reference's best.ckpt rule), from one training: switching the choice on a finished fine-tune trains nothing."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import pipelines.training.loop as loop
from detectors import FeatureSet, build
from detectors.base import LinearHead
from pipelines.training.loop import BEST_METRIC

pytestmark = pytest.mark.usefixtures("single_torch_thread")
CURVE = [0.2, 0.6, 0.4, 0.6, 0.5, 0.3]  # scripted ID-val top-1: best epoch 4 (ties with 2, the later wins), last 6


@pytest.fixture
def scripted(monkeypatch):
    """The loop's validation accuracy of epoch i is CURVE[i]; returns the primary head's weights after every epoch and
    the number of epochs trained."""
    measured, save, train_epoch = loop._Loop.evaluate, loop._Loop.save, loop._Loop.train_epoch
    seen: dict[int, dict[str, torch.Tensor]] = {}
    trained = []

    def evaluate(self, loader, targets, split):
        out = measured(self, loader, targets, split)
        return {**out, BEST_METRIC: CURVE[len(self.result.history)]} if split == "val" else out

    def record(self, epochs_done):
        model = self.acc.unwrap_model(self.step_module).model
        seen[epochs_done] = {k: v.detach().clone() for k, v in model.state_dict().items()}
        return save(self, epochs_done)

    def counted(self, epoch):
        trained.append(epoch)
        return train_epoch(self, epoch)

    monkeypatch.setattr(loop._Loop, "evaluate", evaluate)
    monkeypatch.setattr(loop._Loop, "save", record)
    monkeypatch.setattr(loop._Loop, "train_epoch", counted)
    return seen, trained


def _features(seed: int = 0):
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 2, (3, 8))
    y = rng.integers(0, 3, 60)
    return FeatureSet((centres[y] + rng.normal(size=(60, 8))).astype(np.float32), labels=y)


HEADS = dict(mode="heads", epochs=6, lr=0.05, batch_size=16, warmup_epochs=0)


@pytest.mark.parametrize("checkpoint, epoch", [("best", 4), ("last", 6)])
def test_heads_mode_scores_with_the_chosen_epoch(scripted, checkpoint, epoch):
    seen, _ = scripted
    train = _features()
    head = LinearHead(np.zeros((3, 8)), np.zeros(3))
    det = build("logitnorm", **HEADS, checkpoint=checkpoint).fit(train, head=head, id_val=train)
    np.testing.assert_allclose(det.head.weight, seen[epoch]["head.weight"].numpy().astype(np.float64), rtol=0, atol=0)
    assert not torch.equal(seen[4]["head.weight"], seen[6]["head.weight"])
    assert det.hyperparameters["checkpoint"] == checkpoint


def test_best_needs_id_val():
    with pytest.raises(ValueError, match="checkpoint 'best'"):
        build("logitnorm", **HEADS, checkpoint="best").fit(_features(), head=LinearHead(np.zeros((3, 8)), np.zeros(3)))


def test_full_mode_switching_to_best_on_a_finished_fine_tune_trains_nothing(scripted, tmp_path):
    from pipelines.classifier import ImageClassifier
    from tests.pipelines.test_training import TinyNet, _colour_manifest

    seen, trained = scripted
    rng = np.random.default_rng(0)
    train, val = _colour_manifest(tmp_path / "train", 6, "train", rng), _colour_manifest(tmp_path / "val", 2,
                                                                                         "val", rng)

    def fitted(checkpoint):
        torch.manual_seed(0)
        clf = ImageClassifier.from_module(TinyNet(), image_size=16)
        det = build("logitnorm", epochs=6, lr=2e-2, batch_size=8, warmup_epochs=1, augment="none",
                    checkpoint=checkpoint, classifier=clf, work_dir=tmp_path / "work")
        return det.fit(train, id_val=val), clf

    _, last = fitted("last")
    assert len(trained) == 6
    for key, value in seen[6].items():
        torch.testing.assert_close(last.state_dict()[key], value, rtol=0, atol=0)
    _, best = fitted("best")
    assert len(trained) == 6  # the finished fine-tune resumed: no epoch trained again
    for key, value in seen[4].items():
        torch.testing.assert_close(best.state_dict()[key], value, rtol=0, atol=0)
    assert any(not torch.equal(seen[4][k], seen[6][k]) for k in seen[4])
