"""ASCOOD against one step of OpenOOD's own trainer (golden numbers made by golden/make_ascood.py at the commit
golden/ascood.json names: the input gradient, the synthesised outliers, the shuffle draws, the loss, the weights after
the trainer's SGD step, the SCALE and MSP scores of the evaluation), the gradient of the z-scored head, the outliers and
both losses in float64 by hand, and the edges (a batch of one row, one class, p_inv 0 and 1, the model's mode)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from detectors import FeatureSet, LinearHead, build
from detectors.training.ascood import (
    ASCOODLoss,
    alpha_at,
    gradient_outliers,
    input_gradient,
    shuffle_outliers,
    z_std64,
)
from pipelines.training import TrainBatch
from pipelines.training.loop import _HeadsOnly, _Step

GOLDEN_DIR = Path(__file__).parent / "golden"
GOLDEN = json.loads((GOLDEN_DIR / "ascood.json").read_text())
_spec = importlib.util.spec_from_file_location("golden_tiny_ascood", GOLDEN_DIR / "tiny.py")
tiny = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tiny)
F64 = dict(dtype=torch.float64)


def test_golden_is_openood_at_the_recorded_commit():
    assert GOLDEN["openood_commit"].startswith("3c35632") and GOLDEN["made_by"].endswith("make_ascood.py")
    params = build("ascood").params
    assert {k: params[k] for k in GOLDEN["defaults"]} == GOLDEN["defaults"]
    assert params["score_rule"] == "scale" and params["percentile"] == 85
    assert GOLDEN["cases"]["one_class"]["loss"] == 0.0 and GOLDEN["cases"]["logistic"]["alpha"] == 15.5


def _case_inputs(case: dict) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = tiny.batch()
    return x[: case["rows"]].clone(), y[: case["rows"]] % case["classes"]


@pytest.mark.parametrize("name", sorted(GOLDEN["cases"]))
def test_one_step_equals_openood_ascood_trainer(name):
    """Same gradient, outliers, loss, weights after one step of the reference's SGD (two groups: fc at fc_lr_factor x
    lr; nesterov; its cosine LambdaLR is 1 at step 0) through the loop's own `_Step`, and the evaluation's scores."""
    case = GOLDEN["cases"][name]
    args, opt, classes, width = case["trainer_args"], case["optimizer"], case["classes"], case["width"]
    net = tiny.TinyNet(classes=classes, width=width)
    tiny.state_from_json(net, case["init"])
    objective = ASCOODLoss(args["w"], args["sigma"], args["p_inv"], args["ood_type"], args["alpha_min"],
                           args["alpha_max"], args["kl_div"], epochs=opt["num_epochs"])
    objective.bind_head(net.fc)
    torch.manual_seed(100 + case["seed"])  # the trainer's MLP is drawn right after the network (make_ascood.py)
    tiny.TinyNet(classes=classes, width=width)
    objective.setup(width, classes)
    if case["logistic_init"] is not None:
        for key, value in objective.logistic_regression.state_dict().items():
            want = case["logistic_init"][key]
            assert float(value.double().sum()) == pytest.approx(want["sum"], rel=1e-5, abs=1e-5)
            np.testing.assert_allclose(value.flatten()[:4].numpy(), want["first"], rtol=1e-6)
    x, y = _case_inputs(case)
    model = tiny.AsClassifier(net)
    step = _Step(model, objective)
    step.train()

    def batch() -> TrainBatch:
        return TrainBatch(x=x, y=y, generator=torch.Generator().manual_seed(case["seed"]),
                          epoch=case["epoch_idx"] - 1)

    if "grad" in case:
        grad = input_gradient(model, objective.training_logits, x, y)
        np.testing.assert_allclose(grad.numpy(), case["grad"], rtol=1e-5, atol=1e-7)
    if case["draws"]:
        draws = torch.rand(np.shape(case["draws"][0]), generator=torch.Generator().manual_seed(case["seed"]))
        np.testing.assert_array_equal(draws.numpy(), np.array(case["draws"][0], dtype=np.float32))
    np.testing.assert_allclose(objective.outliers(model, batch()).numpy(), case["ood"], rtol=1e-5, atol=1e-6)
    assert model.training and net.bn.training  # the gradient pass put the model back in training mode
    params = list(net.parameters())
    extra = list(objective.logistic_regression.parameters()) if not args["kl_div"] else []
    optimizer = torch.optim.SGD([{"params": params[:-2] + extra},
                                 {"params": params[-2:], "lr": opt["fc_lr_factor"] * opt["lr"]}], opt["lr"],
                                momentum=opt["momentum"], weight_decay=opt["weight_decay"], nesterov=opt["nesterov"])
    loss = step(batch())
    assert float(loss.detach()) == pytest.approx(case["loss"], rel=1e-6, abs=1e-7)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    for key, value in net.state_dict().items():
        np.testing.assert_allclose(value.double().numpy(), np.array(case["updated"][key]), atol=2e-6, err_msg=key)
    if extra:
        for key, value in objective.logistic_regression.state_dict().items():
            np.testing.assert_allclose(value.numpy(), case["logistic"][key], atol=2e-6, err_msg=key)
    net.eval()
    with torch.no_grad():
        features = net(x, return_feature=True)[1].double().numpy()
    np.testing.assert_allclose(features, case["eval_features"], rtol=1e-5, atol=1e-6)
    det = build("ascood", mode="heads", sigma=args["sigma"])
    det.head = LinearHead(net.fc.weight.detach().double().numpy(), net.fc.bias.detach().double().numpy())
    det.fitted = True
    seen = FeatureSet(np.array(case["eval_features"]), None, None)
    np.testing.assert_allclose(det.score(seen), case["scale_scores"], rtol=1e-5, atol=1e-5)
    det.params["score_rule"] = "msp"
    np.testing.assert_allclose(det.score(seen), case["msp"], rtol=1e-5, atol=1e-6)


def test_input_gradient_of_the_z_scored_head_by_hand():
    """d/dx of a . z(x), a = sigma W[y]: (a - mean a) / (s + eps) - (a . u) u / ((D - 1) s (s + eps)^2), u = x - mean
    x, s the Bessel std; float64 throughout."""
    rng = np.random.default_rng(0)
    d, sigma = 7, 0.5
    head = torch.nn.Linear(d, 3).double()
    objective = ASCOODLoss(sigma=sigma, epochs=1)
    objective.bind_head(head)
    x, y = rng.normal(size=(5, d)), np.array([0, 2, 1, 1, 0])
    got = input_gradient(_HeadsOnly(head), objective.training_logits, torch.tensor(x), torch.tensor(y)).numpy()
    a = sigma * head.weight.detach().numpy()[y]
    u = x - x.mean(1, keepdims=True)
    s = x.std(1, ddof=1, keepdims=True)
    want = ((a - a.mean(1, keepdims=True)) / (s + 1e-6)
            - (a * u).sum(1, keepdims=True) * u / ((d - 1) * s * (s + 1e-6) ** 2))
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def test_outliers_by_hand():
    rng = np.random.default_rng(1)
    x, grad = rng.normal(size=(3, 2, 4, 5)), rng.normal(size=(3, 2, 4, 5))
    # gradient: the int(40 * 0.2) = 8 entries of largest |grad| per row move by alpha * grad
    got = gradient_outliers(torch.tensor(x), torch.tensor(grad), 0.2, 3.0).numpy()
    want = x.reshape(3, -1).copy()
    for row in range(3):
        top = np.argsort(-np.abs(grad[row].ravel()), kind="stable")[:8]
        want[row, top] += 3.0 * grad[row].ravel()[top]
    np.testing.assert_allclose(got.reshape(3, -1), want, rtol=1e-12)
    # shuffle: the int(20 * 0.25) = 5 positions of largest sum_c exp(grad), permuted by argsort of the draws
    got = shuffle_outliers(torch.tensor(x), torch.tensor(grad), 0.25, torch.Generator().manual_seed(3)).numpy()
    draws = torch.rand(3, 5, generator=torch.Generator().manual_seed(3)).numpy()
    want = x.reshape(3, 2, -1).copy()
    for row in range(3):
        top = np.argsort(-np.exp(grad[row]).sum(0).ravel(), kind="stable")[:5]
        order = np.argsort(draws[row], kind="stable")
        want[row][:, top] = x.reshape(3, 2, -1)[row][:, top[order]]
    np.testing.assert_array_equal(got.reshape(3, 2, -1), want)


@pytest.mark.parametrize("kl_div", [True, False])
def test_both_losses_by_hand_in_float64(kl_div):
    rng = np.random.default_rng(2)
    torch.manual_seed(0)
    head = torch.nn.Linear(6, 4)
    objective = ASCOODLoss(w=2.5, sigma=0.7, kl_div=kl_div, epochs=1)
    objective.bind_head(head)
    objective.setup(6, 4)
    h, y = rng.normal(size=(10, 6)).astype(np.float32), np.array([0, 1, 2, 3, 1])
    got = objective.loss(torch.zeros(10, 4), torch.tensor(h), TrainBatch(x=torch.zeros(5, 6), y=torch.tensor(y)))
    w, b = head.weight.detach().double().numpy(), head.bias.detach().double().numpy()
    z = 0.7 * z_std64(h.astype(np.float64)) @ w.T + b
    lse = np.log(np.exp(z).sum(1))
    ce = np.mean(lse[:5] - z[np.arange(5), y])
    if kl_div:  # KL(uniform || p) summed over classes, mean over the outlier rows
        ood = np.mean(np.sum(0.25 * (np.log(0.25) - (z[5:] - lse[5:, None])), axis=1))
    else:
        mlp = {k: v.detach().double().numpy() for k, v in objective.logistic_regression.state_dict().items()}
        hidden = np.maximum(lse[:, None] @ mlp["0.weight"].T + mlp["0.bias"], 0)
        out = hidden @ mlp["2.weight"].T + mlp["2.bias"]
        target = np.r_[np.ones(5), np.zeros(5)].astype(int)
        ood = np.mean(np.log(np.exp(out).sum(1)) - out[np.arange(10), target])
    assert float(got.detach()) == pytest.approx(ce + 2.5 * ood, rel=1e-5)


def test_alpha_goes_from_alpha_max_to_alpha_min():
    assert alpha_at(0, 100, 5.0, 20.0) == pytest.approx(15 * 0.99 + 5)
    assert alpha_at(29, 100, 5.0, 20.0) == pytest.approx(15.5)  # the golden `logistic` case's epoch 30
    assert alpha_at(99, 100, 5.0, 20.0) == 5.0


def test_edges_nothing_to_destroy_everything_shuffled_and_the_model_untouched():
    rng = np.random.default_rng(3)
    x, grad = torch.tensor(rng.normal(size=(1, 3, 2, 2))), torch.tensor(rng.normal(size=(1, 3, 2, 2)))
    assert torch.equal(gradient_outliers(x, grad, 0.05, 10.0), x)  # int(12 * 0.05) = 0 entries
    assert torch.equal(shuffle_outliers(x, grad, 0.1), x)  # int(4 * 0.1) = 0 positions
    every = shuffle_outliers(x, grad, 1.0, torch.Generator().manual_seed(0))
    pixels = x.reshape(3, 4).T.tolist()
    assert sorted(every.reshape(3, 4).T.tolist()) == sorted(pixels)  # whole pixels (all channels) moved together
    # one-row batch of one class through a batch-norm network: finite, the running stats untouched by the gradient
    net = tiny.TinyNet(classes=1)
    model = tiny.AsClassifier(net)
    objective = ASCOODLoss(ood_type="shuffle", epochs=1)
    objective.bind_head(net.fc)
    objective.setup(4, 1)
    model.train()
    batch = TrainBatch(x=tiny.batch()[0][:1], y=torch.tensor([0]), generator=torch.Generator().manual_seed(0))
    before = {k: v.clone() for k, v in net.state_dict().items()}
    inputs = objective.model_inputs(model, batch)
    assert inputs.shape[0] == 2 and model.training
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())
    assert all(p.grad is None for p in net.parameters())  # the gradient pass fills no parameter's .grad
    logits, features = model(inputs)
    # one class: CE 0, KL to the one-class uniform 0
    assert float(objective.loss(logits, features, batch).detach()) == 0.0
    with pytest.raises(ValueError, match="ood_type"):
        ASCOODLoss(ood_type="gaussian", epochs=1)


def test_heads_mode_trains_and_scores_scale_on_the_raw_features():
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(3, 8)) * 3
    y = np.repeat(np.arange(3), 30)
    train = FeatureSet(np.abs(centres[y] + rng.normal(size=(90, 8))), None, y)
    test = FeatureSet(np.abs(rng.normal(size=(20, 8)) * 3), None, None)
    for ood_type in ("gradient", "shuffle"):
        det = build("ascood", mode="heads", epochs=2, batch_size=16, warmup_epochs=0, ood_type=ood_type,
                    kl_div=ood_type == "shuffle").fit(train, head=LinearHead(rng.normal(size=(3, 8)), np.zeros(3)))
        seen = det.transform(test)
        np.testing.assert_array_equal(seen.features, test.features)  # the raw features, as ASCOODNet returns them
        np.testing.assert_allclose(seen.logits, det.trained_head(0.5 * z_std64(test.features)), rtol=1e-12)
        scale = build("scale", percentile=85).fit(det.transform(train), head=det.trained_head)
        np.testing.assert_allclose(det.score(test), scale.score(seen), rtol=1e-5, atol=1e-4)  # SCALE: float32
        assert np.isfinite(det.history[-1]["loss"])


def test_the_loop_hands_each_step_its_epoch(monkeypatch):
    """alpha follows the run's epochs: the loop's batches carry their epoch (`TrainBatch.epoch`)."""
    import detectors.training.ascood as ascood

    seen = []
    monkeypatch.setattr(ascood, "alpha_at", lambda epoch, epochs, lo, hi: seen.append((epoch, epochs)) or 1.0)
    rng = np.random.default_rng(1)
    train = FeatureSet(rng.normal(size=(32, 5)), None, np.arange(32) % 2)
    build("ascood", mode="heads", epochs=3, batch_size=16, warmup_epochs=0).fit(
        train, head=LinearHead(rng.normal(size=(2, 5)), np.zeros(2)))
    assert seen == [(0, 3), (0, 3), (1, 3), (1, 3), (2, 3), (2, 3)]


DDP_SCRIPT = """
import json, os, sys, torch
from torch import nn
from pipelines.classifier import ImageClassifier
from pipelines.data import read_manifest
from pipelines.training import finetune
from detectors.training.ascood import ASCOODLoss
torch.set_num_threads(1)
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 4, 3, bias=False), nn.BatchNorm2d(4), nn.ReLU(),
                                  nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(4, 3)
    def forward(self, x):
        h = self.body(x)
        return self.fc(h), h
torch.manual_seed(0)
clf = ImageClassifier.from_module(Net(), image_size=16)
objective = ASCOODLoss(alpha_min=1.0, alpha_max=3.0, kl_div=False, epochs=2)
result = finetune(clf, read_manifest(sys.argv[1]), epochs=2, batch_size=4, lr=1e-2, warmup_epochs=0, seed=0,
                  objective=objective)
state = {k: v.double().flatten().tolist() for k, v in clf.model.state_dict().items() if v.is_floating_point()}
state.update({k: v.double().flatten().tolist() for k, v in objective.logistic_regression.state_dict().items()})
with open(os.path.join(sys.argv[2], f"ascood{os.environ['RANK']}.json"), "w") as fh:
    json.dump({"steps": result.steps, "loss": [h["loss"] for h in result.history], "state": state}, fh)
if torch.distributed.is_initialized():
    torch.distributed.barrier()
    sys.stdout.flush(); sys.stderr.flush()
    os._exit(0)
"""


@pytest.mark.slow
def test_two_processes_match_one(tmp_path):
    """torchrun with 2 CPU processes, each half of every batch: the input-gradient pass runs inside the distributed
    step without touching its gradient hooks, and the weights (network, energy MLP) equal the one-process run's."""
    import os
    import subprocess
    import sys

    from PIL import Image

    from pipelines.data import make_row, write_manifest

    rng, rows, folder = np.random.default_rng(0), [], tmp_path / "data"
    folder.mkdir()
    for label, colour in enumerate([(200, 30, 30), (30, 200, 30), (30, 30, 200)]):
        for i in range(8):
            pixels = np.clip(np.array(colour)[None, None] + rng.integers(-25, 25, size=(16, 16, 3)), 0, 255)
            Image.fromarray(pixels.astype(np.uint8)).save(folder / f"{label}_{i}.png")
            rows.append(make_row(f"{label}_{i}.png", split="train", label=label))
    manifest = write_manifest(folder, rows)
    script = tmp_path / "ddp.py"
    script.write_text(DDP_SCRIPT)
    root = Path(__file__).parents[3]
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONPATH"] = str(root)
    solo = subprocess.run([sys.executable, str(script), str(manifest.root), str(tmp_path)], capture_output=True,
                          text=True, timeout=240, cwd=root, env={**env, "RANK": "solo"})
    assert solo.returncode == 0, solo.stderr[-2000:]
    duo = subprocess.run([str(Path(sys.executable).with_name("torchrun")), "--standalone", "--nproc_per_node", "2",
                          str(script), str(manifest.root), str(tmp_path)], capture_output=True, text=True, timeout=240,
                         cwd=root, env=env)
    assert duo.returncode == 0, duo.stderr[-3000:]
    one = json.loads((tmp_path / "ascoodsolo.json").read_text())
    two = [json.loads((tmp_path / f"ascood{rank}.json").read_text()) for rank in (0, 1)]
    assert two[0] == two[1] and two[0]["steps"] == one["steps"] == 12
    np.testing.assert_allclose(two[0]["loss"], one["loss"], rtol=1e-5)
    for name, values in one["state"].items():
        np.testing.assert_allclose(two[0]["state"][name], values, rtol=1e-4, atol=1e-6, err_msg=name)
