"""RTS against an epoch of OpenOOD's own trainer and its postprocessor (golden numbers made by golden/make_rts.py at the
commit golden/rts.json names: every step's loss and gradient norm before clipping, the weights and batch-norm
statistics after the trainer's SGD, cosine and clipping steps, the `var` and `msp` scores of the eval-mode network),
a float64 hand computation of the loss and the variance, and the edges (one row, no row, one class, dof 3)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from detectors import FeatureSet, LinearHead, build, load
from detectors.training.rts import RTSLoss, rts_loss, rts_variance
from pipelines.training import TrainBatch

GOLDEN = json.loads((Path(__file__).parent / "golden" / "rts.json").read_text())
F32 = dict(dtype=torch.float32)


def test_golden_is_openood_at_the_recorded_commit():
    assert GOLDEN["openood_commit"].startswith("3c35632") and GOLDEN["made_by"].endswith("make_rts.py")
    params = build("rts").params
    assert {k: params[k] for k in GOLDEN["defaults"]} == GOLDEN["defaults"]
    assert RTSLoss.max_grad_norm == GOLDEN["max_grad_norm"]


def _objective(case: dict, state: dict) -> tuple[torch.nn.Linear, RTSLoss]:
    classes, dim = case["classes"], len(state["backbone.fc.weight"][0])
    head = torch.nn.Linear(dim, classes)
    head.load_state_dict({k: torch.tensor(state[f"backbone.fc.{k}"], **F32) for k in ("weight", "bias")})
    objective = RTSLoss(case["dof"], case["kl_scale"])
    objective.setup(dim, classes)
    own = objective.logvar.state_dict()
    objective.logvar.load_state_dict({k: torch.tensor(state[f"logvar_rts.{k}"], dtype=own[k].dtype) for k in own})
    return head, objective


def _extra(state: dict) -> dict[str, np.ndarray]:
    out = {f"logvar.linear.{k}": np.array(state[f"logvar_rts.0.{k}"]) for k in ("weight", "bias")}
    out.update({f"logvar.bn.{k}": np.array(state[f"logvar_rts.1.{k}"])
                for k in ("weight", "bias", "running_mean", "running_var")})
    out["logvar.bn.eps"] = np.array(1e-5)
    return out


@pytest.mark.parametrize("index", range(len(GOLDEN["cases"])))
def test_an_epoch_equals_openood_rts_trainer(index):
    case = GOLDEN["cases"][index]
    head, objective = _objective(case, case["inputs"]["state"])
    params = list(head.parameters()) + list(objective.parameters())
    optimizer = torch.optim.SGD(params, 0.1, momentum=0.9, weight_decay=5.0e-4, nesterov=True)
    batches = case["inputs"]["batches"]
    total = 100 * len(batches)  # the trainer's cosine LambdaLR (num_epochs 100), its lr_min 1e-6
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1e-6 / 0.1 + (1 - 1e-6 / 0.1) * 0.5 * (
        1 + np.cos(step / total * np.pi)))
    torch.manual_seed(case["seed"])
    for b, want, want_norm in zip(batches, case["losses"], case["grad_norms"]):
        x, y = torch.tensor(b["x"], **F32), torch.tensor(b["y"])
        loss = objective.loss(head(x), x, TrainBatch(x=x, y=y))
        assert float(loss.detach()) == pytest.approx(want, rel=1e-5)
        optimizer.zero_grad()
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, objective.max_grad_norm)
        assert float(norm) == pytest.approx(want_norm, rel=1e-5)
        optimizer.step()
        schedule.step()
    assert max(case["grad_norms"]) > objective.max_grad_norm or index != 1  # case 1 clips a step
    want = case["state"]
    for k, v in head.state_dict().items():
        np.testing.assert_allclose(v.numpy(), want[f"backbone.fc.{k}"], atol=1e-6)
    for k, v in objective.logvar.state_dict().items():
        np.testing.assert_allclose(v.numpy(), want[f"logvar_rts.{k}"], atol=1e-6)


@pytest.mark.parametrize("index", range(len(GOLDEN["cases"])))
def test_scores_equal_openood_rts_postprocessor(index):
    case = GOLDEN["cases"][index]
    state, test = case["state"], np.array(case["inputs"]["test"])
    for rule in ("var", "msp"):
        det = build("rts", mode="heads", score_rule=rule)
        det.head = LinearHead(np.array(state["backbone.fc.weight"]), np.array(state["backbone.fc.bias"]))
        det.extra, det.fitted = _extra(state), True
        np.testing.assert_allclose(det.score(FeatureSet(test, None, None)), case["scores"][rule]["conf"], rtol=2e-6)
    # the objective's export reads the same arrays
    _, objective = _objective(case, state)
    exported = build("rts").export(objective)
    for k, v in _extra(state).items():
        np.testing.assert_allclose(exported[k], v, rtol=1e-7)


def test_loss_and_variance_by_hand_in_float64():
    rng = np.random.default_rng(3)
    z, var, eps, y = rng.normal(size=(4, 3)), np.exp(rng.normal(size=(4, 5))), rng.normal(size=(4, 5)), [0, 2, 1, 2]
    got = rts_loss(*(torch.tensor(a) for a in (z, var, eps)), torch.tensor(y), 5, 0.3)
    t = (var * eps ** 2).sum(1, keepdims=True) / 3
    s = z / t
    ce = np.mean(np.log(np.exp(s).sum(1)) - s[np.arange(4), y])
    kl = np.mean(0.5 * (var - np.log(var + 1e-8) - 1))
    np.testing.assert_allclose([float(v) for v in got], [ce + 0.3 * kl, ce, kl], rtol=1e-12)

    torch.manual_seed(0)
    objective = RTSLoss(dof=4)
    objective.setup(6, 2)
    objective.logvar[1].running_mean.normal_()
    objective.logvar[1].running_var.uniform_(0.5, 2)
    objective.eval()
    h = rng.normal(size=(5, 6))
    with torch.no_grad():
        want = objective.variance(torch.tensor(h, **F32)).double().numpy()
    extra = build("rts").export(objective)
    lin = h @ extra["logvar.linear.weight"].T + extra["logvar.linear.bias"]
    bn = (lin - extra["logvar.bn.running_mean"]) / np.sqrt(extra["logvar.bn.running_var"] + 1e-5)
    np.testing.assert_allclose(rts_variance(extra, h), np.exp(bn * extra["logvar.bn.weight"] + extra["logvar.bn.bias"]),
                               rtol=1e-12)
    np.testing.assert_allclose(rts_variance(extra, h), want, rtol=1e-5)


def test_edges_one_row_no_row_one_class_and_dof():
    torch.manual_seed(0)
    objective = RTSLoss(dof=3)
    objective.setup(4, 2)
    before = objective.logvar[1].running_mean.clone()
    one = torch.randn(1, 4)
    loss = objective.loss(torch.randn(1, 2), one, TrainBatch(x=one, y=torch.tensor([1])))  # batch norm: running stats
    assert np.isfinite(float(loss.detach())) and objective.logvar[1].training
    assert torch.equal(objective.logvar[1].running_mean, before)
    none = torch.zeros(0, 4)
    empty = objective.loss(torch.zeros(0, 2), none, TrainBatch(x=none, y=torch.zeros(0, dtype=torch.long)))
    assert empty.shape == ()  # an empty share: the mean of no rows, weighted 0 by the loop

    single = RTSLoss(dof=5, kl_scale=0.2)
    single.setup(4, 1)
    x = torch.randn(3, 4)
    got = single.loss(torch.randn(3, 1), x, TrainBatch(x=x, y=torch.zeros(3, dtype=torch.long)))
    assert single.last_terms["ce"] == 0.0 and float(got.detach()) == pytest.approx(0.2 * single.last_terms["kl"])

    generator = lambda: torch.Generator().manual_seed(7)  # noqa: E731 - the loop's per-step draws
    a, b = (objective.loss(torch.ones(2, 2), torch.ones(2, 4), TrainBatch(x=x, y=torch.tensor([0, 1]),
                                                                          generator=generator())) for _ in range(2))
    assert float(a.detach()) == float(b.detach())

    for dof in (2, 0):
        with pytest.raises(ValueError, match="dof"):
            build("rts", dof=dof)
        with pytest.raises(ValueError, match="dof"):
            RTSLoss(dof=dof)


def test_heads_mode_trains_clips_saves_and_scores(tmp_path, monkeypatch):
    from accelerate import Accelerator

    clipped = []
    original = Accelerator.clip_grad_norm_

    def recorded(self, parameters, max_norm, *args, **kwargs):
        clipped.append(max_norm)
        return original(self, parameters, max_norm, *args, **kwargs)

    monkeypatch.setattr(Accelerator, "clip_grad_norm_", recorded)
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(3, 6)) * 3
    y = np.repeat(np.arange(3), 40)
    train = FeatureSet(centres[y] + rng.normal(size=(120, 6)), None, y)
    test = FeatureSet(rng.normal(size=(30, 6)) * 4, None, None)
    det = build("rts", mode="heads", epochs=2, batch_size=16, warmup_epochs=0, dof=8).fit(
        train, head=LinearHead(rng.normal(size=(3, 6)), np.zeros(3)))
    assert clipped and set(clipped) == {2.5} and np.isfinite(det.history[-1]["loss"])
    features = det.transform(test).features
    np.testing.assert_allclose(det.score(test), rts_variance(det.extra, features).mean(1), rtol=1e-12)
    assert det.extra["logvar.linear.weight"].shape == (8, 6)
    again = load(det.save_pretrained(tmp_path / "rts"))
    np.testing.assert_allclose(again.score(test), det.score(test), rtol=0)
    msp = build("rts", mode="heads", score_rule="msp")
    msp.head, msp.extra, msp.fitted = det.head, det.extra, True
    logits = det.transform(test).logits
    np.testing.assert_allclose(msp.score(test), np.exp(logits).max(1) / np.exp(logits).sum(1), rtol=1e-12)
