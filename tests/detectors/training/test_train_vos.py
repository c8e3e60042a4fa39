"""VOS against an epoch of OpenOOD's own trainer (golden numbers made by golden/make_vos.py at the commit
golden/vos.json names: every step's loss while the queues fill and then with virtual outliers, the weights after the
trainer's SGD and cosine steps, the same global generator draws), a float64 hand computation of the Gaussian, the
energy and the loss, and the edges (a one-row batch, one class, rows of a full class dropped while others fill)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from detectors import FeatureSet, LinearHead, build
from detectors.training.vos import VOSLoss, weighted_energy
from pipelines.training import TrainBatch

GOLDEN = json.loads((Path(__file__).parent / "golden" / "vos.json").read_text())
F32 = dict(dtype=torch.float32)


def test_golden_is_openood_at_the_recorded_commit():
    assert GOLDEN["openood_commit"].startswith("3c35632") and GOLDEN["made_by"].endswith("make_vos.py")
    params = build("vos").params
    assert {k: params[k] for k in GOLDEN["defaults"]} == GOLDEN["defaults"] and params["score_rule"] == "ebo"


@pytest.mark.parametrize("index", range(len(GOLDEN["cases"])))
def test_an_epoch_equals_openood_vos_trainer(index):
    case = GOLDEN["cases"][index]
    classes, dim = case["classes"], len(case["inputs"]["fc"]["weight"][0])
    head = torch.nn.Linear(dim, classes)
    head.load_state_dict({k: torch.tensor(v, **F32) for k, v in case["inputs"]["fc"].items()})
    objective = VOSLoss(case["sample_number"], case["sample_from"], case["select"], 0.1)
    objective.setup(dim, classes)
    objective.logistic_regression.load_state_dict({k: torch.tensor(v, **F32)
                                                   for k, v in case["inputs"]["logistic"].items()})
    objective.bind_head(head)
    batches = case["inputs"]["batches"]
    optimizer = torch.optim.SGD(list(head.parameters()) + list(objective.logistic_regression.parameters()), 0.1,
                                momentum=0.9, weight_decay=5.0e-4, nesterov=True)
    total = 100 * len(batches)  # the trainer's cosine LambdaLR (num_epochs 100), its lr_min 1e-6
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1e-6 / 0.1 + (1 - 1e-6 / 0.1) * 0.5 * (
        1 + np.cos(step / total * np.pi)))
    torch.manual_seed(case["seed"])
    regs = []
    for b, want in zip(batches, case["losses"]):
        x, y = torch.tensor(b["x"], **F32), torch.tensor(b["y"])
        loss = objective.loss(head(x), x, TrainBatch(x=x, y=y))
        regs.append(objective.last_terms["reg"])
        assert float(loss.detach()) == pytest.approx(want, rel=1e-5)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    assert regs[0] == 0.0 and regs[-1] > 0  # the queues fill first, then the virtual outliers join
    for name, p in head.state_dict().items():
        np.testing.assert_allclose(p.numpy(), case["fc"][name], atol=1e-6)
    for name, p in objective.logistic_regression.state_dict().items():
        np.testing.assert_allclose(p.numpy(), case["logistic"][name], atol=1e-6)


def test_energy_and_loss_by_hand_in_float64():
    rng = np.random.default_rng(2)
    torch.manual_seed(0)
    head = torch.nn.Linear(4, 2)
    objective = VOSLoss(sample_number=3, sample_from=30, select=2, loss_weight=0.5)
    objective.setup(4, 2)
    objective.bind_head(head)
    queue = rng.normal(size=(2, 3, 4))
    objective.queue.copy_(torch.tensor(queue, **F32))
    objective.counts.fill_(3)
    x, y = rng.normal(size=(2, 4)), np.array([1, 0])
    xt = torch.tensor(x, **F32)
    state = torch.get_rng_state()
    got = objective.loss(head(xt), xt, TrainBatch(x=xt, y=torch.tensor(y)))
    # the same draws by hand: the queues after the roll, one tied covariance, lowest densities, the energies
    queue[1] = np.concatenate([queue[1][1:], x[:1]])
    queue[0] = np.concatenate([queue[0][1:], x[1:]])
    means = queue.mean(1)
    centred = (queue - means[:, None]).reshape(-1, 4)
    cov = centred.T @ centred / len(centred) + 1e-4 * np.eye(4)
    torch.set_rng_state(state)
    chol = np.linalg.cholesky(cov)
    picked = []
    for c in range(2):
        eps = torch.empty(30, 4).normal_().double().numpy()
        draws = means[c] + eps @ chol.T
        d = draws - means[c]
        maha = np.einsum("nd,de,ne->n", d, np.linalg.inv(cov), d)
        picked.append(draws[np.argsort(-maha, kind="stable")[:2]])
    w1, w2 = (torch.nn.Linear(2, 1).weight.detach().double().numpy() for _ in range(2))
    wt, bt = head.weight.detach().double().numpy(), head.bias.detach().double().numpy()

    def energy(z, w):  # all-negative weights: log 0 = -inf, floored at -1 as there
        m = z.max(1)
        with np.errstate(divide="ignore"):
            return np.maximum(m + np.log((np.maximum(w, 0) * np.exp(z - m[:, None])).sum(1)), -1)

    z = x @ wt.T + bt
    e = np.concatenate([energy(z, w1), energy(np.concatenate(picked) @ wt.T + bt, w2)])
    lw = objective.logistic_regression.weight.detach().double().numpy()[:, 0]
    lb = objective.logistic_regression.bias.detach().double().numpy()
    out = e[:, None] * lw + lb
    target = np.r_[np.ones(2), np.zeros(4)].astype(int)
    reg = np.mean(np.log(np.exp(out).sum(1)) - out[np.arange(6), target])
    ce = np.mean(np.log(np.exp(z).sum(1)) - z[np.arange(2), y])
    assert float(got.detach()) == pytest.approx(ce + 0.5 * reg, rel=1e-5)


def test_energy_has_no_gradient_and_a_floor_of_minus_one():
    z = torch.tensor([[-50.0, -60.0], [3.0, 1.0]], requires_grad=True)
    out = weighted_energy(z)
    assert not out.requires_grad and float(out[0]) == -1.0 and math.isfinite(float(out[1]))


def test_edges_one_row_one_class_and_full_classes_dropping_rows():
    torch.manual_seed(0)
    head = torch.nn.Linear(3, 2)
    objective = VOSLoss(sample_number=2, sample_from=10, select=1)
    objective.setup(3, 2)
    objective.bind_head(head)
    x = torch.randn(3, 3)
    objective.loss(head(x), x, TrainBatch(x=x, y=torch.tensor([0, 0, 0])))  # the third row of class 0 is dropped
    assert objective.counts.tolist() == [2, 0] and torch.equal(objective.queue[0], x[:2])
    one = torch.randn(1, 3)
    objective.loss(head(one), one, TrainBatch(x=one, y=torch.tensor([1])))
    assert objective.counts.tolist() == [2, 1] and objective.last_terms["reg"] == 0.0
    objective.loss(head(one), one, TrainBatch(x=one, y=torch.tensor([1])))
    loss = objective.loss(head(one), one, TrainBatch(x=one, y=torch.tensor([1])))  # full: a one-row batch samples
    assert objective.last_terms["reg"] > 0 and np.isfinite(float(loss.detach()))

    single = VOSLoss(sample_number=2, sample_from=10, select=3)
    single.setup(3, 1)
    single_head = torch.nn.Linear(3, 1)
    single.bind_head(single_head)
    for _ in range(2):
        x = torch.randn(2, 3)
        loss = single.loss(single_head(x), x, TrainBatch(x=x, y=torch.zeros(2, dtype=torch.long)))
    assert single.last_terms["reg"] > 0 and single.last_terms["ce"] == 0.0 and np.isfinite(float(loss.detach()))


def test_heads_mode_trains_and_scores_the_energy():
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(3, 6)) * 3
    y = np.repeat(np.arange(3), 40)
    train = FeatureSet(centres[y] + rng.normal(size=(120, 6)), None, y)
    test = FeatureSet(rng.normal(size=(30, 6)) * 4, None, None)
    det = build("vos", mode="heads", epochs=2, batch_size=16, warmup_epochs=0, sample_number=10,
                sample_from=100).fit(train, head=LinearHead(rng.normal(size=(3, 6)), np.zeros(3)))
    logits = det.transform(test).logits
    np.testing.assert_allclose(det.score(test), np.log(np.exp(logits).sum(1)), rtol=1e-12)
    assert np.isfinite(det.history[-1]["loss"])
