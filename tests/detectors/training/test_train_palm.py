"""PALM against one training step of OpenOOD's own trainer and the `mds` postprocessor OpenOOD evaluates it with (golden
numbers made by golden/make_palm.py at the commit golden/palm.json names), a float64 hand computation of the Sinkhorn
assignment and of the losses, and the edges (one row, one class, k above n_proto, k 0, no prototype contrast)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from detectors import FeatureSet, LinearHead, build
from detectors.training.embedding import unit_rows
from detectors.training.palm import PALMLoss, sinkhorn
from pipelines.training import TrainBatch

GOLDEN = json.loads((Path(__file__).parent / "golden" / "palm.json").read_text())
F32 = dict(dtype=torch.float32)


def _objective(case: dict) -> PALMLoss:
    a = case["args"]
    weights = {k: torch.tensor(v, **F32) for k, v in case["inputs"]["weights"].items()}
    objective = PALMLoss(a["proto_m"], a["n_proto"], a["k"], a["temp"], a["epsilon"], a["sinkhorn_iter"],
                         a["lambda_pcon"], feat_dim=weights["2.weight"].shape[0])
    objective.setup(weights["0.weight"].shape[1], case["classes"])
    objective.projection.load_state_dict(weights)
    objective.protos = torch.tensor(case["initial_prototypes"], **F32)
    return objective


def test_golden_is_openood_at_the_recorded_commit():
    assert GOLDEN["openood_commit"].startswith("3c35632") and GOLDEN["made_by"].endswith("make_palm.py")
    params = build("palm").params
    assert {k: params[k] for k in GOLDEN["defaults"] if k != "nviews"} == {
        k: v for k, v in GOLDEN["defaults"].items() if k != "nviews"}
    assert params["feat_dim"] == 128 and params["projection"] == "mlp"


@pytest.mark.parametrize("index", range(len(GOLDEN["cases"])))
def test_one_step_equals_openood_palm_trainer(index):
    """Both loss terms, the moved prototypes, the gradients and the reference's SGD step (nesterov, momentum 0.9,
    weight decay 1e-4, its warm-up lr) from our gradients; the batch holds two views per label (nviews 2)."""
    case = GOLDEN["cases"][index]
    objective = _objective(case)
    views = torch.cat([torch.tensor(v, **F32) for v in case["inputs"]["views"]])
    loss = objective.loss(None, views, TrainBatch(x=views, y=torch.tensor(case["inputs"]["y"])))
    assert float(loss.detach()) == pytest.approx(case["loss"], rel=1e-5)
    assert objective.last_terms["mle"] == pytest.approx(case["mle"], rel=1e-5)
    if case["pcon"] is not None:
        assert objective.last_terms["pcon"] == pytest.approx(case["args"]["lambda_pcon"] * case["pcon"], rel=1e-5)
    else:
        assert "pcon" not in objective.last_terms
    np.testing.assert_allclose(objective.protos.numpy(), case["prototypes"], atol=1e-6)
    optimizer = torch.optim.SGD(objective.projection.parameters(), case["lr"], momentum=0.9, weight_decay=1e-4,
                                nesterov=True)
    optimizer.zero_grad()
    loss.backward()
    for name, p in objective.projection.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), case["grads"][name], rtol=1e-4, atol=1e-6)
    optimizer.step()
    for name, p in objective.projection.named_parameters():
        np.testing.assert_allclose(p.detach().numpy(), case["stepped"][name], atol=1e-7)


def _sinkhorn64(z, p, eps, iterations):
    q = np.exp(z @ p.T / eps).T
    q = q / q.sum()
    k, b = q.shape
    for _ in range(iterations):
        q = q / q.sum(1, keepdims=True) / k
        q = q / q.sum(0, keepdims=True) / b
    return (q * b).T


def _unit(v):
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


def _by_hand(z, y, protos, classes, m, k, temp, eps, iters, lam):
    """float64: assignment, top-k within the row's class, EMA, MLE on the moved prototypes, prototype contrast."""
    owner = np.tile(np.arange(classes), len(protos) // classes)
    mask = (y[:, None] == owner[None, :]).astype(float)
    upd = mask * _sinkhorn64(z, protos, eps, iters)
    top = np.zeros_like(upd)
    for i, row in enumerate(upd):
        top[i, np.argsort(-row, kind="stable")[:k]] = 1
    upd = top * upd
    upd = upd / np.maximum(upd.sum(1, keepdims=True), 1e-12)
    upd = upd / np.maximum(upd.sum(0, keepdims=True), 1e-12)
    moved = _unit(m * protos + (1 - m) * upd.T @ z)
    top2 = np.zeros_like(upd)
    for i, row in enumerate(upd):
        top2[i, np.argsort(-row, kind="stable")[:k]] = 1
    w = top2 * mask * _sinkhorn64(z, moved, eps, iters)
    w = w / np.maximum(w.sum(1, keepdims=True), 1e-12)
    logits = z @ moved.T / temp
    mle = -np.mean((w * logits).sum(1) - np.log(np.exp(logits).sum(1)))
    sim = moved @ moved.T / 0.5
    sim = sim - sim.max(1, keepdims=True)
    same = (owner[:, None] == owner[None, :]).astype(float) * (1 - np.eye(len(owner)))
    pos = (same / np.maximum(same.sum(1, keepdims=True), 1e-12) * sim).sum(1)
    neg = np.log(((1 - np.eye(len(owner))) * np.exp(sim)).sum(1))
    return mle + lam * -np.mean(pos - neg), moved


def test_loss_by_hand_in_float64():
    rng = np.random.default_rng(6)
    torch.manual_seed(0)
    objective = PALMLoss(proto_m=0.9, n_proto=4, k=3, feat_dim=5)
    objective.setup(7, 3)
    h, y = rng.normal(size=(8, 7)), rng.integers(0, 3, 8)
    z = _unit(objective.projection(torch.tensor(h, **F32)).detach().double().numpy())
    protos = objective.protos.double().numpy()
    want, moved = _by_hand(z, y, protos, 3, 0.9, 3, 0.1, 0.05, 3, 1.0)
    got = objective.loss(None, torch.tensor(h, **F32), TrainBatch(x=torch.zeros(8, 7), y=torch.tensor(y)))
    assert float(got.detach()) == pytest.approx(want, rel=1e-4)
    np.testing.assert_allclose(objective.protos.numpy(), moved, atol=1e-5)
    q = sinkhorn(torch.tensor(z, **F32), torch.tensor(protos, **F32), 0.05, 3).numpy()
    np.testing.assert_allclose(q, _sinkhorn64(z, protos, 0.05, 3), rtol=1e-4)
    np.testing.assert_allclose(q.sum(1), 1, rtol=1e-5)  # each row's assignment sums to 1


def test_edges_one_row_and_one_class():
    torch.manual_seed(0)
    for classes, y in ((3, [2]), (1, [0, 0, 0, 0])):
        objective = PALMLoss(feat_dim=3)
        objective.setup(4, classes)
        assert objective.protos.shape == (6 * classes, 3)
        h = torch.randn(len(y), 4, requires_grad=True)
        loss = objective.loss(None, h, TrainBatch(x=h, y=torch.tensor(y)))
        loss.backward()
        assert np.isfinite(float(loss.detach())) and torch.isfinite(h.grad).all()
        np.testing.assert_allclose(objective.protos.norm(dim=1).numpy(), 1, atol=1e-6)


def test_postprocessor_scores_equal_openood_mds():
    ref = GOLDEN["postprocessor"]
    det = build("palm", mode="heads")
    det.extra = det.fit_rule(unit_rows(np.float32(ref["train_x"])), np.asarray(ref["train_y"]))
    np.testing.assert_allclose(det.rule_scores(unit_rows(np.float32(ref["test_x"]))), ref["scores"], rtol=1e-6,
                               atol=1e-6)


def test_heads_mode_scores_mds_on_the_normalised_frozen_features(tmp_path):
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(3, 6)) * 3
    y = np.repeat(np.arange(3), 40)
    train = FeatureSet(centres[y] + rng.normal(size=(120, 6)), None, y)
    test = FeatureSet(rng.normal(size=(30, 6)) * 4, None, None)
    head = LinearHead(rng.normal(size=(3, 6)), np.zeros(3))
    det = build("palm", mode="heads", epochs=2, batch_size=16, warmup_epochs=0).fit(train, head=head)
    mds = build("mds").fit(FeatureSet(unit_rows(train.features), None, y))
    np.testing.assert_allclose(det.score(test), mds.score(FeatureSet(unit_rows(test.features), None, None)),
                               rtol=1e-9, atol=1e-9)
    assert np.isfinite(det.history[-1]["loss"]) and det.extra["projection.2.weight"].shape == (128, 6)
    det.save_pretrained(tmp_path / "palm")
    np.testing.assert_array_equal(type(det).from_pretrained(tmp_path / "palm").score(test), det.score(test))
