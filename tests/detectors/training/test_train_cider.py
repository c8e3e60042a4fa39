"""CIDER against one training step of OpenOOD's own trainer (golden numbers made by golden/make_cider.py at the commit
golden/cider.json names: prototypes, both loss terms, gradients and the SGD-stepped weights), a float64 hand computation
of the losses, the edges (one row, one class, a class without rows) and the KNN score against the `knn` detector."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from detectors import FeatureSet, LinearHead, build
from detectors.training.cider import CIDERLoss
from pipelines.training import Pass, TrainBatch

GOLDEN = json.loads((Path(__file__).parent / "golden" / "cider.json").read_text())
F32 = dict(dtype=torch.float32)


def _objective(case: dict) -> CIDERLoss:
    weights = {k: torch.tensor(v, **F32) for k, v in case["inputs"]["weights"].items()}
    objective = CIDERLoss(feat_dim=weights["2.weight"].shape[0])
    objective.setup(weights["0.weight"].shape[1], case["classes"])
    objective.projection.load_state_dict(weights)
    return objective


def _two_views(case: dict) -> TrainBatch:
    views = torch.cat([torch.tensor(v, **F32) for v in case["inputs"]["views"]])
    return TrainBatch(x=views, y=torch.tensor(case["inputs"]["y"]).repeat(2))


def _calibrate(objective: CIDERLoss, x, y) -> None:
    x, y = torch.as_tensor(np.asarray(x), **F32), torch.as_tensor(np.asarray(y))
    objective.calibrate_pass(Pass(torch.zeros(len(y), 1), x, torch.arange(len(y)), y), None)


def test_golden_is_openood_at_the_recorded_commit():
    assert GOLDEN["openood_commit"].startswith("3c35632") and GOLDEN["made_by"].endswith("make_cider.py")
    params = build("cider").params
    assert {k: params[k] for k in ("proto_m", "temp", "w", "feat_dim")} == GOLDEN["defaults"]
    assert params["projection"] == "mlp" and params["k"] == 50


@pytest.mark.parametrize("index", range(len(GOLDEN["cases"])))
def test_one_step_equals_openood_cider_trainer(index):
    """Initial prototypes, loss terms, gradients and updated prototypes equal the reference's step; the SGD step the
    reference takes (nesterov, momentum 0.9, weight decay 1e-4, its warm-up lr) from our gradients gives its weights."""
    case = GOLDEN["cases"][index]
    objective = _objective(case)
    _calibrate(objective, case["inputs"]["val_x"], case["inputs"]["val_y"])
    np.testing.assert_allclose(objective.prototypes.numpy(), case["initial_prototypes"], atol=1e-6)
    batch = _two_views(case)
    objective.train()
    loss = objective.loss(None, batch.x, batch)
    assert float(loss.detach()) == pytest.approx(case["loss"], rel=1e-6)
    assert objective.last_terms["dis"] == pytest.approx(case["dis"], rel=1e-6)
    assert objective.last_terms["comp"] == pytest.approx(case["comp"], rel=1e-6)
    np.testing.assert_allclose(objective.prototypes.numpy(), case["prototypes"], atol=1e-6)
    optimizer = torch.optim.SGD(objective.projection.parameters(), case["lr"], momentum=0.9, weight_decay=1e-4,
                                nesterov=True)
    optimizer.zero_grad()
    loss.backward()
    for name, p in objective.projection.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), case["grads"][name], rtol=1e-4, atol=1e-6)
    optimizer.step()
    for name, p in objective.projection.named_parameters():
        np.testing.assert_allclose(p.detach().numpy(), case["stepped"][name], atol=1e-7)


def _unit(v):
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


def _by_hand(weights, x, y, prototypes, m=0.95, t=0.1, w=2.0):
    """float64: embeddings, the row-by-row EMA, dispersion on the updated prototypes, compactness on them."""
    hidden = np.maximum(x @ weights["0.weight"].T + weights["0.bias"], 0)
    z = _unit(hidden @ weights["2.weight"].T + weights["2.bias"])
    p = prototypes.copy()
    for zi, c in zip(z, y):
        p[c] = _unit(p[c] * m + zi * (1 - m))
    n = len(p)
    dis = 0.0
    if n > 1:
        sim = np.exp(p @ p.T / t)
        dis = t / 0.1 * np.mean(np.log((sim.sum(1) - np.diag(sim)) / (n - 1)))
    logits = z @ _unit(p).T / t
    log_prob = logits - logits.max(1, keepdims=True)
    log_prob = log_prob - np.log(np.exp(log_prob).sum(1, keepdims=True))
    comp = -t / 0.07 * np.mean(log_prob[np.arange(len(y)), y])
    return w * comp + dis, p


def test_loss_by_hand_in_float64():
    case = GOLDEN["cases"][2]
    objective = _objective(case)
    start = _unit(np.random.default_rng(3).normal(size=tuple(objective.prototypes.shape)))
    objective.prototypes = torch.tensor(start, **F32)
    batch = _two_views(case)
    weights = {k: np.asarray(v, dtype=np.float64) for k, v in case["inputs"]["weights"].items()}
    want, protos = _by_hand(weights, batch.x.double().numpy(), batch.y.numpy(), start)
    assert float(objective.loss(None, batch.x, batch).detach()) == pytest.approx(want, rel=1e-5)
    np.testing.assert_allclose(objective.prototypes.numpy(), protos, atol=1e-6)


def test_edges_one_row_one_class_and_a_class_without_rows():
    rng = np.random.default_rng(5)
    torch.manual_seed(0)
    objective = CIDERLoss(feat_dim=3)
    objective.setup(4, 3)
    _calibrate(objective, rng.normal(size=(4, 4)), [0, 0, 2, 2])  # class 1 has no row: a zero prototype
    assert np.all(objective.prototypes[1].numpy() == 0)
    np.testing.assert_allclose(np.linalg.norm(objective.prototypes.numpy()[[0, 2]], axis=1), 1, atol=1e-6)
    weights = {k: v.detach().double().numpy() for k, v in objective.projection.state_dict().items()}
    x = rng.normal(size=(1, 4))
    batch = TrainBatch(x=torch.tensor(x, **F32), y=torch.tensor([1]))  # batch of one row, of the empty class
    start = objective.prototypes.double().numpy()
    want, protos = _by_hand(weights, x, [1], start)
    loss = objective.loss(None, batch.x, batch)
    assert np.isfinite(float(loss.detach())) and float(loss.detach()) == pytest.approx(want, rel=1e-5)
    np.testing.assert_allclose(objective.prototypes.numpy(), protos, atol=1e-6)

    single = CIDERLoss(feat_dim=3)
    single.setup(4, 1)
    _calibrate(single, rng.normal(size=(3, 4)), [0, 0, 0])
    x = torch.tensor(rng.normal(size=(5, 4)), **F32)
    loss = single.loss(None, x, TrainBatch(x=x, y=torch.zeros(5, dtype=torch.long)))
    assert float(loss.detach()) == 0.0 and single.last_terms == {"comp": 0.0, "dis": 0.0}  # reference: NaN dispersion


def _toy(seed=0):
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(3, 6)) * 3
    y = np.repeat(np.arange(3), 40)
    train = FeatureSet(centres[y] + rng.normal(size=(120, 6)), None, y)
    head = LinearHead(rng.normal(size=(3, 6)), np.zeros(3))
    return train, head, FeatureSet(rng.normal(size=(30, 6)) * 4, None, None)


def test_heads_mode_scores_minus_the_squared_knn_distance_of_the_frozen_features():
    """Heads mode trains the projection only: the score is -(k-th squared distance) on the frozen normalised features,
    i.e. minus the square of the `knn` detector's score; the projection trained and its weights are state."""
    train, head, test = _toy()
    det = build("cider", mode="heads", epochs=2, batch_size=16, warmup_epochs=0, k=7).fit(train, head=head)
    knn = build("knn", k=7).fit(train)
    np.testing.assert_allclose(det.score(test), -knn.score(test) ** 2, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(det.head.weight, head.weight)  # the closed-set head gets no gradient
    assert det.extra["projection.2.weight"].shape == (128, 6) and det.extra["bank"].shape == (120, 6)
    assert np.isfinite(det.history[-1]["loss"])
    with pytest.raises(ValueError, match="k=500 must be between 1 and the number of ID-train rows 120"):
        build("cider", mode="heads", epochs=1, k=500).fit(train, head=head).score(test)


def test_saved_and_loaded_scores_the_same(tmp_path):
    train, head, test = _toy(1)
    det = build("cider", mode="heads", epochs=1, batch_size=32, warmup_epochs=0, k=5).fit(train, head=head)
    det.save_pretrained(tmp_path / "cider")
    again = type(det).from_pretrained(tmp_path / "cider")
    np.testing.assert_array_equal(again.score(test), det.score(test))


@pytest.mark.slow
def test_cider_through_the_runner(digits, single_torch_thread, tmp_path):
    """A 2-epoch heads-mode CIDER unit of an evaluation run (protocol openood_v1.5: the last epoch, there is no ID-val
    accuracy to choose by) scores as the detector trained by hand on the run's own feature caches, and as minus the
    square of `knn` (k 50) on them: heads mode leaves the backbone's features as they are."""
    from detectors.harness.evaluate import run_config
    from detectors.harness.plan import make_plan
    from detectors.metrics import evaluate
    from pipelines.features import FeatureCache

    id_dir, ood_dir, model = digits
    plan = make_plan({"model": str(model), "id": str(id_dir), "out": str(tmp_path / "run"),
                      "ood": [{"manifest": str(ood_dir), "sets": ["digits_6_9"]}],
                      "detectors": [{"name": "cider", "params": {"epochs": 2, "mode": "heads"}}]})
    results = run_config(plan)

    def cache(role, name):
        [split] = [s for s in plan.splits if (s.role, s.name) == (role, name)]
        [path] = plan.cache_dir.glob(f"{split.id}-*.safetensors")
        return FeatureCache.load(path)

    train = cache("id", "id_train")
    val, test, near = (cache(role, name).to_featureset() for role, name in
                       (("id", "id_val"), ("id", "id_test"), ("ood", "digits_6_9")))
    trained = build("cider", mode="heads", epochs=2).fit(train.to_featureset(), head=train.head(), id_val=val)
    assert len(trained.history) == 2 and all(np.isfinite(h["loss"]) for h in trained.history)
    expect = evaluate(trained.score(test), trained.score(near))
    knn = build("knn", k=50).fit(train.to_featureset())
    np.testing.assert_allclose(trained.score(near), -knn.score(near) ** 2, rtol=1e-5, atol=1e-6)
    [row] = results[results.method == "cider"].to_dict("records")
    assert row["family"] == "training" and row["mode"] == "heads"
    assert row["auroc"] == pytest.approx(expect["auroc"], abs=1e-9) and row["fpr95"] == pytest.approx(expect["fpr95"],
                                                                                                      abs=1e-9)


def test_postprocessor_scores_equal_openood():
    """The score rule equals CIDERPostprocessor's (faiss IndexFlatL2, -D[:, K-1]) on the same normalised features."""
    from detectors.training.embedding import unit_rows

    ref = GOLDEN["postprocessor"]
    det = build("cider", mode="heads", k=ref["k"])
    det.extra = det.fit_rule(unit_rows(np.float32(ref["train_x"])), np.zeros(len(ref["train_x"]), dtype=int))
    np.testing.assert_allclose(det.rule_scores(unit_rows(np.float32(ref["test_x"]))), ref["scores"], atol=1e-6)
