"""ARPL, G-ODIN, RotPred and UDG: each loss and score against a float64 hand computation; training runs end to end."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from detectors import FeatureSet, LinearHead, build
from detectors.training.arpl import ARPLLoss
from detectors.training.godin import GODINLoss
from detectors.training.rotpred import RotPredLoss, rotations, rotpred_score
from detectors.training.udg import UDGLoss, cluster_weights, filter_clusters, pca_whiten
from pipelines.training import Pass, TrainBatch


def _lse(z):
    m = z.max(1)
    return m + np.log(np.exp(z - m[:, None]).sum(1))


def _ce(z, y):
    return float(np.mean(_lse(z) - z[np.arange(len(y)), y]))


def _np(t):
    return t.detach().double().numpy()


def test_arpl_loss_by_hand():
    rng = np.random.default_rng(0)
    objective = ARPLLoss(weight_pl=0.3, temp=2.0)
    objective.setup(5, 3)
    with torch.no_grad():
        objective.radius.fill_(0.7)
    h, y = rng.normal(size=(6, 5)) * 2, np.array([0, 1, 2, 2, 1, 0])
    got = objective.loss(None, torch.as_tensor(h, dtype=torch.float32),
                         TrainBatch(x=torch.zeros(6, 5), y=torch.as_tensor(y)))
    p = _np(objective.points)
    dist = np.array([[np.sum((hi - pk) ** 2) / 5 - hi @ pk for pk in p] for hi in h])
    known = np.array([np.mean((h[i] - p[y[i]]) ** 2) for i in range(6)])
    want = _ce(dist / 2.0, y) + 0.3 * np.mean(np.maximum(0.0, known - 0.7 + 1.0))
    assert float(got.detach()) == pytest.approx(want, rel=1e-5)


def test_godin_loss_by_hand():
    rng = np.random.default_rng(1)
    torch.manual_seed(0)
    objective = GODINLoss()
    objective.setup(4, 3)
    objective.train()
    h, y = rng.normal(size=(8, 4)), rng.integers(0, 3, 8)
    got = objective.loss(None, torch.as_tensor(h, dtype=torch.float32),
                         TrainBatch(x=torch.zeros(8, 4), y=torch.as_tensor(y)))
    w = _np(objective.h.weight)
    cos = (h / (np.linalg.norm(h, axis=1, keepdims=True) + 1e-4)) @ (w / (np.linalg.norm(w, axis=1,
                                                                                         keepdims=True) + 1e-4)).T
    u = h @ _np(objective.g[0].weight)[0] + _np(objective.g[0].bias)[0]
    u = (u - u.mean()) / np.sqrt(u.var() + 1e-5)  # training-mode batch norm (biased variance), gamma 1, beta 0
    g = 1 / (1 + np.exp(-u))
    assert float(got.detach()) == pytest.approx(_ce(cos / g[:, None], y), rel=1e-5)
    assert objective.no_decay_parameters() == [objective.h.weight]


def test_rotpred_loss_rotations_and_score_by_hand():
    x = torch.arange(2 * 3 * 4 * 4, dtype=torch.float32).reshape(2, 3, 4, 4)
    rot = rotations(x)
    for k in range(4):
        np.testing.assert_array_equal(rot[2 * k: 2 * k + 2].numpy(), np.rot90(x.numpy(), k, axes=(2, 3)))
    with pytest.raises(ValueError, match="heads-only"):
        rotations(torch.zeros(2, 5))
    rng = np.random.default_rng(2)
    objective = RotPredLoss()
    objective.setup(5, 3)
    logits, feats, y = rng.normal(size=(8, 3)), rng.normal(size=(8, 5)), np.array([2, 0])
    got = objective.loss(torch.as_tensor(logits, dtype=torch.float32), torch.as_tensor(feats, dtype=torch.float32),
                         TrainBatch(x=x, y=torch.as_tensor(y)))
    rot_logits = feats @ _np(objective.rot_head.weight).T + _np(objective.rot_head.bias)
    assert float(got.detach()) == pytest.approx(_ce(logits[:2], y) + _ce(rot_logits, np.repeat(np.arange(4), 2)),
                                                rel=1e-5)
    # score: KL(uniform || p) - mean_r KL(onehot_r || q_r), in bits
    z, r = rng.normal(size=(3, 4)), rng.normal(size=(4, 3, 4))
    p = np.exp(z) / np.exp(z).sum(1, keepdims=True)
    want = []
    for i in range(3):
        kl_u = sum(0.25 * np.log2(0.25 / p[i, k]) for k in range(4))
        kl_r = [np.log2(1.0 / (np.exp(r[k, i]) / np.exp(r[k, i]).sum())[k]) for k in range(4)]
        want.append(kl_u - np.mean(kl_r))
    np.testing.assert_allclose(rotpred_score(z, r), want, rtol=1e-10)


def test_udg_helpers_match_a_direct_computation():
    from sklearn.decomposition import PCA

    rng = np.random.default_rng(3)
    x = rng.normal(size=(50, 6)) @ rng.normal(size=(6, 6))
    ours = pca_whiten(x, 3)
    ref = PCA(3, whiten=True).fit_transform(x)
    ref = ref / np.linalg.norm(ref, axis=1, keepdims=True)
    np.testing.assert_allclose(np.abs(ours), np.abs(ref), atol=1e-8)  # axes are defined up to sign
    cluster = np.array([0, 0, 0, 1, 2, 2])
    w = np.array([1 / np.sqrt(3), 1.0, 1 / np.sqrt(2), 1e5])  # cluster 3 is empty: (1e-10)^-0.5
    np.testing.assert_allclose(cluster_weights(cluster, 4), (w / w.mean())[cluster])
    # filtering, against the reference's per-cluster loop
    cluster = rng.integers(0, 5, 200)
    labels = np.where(rng.random(200) < 0.5, -1, rng.integers(0, 3, 200))
    labels[cluster == 1] = 2  # a pure ID cluster
    labels[cluster == 3] = -1  # a pure OOD cluster
    for thresholds in ((0.8, 0.8), (0.8, 0.4)):
        pseudo, conf = filter_clusters(cluster, labels, 5, 3, *thresholds, enhance=2.0)
        want_pseudo, want_conf = np.full(200, -1), np.ones(200)
        for c in range(5):
            values, counts = np.unique(labels[cluster == c], return_counts=True)
            purity = counts / counts.sum()
            if np.any(purity > thresholds[0]):
                want_pseudo[cluster == c] = values[purity > thresholds[0]][0]
            elif np.any(purity > thresholds[1]) and values[purity > thresholds[1]][0] == -1:
                want_conf[cluster == c] = 2.0
        np.testing.assert_array_equal(pseudo, want_pseudo)
        np.testing.assert_array_equal(conf, want_conf)


def test_udg_loss_by_hand():
    rng = np.random.default_rng(4)
    objective = UDGLoss(num_clusters=3, pca_dim=2, lambda_oe=0.5, lambda_aux=0.1)
    objective.setup(4, 3)
    n_id, n_aux = 4, 5
    feats = rng.normal(size=(n_id + n_aux, 4))
    objective.epoch_start(0,
                          Pass(torch.zeros(n_id, 3), torch.as_tensor(feats[:n_id]), torch.arange(n_id),
                               torch.tensor([0, 1, 2, 0])),
                          Pass(torch.zeros(n_aux, 3), torch.as_tensor(feats[n_id:]), torch.arange(n_aux),
                               torch.full((n_aux,), -1)))
    state = {k: v.numpy() for k, v in objective.state.items()}
    logits = rng.normal(size=(6, 3))
    y, aux_index = np.array([1, 2]), np.array([4, 0, 2, 3])
    index = np.array([3, 0])
    batch = TrainBatch(x=torch.zeros(2, 4), y=torch.as_tensor(y), aux_x=torch.zeros(4, 4), aux_y=torch.full((4,), -1),
                       index=torch.as_tensor(index), aux_index=torch.as_tensor(aux_index))
    f = rng.normal(size=(6, 4))
    got = objective.loss(torch.as_tensor(logits, dtype=torch.float32), torch.as_tensor(f, dtype=torch.float32), batch)
    labels = np.r_[y, state["aux_pseudo"][aux_index]]
    known = labels != -1
    want = _ce(logits[known], labels[known]) if known.any() else 0.0
    conf = np.r_[np.ones(2), state["aux_conf"][aux_index]]
    if (~known).any():
        z = logits[~known]
        want += 0.5 * np.mean((_lse(z) - z.mean(1)) * conf[~known])
    cl = np.r_[state["id_cluster"][index], state["aux_cluster"][aux_index]]
    wt = np.r_[state["id_weight"][index], state["aux_weight"][aux_index]]
    aux_logits = f @ _np(objective.aux_head.weight).T + _np(objective.aux_head.bias)
    per_row = _lse(aux_logits) - aux_logits[np.arange(6), cl]
    want += 0.1 * np.mean(per_row * wt)
    assert float(got.detach()) == pytest.approx(want, rel=1e-5)
    # re-initialised
    assert np.abs(_np(objective.aux_head.weight)).max() < 0.1 and not _np(objective.aux_head.bias).any()


def _toy(seed: int = 0):
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(3), 40)
    x = 4 * np.eye(6)[labels] + rng.normal(size=(120, 6))
    aux = 4 * np.eye(6)[rng.integers(3, 6, 90)] + rng.normal(size=(90, 6))
    return (FeatureSet(x, None, labels), FeatureSet(aux, None, np.full(90, -1)),
            LinearHead(np.zeros((3, 6)), np.zeros(3)))


@pytest.mark.parametrize("name,params", [("arpl", {}), ("godin", {}), ("godin", {"score_rule": "g"}),
                                         ("udg", {"num_clusters": 6, "pca_dim": 4})])
def test_heads_only_training_learns(name, params):
    train, aux, head = _toy()
    det = (build(name, mode="heads", epochs=10, lr=0.1, batch_size=32, warmup_epochs=1, **params)
           .fit(train, head=head, id_val=train, aux=aux))
    assert det.history[-1]["acc_label"] > 0.9


@pytest.mark.parametrize("name,params,rule", [
    ("oe", {}, "msp"), ("energy_oe", {"score_rule": "energy", "margins": "fixed"}, "ebo"),
    ("arpl", {}, "msp"), ("godin", {}, "msp"), ("logitnorm", {}, "msp"), ("novel_branch", {}, "msp"),
])
def test_posthoc_rules_on_the_transformed_set_equal_the_training_score(name, params, rule):
    """transform() + trained_head let any post-hoc detector read the trained model; MSP / EBO on them reproduce the
    training detector's own msp / energy rule."""
    train, aux, head = _toy(1)
    det = (build(name, mode="heads", epochs=2, lr=5e-2, batch_size=32, warmup_epochs=0, **params)
           .fit(train, head=head, aux=aux))
    seen = det.transform(aux)
    assert seen.labels is aux.labels and seen.features.dtype == np.float64
    np.testing.assert_allclose(seen.logits, det.trained_head(seen.features) + (
        (seen.features ** 2).sum(1, keepdims=True) / 6 if name == "arpl" else 0), rtol=1e-10, atol=1e-10)
    posthoc = build(rule).fit(det.transform(train), head=det.trained_head)
    np.testing.assert_allclose(posthoc.score(seen), det.score(aux), rtol=1e-10)


def test_rotpred_finetunes_and_scores_images(tmp_path):
    from PIL import Image

    from detectors import ImageSet
    from pipelines.classifier import ImageClassifier
    from pipelines.data import make_row, write_manifest

    rng = np.random.default_rng(5)
    rows = []
    for i in range(8):
        pixels = np.zeros((12, 12, 3), np.uint8)
        pixels[: 4 + i % 2 * 4] = 200  # an oriented pattern: a bright band at the top
        Image.fromarray(np.clip(pixels + rng.integers(0, 30, (12, 12, 3)), 0, 255).astype(np.uint8)).save(
            tmp_path / f"{i}.png")
        rows.append(make_row(f"{i}.png", split="train", label=i % 2))
    manifest = write_manifest(tmp_path, rows)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.Linear(400, 6))
            self.fc = torch.nn.Linear(6, 2)

        def forward(self, x):
            h = self.body(x)
            return self.fc(h), h

    torch.manual_seed(0)
    clf = ImageClassifier.from_module(Net(), image_size=12)
    det = build("rotpred", classifier=clf, epochs=3, batch_size=4, lr=1e-2, warmup_epochs=0).fit(manifest)
    scores = det.score(ImageSet(manifest=manifest))
    clf.eval()
    with torch.no_grad():
        x = clf.preprocess([Image.open(manifest.path(r)).convert("RGB") for r in manifest.rows])
        z, h = clf(rotations(x))
    rot = h.double().numpy() @ det.extra["rot.weight"].T + det.extra["rot.bias"]
    np.testing.assert_allclose(scores, rotpred_score(z.double().numpy()[:8], rot.reshape(4, 8, 4)), rtol=1e-5)
    with pytest.raises(ValueError, match="mode"):
        build("rotpred", mode="heads")
    with pytest.raises(TypeError, match="images"):
        build("rotpred", epochs=1).fit(FeatureSet(np.zeros((4, 3)), None, np.array([0, 1, 0, 1])))


@pytest.mark.parametrize("name,params", [("arpl", {}), ("godin", {}), ("udg", {"num_clusters": 4, "pca_dim": 3})])
def test_full_fine_tuning_on_images(name, params, tmp_path):
    """The same methods fine-tune a whole classifier on images (UDG clusters the model's features of the ID and
    aux images before each epoch); the trained model scores its re-extracted features."""
    from PIL import Image

    from pipelines.classifier import ImageClassifier
    from pipelines.data import Manifest, make_row, write_manifest

    rng = np.random.default_rng(6)
    colours = [(220, 30, 30), (30, 200, 30), (30, 30, 220)]
    rows, aux_rows = [], []
    for i in range(12):
        label = i % 3 if i < 8 else None
        colour = colours[label] if label is not None else (200, 200, 30)
        Image.fromarray(np.clip(np.array(colour)[None, None] + rng.integers(-20, 20, (12, 12, 3)), 0, 255)
                        .astype(np.uint8)).save(tmp_path / f"{i}.png")
        if label is None:
            aux_rows.append(make_row(f"{i}.png", split="train", role="ood", ood_set="auxiliary"))
        else:
            rows.append(make_row(f"{i}.png", split="train", label=label))
    train, aux = write_manifest(tmp_path, rows), Manifest(tmp_path, aux_rows)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten())
            self.fc = torch.nn.Linear(4, 3)

        def forward(self, x):
            h = self.body(x)
            return self.fc(h), h

    torch.manual_seed(0)
    clf = ImageClassifier.from_module(Net(), image_size=12)
    before = [p.detach().clone() for p in clf.parameters()]
    det = build(name, classifier=clf, epochs=2, batch_size=4, lr=1e-2, warmup_epochs=0, **params).fit(train, aux=aux)
    after = [p.detach() for p in clf.parameters()]
    assert any(not torch.equal(a, b) for a, b in zip(before, after))  # the classifier was trained in place
    assert np.isfinite(det.history[-1]["loss"])
    clf.eval()
    with torch.no_grad():
        _, h = clf(clf.preprocess([Image.open(train.path(r)).convert("RGB") for r in train.rows]))
    scores = det.score(FeatureSet(h.double().numpy()))
    assert scores.shape == (8,) and np.isfinite(scores).all()
