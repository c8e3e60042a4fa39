"""AugMix against OpenOOD's own trainer: one step on tiny.py's network (golden numbers made by golden/make_augmix.py
from OpenOOD 3c35632: loss and weights after its SGD step) with the three views given, the JS consistency in float64 by
hand (the mixture's clamp included), the edges (a batch of 1, a single class, identical views, jsd off) and one epoch
of the image loop with its AugMix views."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from detectors import build
from detectors.training.augmix import AugMixLoss, jsd_consistency, stack_views
from pipelines.training import TrainBatch
from pipelines.training.augmix import AugMixViews
from pipelines.training.loop import _Step

GOLDEN = Path(__file__).parent / "golden"
sys.path.insert(0, str(GOLDEN))  # make_augmix imports its neighbours (tiny, openood_trainers) by name
_spec = importlib.util.spec_from_file_location("golden_make_augmix", GOLDEN / "make_augmix.py")
make = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make)
sys.path.remove(str(GOLDEN))
RECORD = json.loads((GOLDEN / "augmix.json").read_text())
CASES = RECORD["cases"]


class AsClassifier(torch.nn.Module):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, x):
        return self.net(x, return_feature=True)


def _batch(data: dict, jsd: bool) -> TrainBatch:
    x = torch.stack([data["data"], data["data_aug1"], data["data_aug2"]], dim=1) if jsd else data["data"]
    return TrainBatch(x=x, y=data["label"])


@pytest.mark.parametrize("name", sorted(CASES))
def test_one_step_matches_openood_trainer(name):
    """Same loss and weights after one step of the reference's optimiser (SGD lr 0.1, momentum 0.9, nesterov, weight
    decay 5e-4; its cosine LambdaLR is 1 at step 0) through the loop's own `_Step` on the stacked views."""
    case = CASES[name]
    net, data = make.inputs(name)
    step = _Step(AsClassifier(net), AugMixLoss(case["lam"], case["jsd"]))
    step.train()
    opt = RECORD["optimizer"]
    optimizer = torch.optim.SGD(net.parameters(), opt["lr"], momentum=opt["momentum"],
                                weight_decay=opt["weight_decay"], nesterov=True)
    initial = {key: value.double().numpy().copy() for key, value in net.state_dict().items()}
    loss = step(_batch(data, case["jsd"]))
    assert float(loss.detach()) == pytest.approx(case["loss"], rel=1e-6, abs=1e-7)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    for key, value in net.state_dict().items():
        want = np.array(case["updated"][key])
        # float32 gradients: another CPU's kernels sum in another order, off by a share of the tensor's largest step
        # (the clamped case's 400x logits move bn.weight by up to 3.9: 1.3e-6 of it on one machine against the golden)
        tolerance = 2e-6 + 4e-6 * np.abs(want - initial[key]).max()
        assert np.all(np.abs(value.double().numpy() - want) <= tolerance), key


def test_golden_cases_cover_the_branches():
    assert RECORD["openood_commit"].startswith("3c35632")
    assert CASES["one_class"]["loss"] == 0.0  # one class: CE 0, every softmax 1, no disagreement
    assert CASES["batch_of_one"]["rows"] == 1 and not CASES["no_jsd"]["jsd"]
    net, data = make.inputs("clamped")
    with torch.no_grad():
        p = [torch.softmax(net(data[k]).double(), 1) for k in ("data", "data_aug1", "data_aug2")]
    assert ((p[0] + p[1] + p[2]) / 3 < 1e-7).any()  # the clamp acts in this case


def _jsd_by_hand(clean: np.ndarray, aug1: np.ndarray, aug2: np.ndarray) -> float:
    def softmax(z):
        e = np.exp(z - z.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)

    p = [softmax(z) for z in (clean, aug1, aug2)]
    log_m = np.log(np.clip((p[0] + p[1] + p[2]) / 3, 1e-7, 1))
    kl = [np.sum(np.where(q > 0, q * (np.log(np.where(q > 0, q, 1)) - log_m), 0.0)) / len(q) for q in p]
    return float(sum(kl) / 3)


@pytest.mark.parametrize("n,k,scale", [(5, 4, 1.0), (1, 3, 2.0), (3, 1, 1.0), (4, 3, 40.0), (2, 2, 0.0)])
def test_jsd_by_hand(n, k, scale):
    rng = np.random.default_rng(n * 10 + k)
    z = [rng.normal(size=(n, k)) * scale for _ in range(3)]
    ours = float(jsd_consistency(*(torch.from_numpy(v) for v in z)))
    assert ours == pytest.approx(_jsd_by_hand(*z), rel=1e-10, abs=1e-12)
    if k == 1 or scale == 0.0:
        assert ours == 0.0


def test_loss_by_hand_and_edges():
    rng = np.random.default_rng(0)
    n, k = 3, 4
    logits = torch.from_numpy(rng.normal(size=(3 * n, k)))
    y = torch.tensor([0, 3, 1])
    batch = TrainBatch(x=torch.zeros(n, 3, 3, 2, 2), y=y)
    loss = float(AugMixLoss(lam=12.0).loss(logits, logits, batch))
    z = logits.numpy()
    log_p = z[:n] - np.log(np.exp(z[:n]).sum(1, keepdims=True))
    ce = -np.mean(log_p[np.arange(n), y.numpy()])
    # the loss runs in float32, as the reference (`logits.float()`)
    assert loss == pytest.approx(ce + 12.0 * _jsd_by_hand(z[:n], z[n:2 * n], z[2 * n:]), rel=1e-6)
    same = torch.cat([logits[:n]] * 3)
    assert float(AugMixLoss(lam=12.0).loss(same, same, batch)) == pytest.approx(ce, rel=1e-6)  # views agree: JS 0
    assert float(AugMixLoss(lam=0.0).loss(logits, logits, batch)) == pytest.approx(ce, rel=1e-6)
    assert float(AugMixLoss(jsd=False).loss(logits[:n], logits[:n], batch)) == pytest.approx(ce, rel=1e-6)


def test_views_are_stacked_view_after_view():
    x = torch.arange(2 * 3 * 3 * 2 * 2).reshape(2, 3, 3, 2, 2)
    stacked = AugMixLoss().inputs(TrainBatch(x=x, y=torch.zeros(2, dtype=torch.long)))
    assert torch.equal(stacked, torch.cat([x[:, 0], x[:, 1], x[:, 2]]))  # torch.cat([orig, aug1, aug2])
    assert torch.equal(stack_views(x[:1]), x[0])
    plain = torch.zeros(2, 3, 2, 2)
    assert AugMixLoss(jsd=False).inputs(TrainBatch(x=plain, y=torch.zeros(2, dtype=torch.long))) is plain
    with pytest.raises(ValueError, match="no heads-only mode"):
        AugMixLoss().inputs(TrainBatch(x=torch.zeros(2, 8), y=torch.zeros(2, dtype=torch.long)))


def test_defaults_are_openood_configs():
    det = build("augmix")
    assert {k: det.params[k] for k in ("severity", "mixture_width", "chain_depth", "alpha", "all_ops", "jsd", "lam",
                                       "interpolation", "mode", "score_rule")} == {
        "severity": 1, "mixture_width": 3, "chain_depth": -1, "alpha": 1.0, "all_ops": True, "jsd": True, "lam": 12.0,
        "interpolation": "bilinear", "mode": "full", "score_rule": "msp"}
    with pytest.raises(ValueError, match="mode"):
        build("augmix", mode="heads")
    with pytest.raises(ValueError, match="severity"):
        build("augmix", severity=11)


@pytest.mark.parametrize("jsd", [True, False])
def test_full_mode_fine_tunes_on_augmix_views(jsd, tmp_path):
    """One epoch on 12 px images: the loader hands [B, 3, 3, H, W] view stacks (jsd) that run as one 3B batch, or
    one AugMix view per image; the head moves and MSP scores."""
    from PIL import Image

    from pipelines.classifier import ImageClassifier
    from pipelines.data import make_row, write_manifest

    rng = np.random.default_rng(1)
    rows = []
    for i in range(6):
        Image.fromarray(rng.integers(0, 255, (12, 12, 3)).astype(np.uint8)).save(tmp_path / f"{i}.png")
        rows.append(make_row(f"{i}.png", split="train", label=i % 2))
    manifest = write_manifest(tmp_path, rows)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                                            torch.nn.Flatten())
            self.fc = torch.nn.Linear(8, 2)
            self.seen: list[tuple[int, ...]] = []

        def forward(self, x):
            if self.training:
                self.seen.append(tuple(x.shape))
            h = self.body(x)
            return self.fc(h), h

    torch.manual_seed(0)
    net = Net()
    clf = ImageClassifier.from_module(net, image_size=12)
    before = clf.head.weight.detach().clone()
    det = build("augmix", classifier=clf, epochs=1, batch_size=3, jsd=jsd, severity=3)
    assert isinstance(det.training_transforms((object(), None))[0], AugMixViews)
    det.fit(manifest)
    assert np.isfinite(det.history[-1]["loss"]) and not torch.equal(clf.head.weight.detach(), before)
    rows_per_step = 9 if jsd else 3
    assert net.seen and all(shape[0] == rows_per_step and len(shape) == 4 for shape in net.seen)
    scores = det.score(manifest)
    assert scores.shape == (6,) and np.all((scores >= 0.5 - 1e-9) & (scores <= 1 + 1e-9))
