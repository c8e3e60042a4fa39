"""Mixup, CutMix, RegMixup, T2FNorm and ISH against OpenOOD's own trainers: one step of each on a tiny network
(golden numbers made by golden/make_openood_trainers.py from OpenOOD 3c35632) with the reference's draws fixed, the
T2FNorm postprocessor's scores and ISH's shapings, then each loss in float64 by hand, the edges (batch of 1, a single
class, lam 0 and 1) and the draws."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from detectors import FeatureSet, LinearHead, build
from detectors.training.cutmix import CutMixLoss, CutPairs, box_at, kept_area, paste, rand_bbox
from detectors.training.ish import ISHLoss, shaped
from detectors.training.mixup import MixPairs, MixupLoss, blend, draw_pairs
from detectors.training.regmixup import RegMixupLoss
from detectors.training.t2fnorm import T2FNormLoss
from pipelines.training import TrainBatch
from pipelines.training.loop import _Step

GOLDEN = Path(__file__).parent / "golden"
_spec = importlib.util.spec_from_file_location("golden_tiny", GOLDEN / "tiny.py")
tiny = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tiny)
CASES = json.loads((GOLDEN / "openood_trainers.json").read_text())
META, CASES = CASES["meta"], CASES["cases"]


def _draws(case: dict) -> dict:
    return {name: value for name, value in case["draws"]}


def _fixed(objective, pairs):
    objective.draw = lambda batch: pairs
    return objective


def _objective(name: str, case: dict, net):
    """Our objective for a golden case, its draw fixed to the one the reference made."""
    args, draws = case["trainer_args"], _draws(case)
    if name == "t2fnorm":
        objective = T2FNormLoss(args["tau"])
        objective.bind_head(net.fc)
        return objective
    if name == "ish":
        objective = ISHLoss(args["mode"], args["param"])
        objective.bind_head(net.fc)
        return objective
    index = torch.tensor(draws["randperm"]) if "randperm" in draws else None
    lam = draws.get("beta", 1.0)
    if name.startswith("mixup"):
        return _fixed(MixupLoss(args["alpha"]), MixPairs(index, lam))
    if name.startswith("regmixup"):
        return _fixed(RegMixupLoss(args["alpha"]), MixPairs(index, lam))
    objective = CutMixLoss(args["beta"], args["cutmix_prob"])
    if index is None:
        return _fixed(objective, None)
    size = tuple(tiny.batch()[0].shape)
    randint = [v for k, v in case["draws"] if k == "randint"]
    box = box_at(size, lam, *randint)
    return _fixed(objective, CutPairs(index, kept_area(size, box), box))


@pytest.mark.parametrize("name", sorted(CASES))
def test_one_step_matches_openood_trainer(name):
    """Same (mixed) inputs, loss and weights after one SGD step (the reference's optimiser: lr 0.1, momentum 0.9,
    nesterov, weight decay 5e-4, ISH's fc 5e-5; its cosine LambdaLR is 1 at step 0) through the loop's own `_Step`."""
    case = CASES[name]
    net = tiny.TinyNet(width=case["width"])
    tiny.state_from_json(net, case["init"])
    step = _Step(tiny.AsClassifier(net), _objective(name, case, net))
    step.train()
    x, y = tiny.batch()
    batch = TrainBatch(x=x, y=y)
    opt = case["optimizer"]
    params = list(net.parameters())
    groups = ([{"params": params[:-2]}, {"params": params[-2:], "weight_decay": opt["weight_decay_fc"]}]
              if "weight_decay_fc" in opt else params)
    optimizer = torch.optim.SGD(groups, opt["lr"], momentum=opt["momentum"], weight_decay=opt["weight_decay"],
                                nesterov=True)
    np.testing.assert_allclose(step.objective.inputs(batch).double().numpy(), np.array(case["input"]), atol=1e-6)
    loss = step(batch)
    assert float(loss.detach()) == pytest.approx(case["loss"], rel=1e-6, abs=1e-7)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    for key, value in net.state_dict().items():
        np.testing.assert_allclose(value.double().numpy(), np.array(case["updated"][key]), atol=2e-6, err_msg=key)


def test_golden_cases_cover_the_branches():
    assert META["openood_commit"].startswith("3c35632")
    assert "beta" not in _draws(CASES["mixup_alpha0"]) and "beta" not in _draws(CASES["regmixup_alpha0"])  # lam 1
    assert "randperm" not in _draws(CASES["cutmix_unmixed"])  # r >= cutmix_prob: plain CE
    assert len(CASES["regmixup"]["input"]) == 2 * tiny.N  # clean + mixed, one pass
    assert int(CASES["ish"]["width"] * (1 - CASES["ish"]["trainer_args"]["param"])) == 3  # 3 of 20 features kept


def test_ish_changes_only_the_head_weight_gradient():
    """Against plain CE on the same step: the same loss, bias and backbone gradients, another fc.weight gradient."""
    case = CASES["ish"]
    grads = []
    for objective in ("ish", "ce"):
        net = tiny.TinyNet(width=case["width"])
        tiny.state_from_json(net, case["init"])
        x, y = tiny.batch()
        logits, h = net(x, return_feature=True)
        if objective == "ish":
            ish = ISHLoss()
            ish.bind_head(net.fc)
            loss = ish.loss(logits, h, TrainBatch(x=x, y=y))
        else:
            loss = torch.nn.functional.cross_entropy(logits, y)
        loss.backward()
        grads.append((float(loss.detach()), {k: p.grad.clone() for k, p in net.named_parameters()}))
    (ish_loss, ish_grads), (ce_loss, ce_grads) = grads
    assert ish_loss == ce_loss
    for key in ish_grads:
        same = torch.allclose(ish_grads[key], ce_grads[key], atol=1e-7)
        assert same == (key != "fc.weight"), key


@pytest.mark.parametrize("key", sorted(CASES["ish"]["shaping"]["shaped"]))
def test_ish_shaping_matches_reference(key):
    mode, param = key.split("@")
    rows = torch.tensor(CASES["ish"]["shaping"]["rows"], dtype=torch.float32)
    np.testing.assert_allclose(shaped(rows, mode, float(param)).double().numpy(),
                               np.array(CASES["ish"]["shaping"]["shaped"][key]), rtol=1e-6, atol=1e-7)


def test_ish_shaping_by_hand_and_edges():
    x = np.array([[3.0, -1.0, 0.5, 2.0, 0.0], [0.2, 0.1, 0.4, 0.3, 0.0]])
    got = shaped(torch.as_tensor(x), "minksample_expscale", 0.6).numpy()  # k = int(5 * 0.4) = 2
    want = np.zeros_like(x)
    for i, row in enumerate(x):
        top = np.argsort(-np.abs(row))[:2]
        want[i, top] = np.abs(row[top]) * np.exp(row.sum() / np.abs(row[top]).sum())
    np.testing.assert_allclose(got, want, rtol=1e-12)
    one = shaped(torch.as_tensor(x[:1]), "minksample_lnscale", 0.0).numpy()  # batch of 1, nothing pruned
    np.testing.assert_allclose(one, np.abs(x[:1]) * x[0].sum() / np.abs(x[0]).sum(), rtol=1e-12)  # |x|, signed s1
    positive = shaped(torch.as_tensor(x[1:]), "minksample_lnscale", 0.0).numpy()  # x >= 0: s1 = s2, unchanged
    np.testing.assert_allclose(positive, x[1:], rtol=1e-12)
    with pytest.raises(ValueError, match="keeps int"):
        shaped(torch.ones(2, 4), "minksample_expscale", 0.85)  # int(4 * 0.15) = 0: the reference divides by 0
    with pytest.raises(ValueError, match="in \\[0, 1\\)"):
        ISHLoss(param=1.0)
    single = ISHLoss(param=0.5)  # a single class: CE 0, zero gradients
    head = torch.nn.Linear(4, 1)
    single.bind_head(head)
    loss = single.loss(None, torch.rand(3, 4), TrainBatch(x=torch.zeros(3, 4), y=torch.zeros(3, dtype=torch.long)))
    loss.backward()
    assert float(loss.detach()) == 0.0 and not head.weight.grad.any()


def test_t2fnorm_scores_match_the_postprocessor():
    """MSP of fc(h / tau) (and fc(h) on the 1000-class branch) with the trained head, on the eval-mode features."""
    case = CASES["t2fnorm"]
    head = LinearHead(np.array(case["updated"]["fc.weight"]), np.array(case["updated"]["fc.bias"]))
    features = FeatureSet(features=np.array(case["eval_features"]))
    for scale, key in (("auto", "scores"), ("tau", "scores"), ("none", "scores_1000")):
        det = build("t2fnorm", mode="heads", inference_scale=scale)
        det.head, det.fitted = head, True
        np.testing.assert_allclose(det.score(features), case[key], rtol=1e-5, atol=1e-6)
    det = build("t2fnorm", mode="heads")
    det.head, det.fitted = LinearHead(np.zeros((1000, 2)), np.zeros(1000)), True
    assert np.array_equal(det.scored_features(np.ones((1, 2))), np.ones((1, 2)))  # auto: 1000 classes read h


def test_t2fnorm_loss_by_hand_and_validation_logits():
    rng = np.random.default_rng(11)
    h, y = rng.normal(size=(5, 4)), rng.integers(0, 3, 5)
    head = torch.nn.Linear(4, 3)
    objective = T2FNormLoss(tau=0.25)
    with pytest.raises(RuntimeError, match="bind_head"):
        objective.loss(None, torch.zeros(1, 4), TrainBatch(x=torch.zeros(1, 4), y=torch.zeros(1, dtype=torch.long)))
    objective.bind_head(head)
    w, b = head.weight.detach().double().numpy(), head.bias.detach().double().numpy()
    z = (h / np.linalg.norm(h, axis=1, keepdims=True) / 0.25) @ w.T + b
    got = objective.loss(None, torch.as_tensor(h, dtype=torch.float32), TrainBatch(x=torch.zeros(5, 4),
                                                                                   y=torch.as_tensor(y)))
    assert float(got.detach()) == pytest.approx(float(_ce(z, y).mean()), rel=1e-5)
    val = objective.heads(None, torch.as_tensor(h, dtype=torch.float32))["label"]
    np.testing.assert_allclose(val.detach().double().numpy(), z, rtol=1e-5, atol=1e-5)
    assert "head" not in dict(objective.named_modules()) and not list(objective.parameters())  # not registered twice


@pytest.mark.parametrize("item", CASES["cutmix"]["boxes"], ids=lambda b: f"lam{b['lam']}-{b['cx']}-{b['cy']}")
def test_box_matches_rand_bbox(item):
    assert list(box_at((4, 3, 6, 5), item["lam"], item["cx"], item["cy"])) == item["box"]


# -- float64 by hand -----------------------------------------------------------------------------------------------
def _log_softmax(z):
    z = z - z.max(1, keepdims=True)
    return z - np.log(np.exp(z).sum(1, keepdims=True))


def _ce(z, y):
    return -_log_softmax(z)[np.arange(len(y)), y]


def _random(n, k, seed):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, k)) * 3, rng.integers(0, k, n)


@pytest.mark.parametrize("lam", [0.0, 0.37, 1.0])
@pytest.mark.parametrize("n, k", [(1, 4), (6, 4), (5, 1)])
def test_mixup_loss_by_hand(lam, n, k):
    z, y = _random(n, k, 3)
    index = np.random.default_rng(4).permutation(n)
    objective = _fixed(MixupLoss(), MixPairs(torch.as_tensor(index), lam))
    batch = TrainBatch(x=torch.zeros(n, 2), y=torch.as_tensor(y))
    objective.inputs(batch)
    got = float(objective.loss(torch.as_tensor(z, dtype=torch.float32), torch.zeros(n, 2), batch))
    soft = lam * np.eye(k)[y] + (1 - lam) * np.eye(k)[y[index]]
    assert got == pytest.approx(float(-(soft * _log_softmax(z)).sum(1).mean()), rel=1e-5, abs=1e-6)
    if k == 1:
        assert got == pytest.approx(0.0, abs=1e-7)


@pytest.mark.parametrize("lam", [0.0, 0.61, 1.0])
@pytest.mark.parametrize("n, k", [(1, 3), (7, 3), (4, 1)])
def test_regmixup_loss_by_hand(lam, n, k):
    z, y = _random(2 * n, k, 5)
    index = np.random.default_rng(6).permutation(n)
    objective = _fixed(RegMixupLoss(), MixPairs(torch.as_tensor(index), lam))
    batch = TrainBatch(x=torch.zeros(n, 2), y=torch.as_tensor(y[:n]))
    assert objective.inputs(batch).shape == (2 * n, 2)
    got = float(objective.loss(torch.as_tensor(z, dtype=torch.float32), torch.zeros(2 * n, 2), batch))
    clean = _ce(z[:n], y[:n])
    mixed = lam * _ce(z[n:], y[:n]) + (1 - lam) * _ce(z[n:], y[:n][index])
    assert got == pytest.approx(float((clean.sum() + mixed.sum()) / (2 * n)), rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("lam", [0.0, 0.44, 1.0])
@pytest.mark.parametrize("n, k", [(1, 3), (6, 3), (3, 1)])
def test_cutmix_loss_by_hand(lam, n, k):
    z, y = _random(n, k, 7)
    index = np.random.default_rng(8).permutation(n)
    objective = _fixed(CutMixLoss(), CutPairs(torch.as_tensor(index), lam, (0, 0, 1, 1)))
    batch = TrainBatch(x=torch.zeros(n, 1, 2, 2), y=torch.as_tensor(y))
    objective.inputs(batch)
    got = float(objective.loss(torch.as_tensor(z, dtype=torch.float32), torch.zeros(n, 2), batch))
    want = lam * _ce(z, y).mean() + (1 - lam) * _ce(z, y[index]).mean()
    assert got == pytest.approx(float(want), rel=1e-5, abs=1e-6)


def test_paste_and_kept_area():
    x = torch.arange(2 * 1 * 4 * 5, dtype=torch.float32).reshape(2, 1, 4, 5)
    pairs = CutPairs(torch.tensor([1, 0]), kept_area(x.shape, (1, 2, 3, 5)), (1, 2, 3, 5))
    out = paste(x, pairs)
    want = x.clone()
    want[0, :, 1:3, 2:5], want[1, :, 1:3, 2:5] = x[1, :, 1:3, 2:5], x[0, :, 1:3, 2:5]
    assert torch.equal(out, want) and not torch.equal(out, x)
    assert pairs.lam == pytest.approx(1 - 6 / 20)
    assert kept_area(x.shape, (0, 0, 4, 5)) == 0.0 and kept_area(x.shape, (2, 2, 2, 5)) == 1.0
    feats = torch.randn(3, 4)  # no spatial layout (heads mode): the blend with the same lam
    assert torch.allclose(paste(feats, CutPairs(torch.tensor([2, 0, 1]), 0.25)),
                          0.25 * feats + 0.75 * feats[[2, 0, 1]])


def test_draws_are_seeded_and_in_range():
    one, two = (draw_pairs(8, 0.2, torch.Generator().manual_seed(3)) for _ in range(2))
    assert torch.equal(one.index, two.index) and one.lam == two.lam and 0 <= one.lam <= 1
    assert sorted(one.index.tolist()) == list(range(8))
    assert draw_pairs(5, 0.0, torch.Generator().manual_seed(0)).lam == 1.0
    x = torch.randn(3, 2)
    assert torch.equal(blend(x, MixPairs(torch.tensor([0, 1, 2]), 0.3)), 0.3 * x + 0.7 * x)  # batch-of-1 style no-op
    box = rand_bbox((2, 3, 6, 5), 0.5, torch.Generator().manual_seed(0))
    assert 0 <= box[0] <= box[2] <= 6 and 0 <= box[1] <= box[3] <= 5
    never = CutMixLoss(beta=1.0, cutmix_prob=0.0)
    batch = TrainBatch(x=torch.randn(2, 1, 3, 3), y=torch.tensor([0, 1]), generator=torch.Generator().manual_seed(0))
    assert torch.equal(never.inputs(batch), batch.x) and never._pairs is None
    assert CutMixLoss(beta=0.0).draw(batch) is None  # beta 0: never mixed


@pytest.mark.parametrize("name, params", [("mixup", {"alpha": 0.2}), ("cutmix", {"beta": 1.0, "cutmix_prob": 1.0}),
                                          ("regmixup", {"alpha": 20.0}), ("t2fnorm", {"tau": 0.1}),
                                          ("ish", {"ish_mode": "minksample_expscale", "ish_param": 0.85})])
def test_defaults_are_openood_configs(name, params):
    det = build(name)
    assert {k: det.params[k] for k in params} == params and det.score_rules == ("msp",)


@pytest.mark.slow
def test_regmixup_through_the_runner(digits, single_torch_thread, tmp_path):
    """A 2-epoch heads-mode RegMixup unit of an evaluation run (protocol openood_v1.5) scores as the detector trained by
    hand on the run's own feature caches (the runner hands it the features, head and ID val it trains with)."""
    from detectors.harness.evaluate import run_config
    from detectors.harness.plan import make_plan
    from detectors.metrics import evaluate
    from pipelines.features import FeatureCache

    id_dir, ood_dir, model = digits
    plan = make_plan({"model": str(model), "id": str(id_dir), "out": str(tmp_path / "run"),
                      "ood": [{"manifest": str(ood_dir), "sets": ["digits_6_9"]}],
                      "detectors": [{"name": "regmixup", "params": {"epochs": 2, "mode": "heads"}}]})
    results = run_config(plan)

    def cache(role, name):
        [split] = [s for s in plan.splits if (s.role, s.name) == (role, name)]
        [path] = plan.cache_dir.glob(f"{split.id}-*.safetensors")
        return FeatureCache.load(path)

    train = cache("id", "id_train")
    val, test, near = (cache(role, name).to_featureset() for role, name in
                       (("id", "id_val"), ("id", "id_test"), ("ood", "digits_6_9")))
    # the default protocol (openood_v1.5) scores the best ID-val epoch, as OpenOOD's eval_ood.py loads best.ckpt
    trained = build("regmixup", mode="heads", epochs=2, checkpoint="best").fit(train.to_featureset(),
                                                                               head=train.head(), id_val=val)
    assert len(trained.history) == 2 and all(np.isfinite(h["loss"]) for h in trained.history)
    expect = evaluate(trained.score(test), trained.score(near))
    [row] = results[results.method == "regmixup"].to_dict("records")
    assert row["family"] == "training"
    assert row["auroc"] == pytest.approx(expect["auroc"], abs=1e-9) and row["fpr95"] == pytest.approx(expect["fpr95"],
                                                                                                      abs=1e-9)


@pytest.mark.parametrize("name", ["mixup", "cutmix", "regmixup", "t2fnorm", "ish"])
def test_heads_mode_trains_through_the_loop(name):
    """The loop hands T2FNorm and ISH the head it trains (`bind_head`); every method trains and scores in [1/C, 1]."""
    rng = np.random.default_rng(12)
    y = np.repeat(np.arange(3), 20)
    features = (np.abs(rng.normal(size=(60, 20))) + 2.0 * np.eye(3, 20)[y]).astype(np.float32)
    train = FeatureSet(features, None, y)
    head = LinearHead(rng.normal(size=(3, 20)) * 0.1, np.zeros(3))
    det = build(name, mode="heads", epochs=2, batch_size=16).fit(train, head=head)
    scores = det.score(FeatureSet(features))
    assert len(det.history) == 2 and np.isfinite([h["loss"] for h in det.history]).all()
    assert np.all((scores >= 1 / 3 - 1e-9) & (scores <= 1 + 1e-9))
    assert not np.allclose(det.head.weight, head.weight)  # the head the loop trained is the one that scores


def test_the_protocols_score_their_best_epoch():
    """openood_v1.5 and open-insects score OpenOOD's best.ckpt, exact the last epoch; open-insects adds its loop."""
    from detectors.harness.protocols import LAST_EPOCH_METHODS, OPENOOD_TRAINERS, TRAINING_METHODS, protocol_params
    from detectors.registry import detector_class
    from pipelines.training.recipes import TRAINING_PROTOCOLS

    assert not set(OPENOOD_TRAINERS) & set(TRAINING_METHODS)
    for name in set(OPENOOD_TRAINERS) - set(LAST_EPOCH_METHODS):
        assert detector_class(name).family == "training"
        assert protocol_params("openood_v1.5", name) == {"checkpoint": "best"}
        assert protocol_params("open-insects", name) == {**TRAINING_PROTOCOLS["open-insects"], "checkpoint": "best"}
        assert "checkpoint" not in protocol_params("exact", name)


@pytest.mark.parametrize("name", ["mixup", "cutmix", "regmixup", "t2fnorm", "ish"])
def test_full_mode_fine_tunes_on_images(name, tmp_path):
    """One epoch of each on 12 px images: the image loop mixes 4-D batches (CutMix's box) and hands T2FNorm and ISH
    the classifier's own head, which moves."""
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

        def forward(self, x):
            h = self.body(x)
            return self.fc(h), h

    torch.manual_seed(0)
    clf = ImageClassifier.from_module(Net(), image_size=12)
    before = clf.head.weight.detach().clone()
    det = build(name, classifier=clf, epochs=1, batch_size=3, ish_param=0.5) if name == "ish" else \
        build(name, classifier=clf, epochs=1, batch_size=3)
    det.fit(manifest)
    assert np.isfinite(det.history[-1]["loss"]) and det.head.weight.shape == (2, 8)
    assert not torch.equal(clf.head.weight.detach(), before)
