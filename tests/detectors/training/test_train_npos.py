"""NPOS against an epoch of OpenOOD's own trainer (golden numbers made by golden/make_npos.py at the commit
golden/npos.json names, faiss-cpu's exact IndexFlatL2 standing in for its GpuIndexFlatL2: every step's loss, CIDER
terms and synthesised points while the queues fill, roll and synthesise, the same global generators' draws, and the
weights after the trainer's SGD steps at its lr), the K-th distance against faiss, the synthesis and the loss by hand
in float64, and the edges (a class with fewer rows than the queue, one class, one boundary point or one kept
candidate, the epoch gate)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from detectors import FeatureSet, LinearHead, build
from detectors.training.npos import NPOSLoss, generate_outliers, kth_distance
from pipelines.training import Pass, TrainBatch

GOLDEN = json.loads((Path(__file__).parent / "golden" / "npos.json").read_text())
F32 = dict(dtype=torch.float32)


def test_golden_is_openood_at_the_recorded_commit():
    assert GOLDEN["openood_commit"].startswith("3c35632") and GOLDEN["made_by"].endswith("make_npos.py")
    params = build("npos").params
    assert {k: params[k] for k in GOLDEN["defaults"]} == GOLDEN["defaults"]
    assert params["projection"] == "mlp" and params["k"] == 50 and params["score_rule"] == "knn"


def _case_objective(case: dict) -> tuple[NPOSLoss, torch.nn.Linear]:
    w = {part: {n: torch.tensor(v, **F32) for n, v in ws.items()} for part, ws in case["inputs"]["weights"].items()}
    d_in, dim = w["backbone"]["weight"].shape[1], w["backbone"]["weight"].shape[0]
    objective = NPOSLoss(sample_number=case["sample_number"], sample_from=case["sample_from"], k=case["K"],
                         select=case["select"], pick_nums=case["pick_nums"], id_points_num=case["ID_points_num"],
                         start_epoch_knn=case["start_epoch_KNN"], feat_dim=w["head"]["2.weight"].shape[0])
    objective.setup(dim, case["classes"])
    objective.projection.load_state_dict(w["head"])
    objective.mlp.load_state_dict(w["mlp"])
    backbone = torch.nn.Linear(d_in, dim)
    backbone.load_state_dict(w["backbone"])
    return objective, backbone


@pytest.mark.parametrize("index", range(len(GOLDEN["cases"])))
def test_an_epoch_equals_openood_npos_trainer(index):
    case = GOLDEN["cases"][index]
    objective, backbone = _case_objective(case)
    with torch.no_grad():
        val_x = backbone(torch.tensor(case["inputs"]["val_x"], **F32))
    val_y = torch.tensor(case["inputs"]["val_y"])
    objective.calibrate_pass(Pass(torch.zeros(len(val_y), 1), val_x, torch.arange(len(val_y)), val_y), None)
    np.testing.assert_allclose(objective.prototypes.numpy(), case["initial_prototypes"], atol=1e-6)
    optimizer = torch.optim.SGD([{"params": backbone.parameters()}, {"params": objective.projection.parameters()},
                                 {"params": objective.mlp.parameters()}], 0.1, momentum=0.9, weight_decay=1e-4,
                                nesterov=True)
    objective.epoch_begin(0)
    np.random.seed(case["seed"])
    torch.manual_seed(case["seed"])
    for b, want in zip(case["inputs"]["batches"], case["steps"]):
        x = torch.cat([torch.tensor(v, **F32) for v in b["views"]])
        y = torch.tensor(b["y"]).repeat(2)
        loss = objective.loss(None, backbone(x), TrainBatch(x=x, y=y))
        assert float(loss.detach()) == pytest.approx(want["loss"], rel=1e-5)
        assert objective.last_terms["disp"] == pytest.approx(want["disp"], rel=1e-5)
        assert objective.last_terms["comp"] == pytest.approx(want["comp"], rel=1e-5)
        if want["outliers"]:
            np.testing.assert_allclose(objective.last_outliers.numpy(), np.concatenate(want["outliers"]), atol=1e-6)
        else:
            assert objective.last_outliers is None and objective.last_terms["reg"] == 0.0
        for group, lr in zip(optimizer.param_groups, want["lrs"]):
            group["lr"] = lr  # the reference's warm-up lr, one for every group (its mlp_decay_rate never applies)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert objective.counts.tolist() == case["queue_counts"]
    for part, module in (("backbone", backbone), ("head", objective.projection), ("mlp", objective.mlp)):
        for name, p in module.named_parameters():
            np.testing.assert_allclose(p.detach().numpy(), case["stepped"][part][name], atol=2e-6)


def _faiss_version(faiss) -> tuple[int, int]:
    return tuple(int(part) for part in faiss.__version__.split(".")[:2])


@pytest.mark.parametrize("rows, dim", [(25, 6), (2100, 64)])  # faiss 1.15: direct below 128,000 numbers
def test_kth_distance_equals_faiss_index_flat_l2(rows, dim):
    faiss = pytest.importorskip("faiss")
    rng = np.random.default_rng(0)
    bank = rng.normal(size=(40, dim)).astype(np.float32)
    queries = np.concatenate([rng.normal(size=(rows, dim)), bank[:5]]).astype(np.float32)  # self-matches too
    index = faiss.IndexFlatL2(dim)
    index.add(bank)
    for k in (1, 7, 40):
        want = index.search(queries, k)[0][:, -1]
        got = kth_distance(torch.from_numpy(queries), torch.from_numpy(bank), k).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * dim)  # a self-match's cancelling BLAS sums
        if rows * dim < 128_000 and _faiss_version(faiss) >= (1, 15):  # faiss' own form there: its rounding nearly
            # (faiss up to 1.14, the floor's 1.9 included, took its BLAS form from 20 queries on)
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def _synthesis_by_hand(queue, gaussian, k, select, pick_nums, id_points_num, cov_mat, rng):
    """float64 `generate_outliers`: exact squared distances, the same numpy draws, the reference's view and picks."""
    unit = queue / np.linalg.norm(queue, axis=1, keepdims=True)
    bank = unit[rng.choice(len(unit), len(unit), replace=False)]

    def kth(q):
        qu = q / np.linalg.norm(q, axis=1, keepdims=True)
        return np.sort(((qu[:, None] - bank[None]) ** 2).sum(-1), axis=1)[:, k - 1]

    boundary = np.argsort(-kth(queue), kind="stable")[:select]
    centres = boundary[rng.choice(select, pick_nums, replace=False)]
    length = len(gaussian)
    candidates = cov_mat * np.tile(gaussian, (pick_nums, 1)) + np.repeat(queue[centres], length, axis=0)
    grid = kth(candidates).reshape(length, pick_nums)  # row r, column j: candidate r * pick_nums + j
    picked = [j * length + np.argsort(-grid[:, j], kind="stable")[:id_points_num] for j in range(pick_nums)]
    return candidates[np.concatenate(picked)]


@pytest.mark.parametrize("pick_nums,id_points_num", [(2, 3), (3, 1), (1, 4)])
def test_synthesis_by_hand_in_float64(pick_nums, id_points_num):
    """One kept candidate or one boundary point included (the reference's `squeeze()` fails on those)."""
    rng = np.random.default_rng(pick_nums)
    queue, gaussian = rng.normal(size=(9, 5)) + 0.5, rng.normal(size=(11, 5))
    np.random.seed(4)
    got = generate_outliers(torch.tensor(queue, **F32), torch.tensor(gaussian, **F32), 4, 5, pick_nums,
                            id_points_num, 0.1).numpy()
    want = _synthesis_by_hand(queue, gaussian, 4, 5, pick_nums, id_points_num, 0.1, np.random.RandomState(4))
    assert got.shape == (pick_nums * id_points_num, 5)
    np.testing.assert_allclose(got, want, atol=1e-6)


def _bce(logits, labels):
    return np.mean(np.logaddexp(0, logits) - labels * logits)


def test_loss_by_hand_in_float64():
    """Full queues: the rolled queues' synthesis, the MLP's BCE, CIDER's two terms, their weights (data chosen
    without ties among the 4 largest K-th distances of a queue: mutual K-th neighbours tie, and which of them tops the
    boundary is then the sort's choice, here as in the reference)."""
    rng = np.random.default_rng(9)
    torch.manual_seed(0)
    objective = NPOSLoss(sample_number=6, sample_from=8, k=3, select=3, pick_nums=2, id_points_num=3,
                         start_epoch_knn=1, w_disp=0.3, w_comp=0.7, loss_weight=0.2, feat_dim=3)
    objective.setup(4, 2)
    start = rng.normal(size=(2, 3))
    objective.prototypes = torch.tensor(start / np.linalg.norm(start, axis=1, keepdims=True), **F32)
    queue = rng.normal(size=(2, 6, 4))
    objective.queue.copy_(torch.tensor(queue, **F32))
    objective.counts.fill_(6)
    h, y = rng.normal(size=(3, 4)), np.array([1, 0, 1])
    np.random.seed(1)
    torch.manual_seed(1)
    got = objective.loss(None, torch.tensor(h, **F32), TrainBatch(x=torch.tensor(h, **F32), y=torch.tensor(y)))
    for row, c in enumerate(y):
        queue[c] = np.concatenate([queue[c][1:], h[row:row + 1]])
    for rows in queue:  # the precondition: no tie among the 4 largest K-th distances (select 3)
        unit = rows / np.linalg.norm(rows, axis=1, keepdims=True)
        top = np.sort(np.sort(((unit[:, None] - unit[None]) ** 2).sum(-1), axis=1)[:, 2])[::-1][:4]
        assert np.all(-np.diff(top) > 1e-4)
    torch.manual_seed(1)
    gaussian = torch.randn(8, 4).double().numpy()
    draws = np.random.RandomState(1)
    outliers = np.concatenate([_synthesis_by_hand(queue[c], gaussian, 3, 3, 2, 3, 0.1, draws) for c in range(2)])
    np.testing.assert_allclose(objective.last_outliers.numpy(), outliers, atol=1e-5)
    w = {k: v.detach().double().numpy() for k, v in objective.mlp.state_dict().items()}

    def mlp(v):
        return (np.maximum(v @ w["0.weight"].T + w["0.bias"], 0) @ w["2.weight"].T + w["2.bias"])[:, 0]

    reg = _bce(np.r_[mlp(h), mlp(outliers)], np.r_[np.ones(3), np.zeros(len(outliers))])
    p = {k: v.detach().double().numpy() for k, v in objective.projection.state_dict().items()}
    z = np.maximum(h @ p["0.weight"].T + p["0.bias"], 0) @ p["2.weight"].T + p["2.bias"]
    z /= np.linalg.norm(z, axis=1, keepdims=True)
    protos = start / np.linalg.norm(start, axis=1, keepdims=True)
    for zi, c in zip(z, y):
        protos[c] = protos[c] * 0.95 + zi * 0.05
        protos[c] /= np.linalg.norm(protos[c])
    sim = np.exp(protos @ protos.T / 0.1)
    disp = np.mean(np.log((sim.sum(1) - np.diag(sim)) / 1))
    logits = z @ protos.T / 0.1
    comp = -0.1 / 0.07 * np.mean(logits[np.arange(3), y] - np.log(np.exp(logits).sum(1)))
    assert objective.last_terms["reg"] == pytest.approx(reg, rel=1e-5)
    assert float(got.detach()) == pytest.approx(0.3 * disp + 0.7 * comp + 0.2 * reg, rel=1e-5)


def test_edges_a_class_short_of_the_queue_one_class_and_the_epoch_gate():
    torch.manual_seed(0)
    short = NPOSLoss(sample_number=3, sample_from=6, k=2, select=2, pick_nums=1, id_points_num=2, start_epoch_knn=1,
                     feat_dim=3)
    short.setup(4, 2)
    for _ in range(4):  # class 1 has a single row: its queue never fills, so no outlier is ever synthesised
        x = torch.randn(4, 4)
        short.loss(None, x, TrainBatch(x=x, y=torch.tensor([0, 0, 0, 1]) if _ == 0 else torch.zeros(4).long()))
        assert short.last_terms["reg"] == 0.0 and short.last_outliers is None
    assert short.counts.tolist() == [3, 1]

    single = NPOSLoss(sample_number=3, sample_from=6, k=3, select=3, pick_nums=2, id_points_num=2, start_epoch_knn=1,
                      feat_dim=3)
    single.setup(4, 1)
    x = torch.randn(3, 4)
    single.loss(None, x, TrainBatch(x=x, y=torch.zeros(3).long()))  # fills the queue
    loss = single.loss(None, x[:1], TrainBatch(x=x[:1], y=torch.zeros(1).long()))  # one row, one class
    assert single.last_outliers.shape == (4, 4) and single.last_terms["reg"] > 0
    assert single.last_terms["disp"] == 0.0 and np.isfinite(float(loss.detach()))  # reference: NaN dispersion

    gated = NPOSLoss(sample_number=2, sample_from=6, k=2, select=2, pick_nums=1, id_points_num=2, start_epoch_knn=3,
                     feat_dim=3)
    gated.setup(4, 1)
    for epoch, synthesises in ((0, False), (1, False), (2, True)):
        gated.epoch_begin(epoch)
        gated.loss(None, x[:2], TrainBatch(x=x[:2], y=torch.zeros(2).long()))
        assert (gated.last_outliers is not None) == synthesises


def test_sizes_the_queue_cannot_hold_are_refused():
    with pytest.raises(ValueError, match="K=5 must be between 1 and sample_number=4"):
        NPOSLoss(sample_number=4, k=5, select=2)
    with pytest.raises(ValueError, match="pick_nums=3 must be between 1 and select=2"):
        NPOSLoss(sample_number=4, k=2, select=2, pick_nums=3)
    with pytest.raises(ValueError, match="ID_points_num=7 must be between 1 and sample_from=6"):
        NPOSLoss(sample_number=4, k=2, select=2, sample_from=6, id_points_num=7)


def test_heads_mode_trains_and_scores_minus_the_squared_knn_distance():
    """Heads mode trains the projection and the MLP with the synthesis from the first full queues; the score is
    -(k-th squared distance) on the frozen normalised features (CIDER's rule)."""
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(3, 6)) * 3
    y = np.repeat(np.arange(3), 40)
    train = FeatureSet(centres[y] + rng.normal(size=(120, 6)), None, y)
    test = FeatureSet(rng.normal(size=(30, 6)) * 4, None, None)
    det = build("npos", mode="heads", epochs=2, batch_size=16, warmup_epochs=0, k=7, sample_number=10,
                sample_from=20, start_epoch_knn=1, synthesis_k=5, select=4, id_points_num=5).fit(
        train, head=LinearHead(rng.normal(size=(3, 6)), np.zeros(3)))
    knn = build("knn", k=7).fit(train)
    np.testing.assert_allclose(det.score(test), -knn.score(test) ** 2, rtol=1e-5, atol=1e-6)
    assert np.isfinite(det.history[-1]["loss"]) and det.extra["projection.2.weight"].shape == (128, 6)


def test_the_loop_tells_the_epoch_so_synthesis_starts_at_start_epoch_knn(monkeypatch):
    """Through the training loop's `epoch_begin`: with start_epoch_knn 2, the first epoch never synthesises."""
    seen = []
    synthesise = NPOSLoss.synthesise

    def counted(self):
        seen.append(self.epoch_idx)
        return synthesise(self)

    monkeypatch.setattr(NPOSLoss, "synthesise", counted)
    rng = np.random.default_rng(1)
    y = np.repeat(np.arange(2), 30)
    train = FeatureSet(rng.normal(size=(60, 5)) + y[:, None], None, y)
    build("npos", mode="heads", epochs=2, batch_size=12, warmup_epochs=0, k=3, sample_number=4, sample_from=8,
          start_epoch_knn=2, synthesis_k=2, select=3, id_points_num=2).fit(
        train, head=LinearHead(rng.normal(size=(2, 5)), np.zeros(2)))
    assert seen and set(seen) == {2}


def test_kth_distance_direct_form_in_query_blocks_is_the_whole(monkeypatch):
    from detectors.training import npos

    rng = np.random.default_rng(3)
    queries, bank = (torch.from_numpy(rng.normal(size=(n, 4)).astype(np.float32)) for n in (11, 9))
    whole = kth_distance(queries, bank, 3)
    monkeypatch.setattr(npos, "DIRECT_ELEMENTS", 80)  # blocks of 2 queries, a short last one
    assert torch.equal(kth_distance(queries, bank, 3), whole)
    assert kth_distance(queries[:0], bank, 3).shape == (0,)
