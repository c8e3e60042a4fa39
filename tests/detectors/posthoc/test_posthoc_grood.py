"""GROOD against OpenOOD's own postprocessor (golden scores from grood.py, made by golden/make_grood.py at the commit
golden/grood.json names; its faiss IVF index rebuilt here from the same gradients) and a float64 replay by hand with
an exact nearest-neighbour search, plus its edges."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch

import detectors
from detectors import FeatureSet
from detectors.posthoc.grood import noise_gradients

GOLDEN = json.loads((Path(__file__).parent / "golden" / "grood.json").read_text())
INPUTS = GOLDEN["inputs"]
W, B = (np.asarray(INPUTS[k], dtype=np.float32) for k in ("weight", "bias"))
TRAIN, OOD, TEST = (np.asarray(INPUTS[k], dtype=np.float32) for k in ("train", "ood_val", "test"))
LABELS = np.asarray(INPUTS["labels"])
BATCHES = {"train_batch_rows": INPUTS["train_batch_rows"], "ood_batch_rows": INPUTS["ood_batch_rows"]}


def _set(h, labels=None, w=W, b=B):
    return FeatureSet(h, h @ w.T + b, LABELS if labels is None else labels)


def _ours(train=TRAIN, ood=OOD, test=TEST, labels=None, w=W, b=B, **params):
    det = detectors.build("grood", **{**BATCHES, **params})
    det.fit(_set(train, labels, w, b), ood_val=None if ood is None else FeatureSet(ood))
    return det.score(FeatureSet(test))


def _by_hand(train, ood, test, n_noise, labels=LABELS, w=W, b=B):
    """grood.py's steps in float64: class means, the OOD-val mean of whole batches, the noise-prototype gradient of the
    per-row cross-entropy by autograd, the exact nearest squared distance among correctly classified train rows."""
    train64, test64 = train.astype(np.float64), test.astype(np.float64)
    classes = w.shape[0]
    protos = np.stack([train64[labels == c].mean(0) if (labels == c).any() else np.zeros(train.shape[1])
                       for c in range(classes)])
    batch = BATCHES["ood_batch_rows"]
    noise = ood[:min(len(ood), -(-n_noise // batch) * batch)].astype(np.float64).mean(0)

    def grads(h):
        h = torch.from_numpy(h)
        p = torch.from_numpy(noise).requires_grad_(True)
        out = []
        for i in range(len(h)):
            s = -torch.linalg.vector_norm(h[i:i + 1, None] - torch.cat([torch.from_numpy(protos), p[None]]), dim=2)
            torch.nn.functional.cross_entropy(s, torch.tensor([0])).backward()
            out.append(p.grad.numpy().copy())
            p.grad = None
        return np.array(out)

    right = np.argmax(train @ w.T + b, axis=1) == labels
    bank, queries = grads(train64[right]), grads(test64)
    return -((queries[:, None] - bank[None]) ** 2).sum(2).min(1)


@pytest.mark.parametrize("case", GOLDEN["cases"], ids=lambda c: f"noise{c['n_noise_samples']}")
def test_grood_is_openoods(case):
    det = detectors.build("grood", n_noise_samples=case["n_noise_samples"], **BATCHES)
    det.fit(_set(TRAIN), ood_val=FeatureSet(OOD))
    np.testing.assert_allclose(det.prototypes, case["prototypes"], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(det.noise_prototype, case["noise"], rtol=1e-6, atol=1e-6)
    ours = det.score(FeatureSet(TEST))
    np.testing.assert_allclose(ours, case["scores"], rtol=2e-5, atol=1e-9)
    flat = _ours(index="flat", n_noise_samples=case["n_noise_samples"])
    np.testing.assert_allclose(flat, _by_hand(TRAIN, OOD, TEST, case["n_noise_samples"]), rtol=2e-5, atol=1e-9)
    # the inverted file searches a subset: never nearer than the exact search (up to float32 sums in another order)
    assert np.all(ours <= flat + 1e-6 * np.abs(flat) + 1e-9)


def test_grood_defaults_and_grid():
    cls = detectors.detector_class("grood")
    assert cls.defaults == {"n_noise_samples": 100, "noise": "ood_val", "index": "ivf", "train_batch_rows": 128,
                            "ood_batch_rows": 200}
    assert cls.search_space == {}  # grood.yaml's sweep sets attributes no score reads after setup
    with pytest.raises(ValueError, match="ood_val"):
        detectors.build("grood").fit(_set(TRAIN))
    mean = _ours(ood=None, noise="prototype_mean", index="flat")
    det = detectors.build("grood", noise="prototype_mean", index="flat").fit(_set(TRAIN))
    np.testing.assert_allclose(det.noise_prototype, det.prototypes.mean(0))
    np.testing.assert_array_equal(mean, det.score(FeatureSet(TEST)))


def test_grood_gradient_is_autograds():
    h = np.concatenate([TEST, TRAIN[:5]]).astype(np.float64)
    protos, noise = np.random.default_rng(0).normal(size=(4, h.shape[1])), OOD.mean(0).astype(np.float64)
    p = torch.from_numpy(noise).requires_grad_(True)
    s = -torch.cdist(torch.from_numpy(h), torch.cat([torch.from_numpy(protos), p[None]]))
    targets = torch.from_numpy(np.argmax(h @ W.T.astype(np.float64), axis=1))
    expected = []
    for i in range(len(h)):
        expected.append(torch.autograd.grad(torch.nn.functional.cross_entropy(s[i:i + 1], targets[i:i + 1]), p,
                                            retain_graph=True)[0].numpy())
    np.testing.assert_allclose(noise_gradients(h, protos, noise), np.array(expected), rtol=1e-5, atol=1e-7)


def test_grood_edges():
    # one class: every row is classified right, the softmax runs over its prototype and the OOD one
    w1, b1 = W[:1], B[:1]
    zeros = np.zeros(len(TRAIN), np.int64)
    np.testing.assert_allclose(_ours(labels=zeros, w=w1, b=b1, index="flat"),
                               _by_hand(TRAIN, OOD, TEST, 100, zeros, w1, b1), rtol=2e-5, atol=1e-9)
    # D > N, and a class without training rows (its prototype stays 0, as the reference's)
    few, few_labels = TRAIN[:6], np.array([0, 0, 1, 1, 2, 2])
    np.testing.assert_allclose(_ours(few, labels=few_labels, index="flat"),
                               _by_hand(few, OOD, TEST, 100, few_labels), rtol=2e-5, atol=1e-9)
    # ties: equal rows score alike; a correctly classified training row is its own nearest gradient (score 0)
    det = detectors.build("grood", index="flat", **BATCHES).fit(_set(TRAIN), ood_val=FeatureSet(OOD))
    tied = det.score(FeatureSet(np.stack([TEST[0], TEST[0]])))
    assert tied[0] == tied[1]
    right = np.flatnonzero(np.argmax(TRAIN @ W.T + B, axis=1) == LABELS)[:3]
    np.testing.assert_allclose(det.score(FeatureSet(TRAIN[right])), 0.0, atol=1e-12)
    # a row on the OOD prototype: a zero gradient (torch's norm gradient at 0), a finite score
    assert np.isfinite(det.score(FeatureSet(det.noise_prototype.astype(np.float32)[None]))).all()
    assert det.score(FeatureSet(TEST[:0])).shape == (0,)
    with pytest.raises(ValueError, match="no rows"):
        detectors.build("grood").fit(_set(TRAIN[:0], LABELS[:0]), ood_val=FeatureSet(OOD))
    with pytest.raises(ValueError, match="no rows"):
        detectors.build("grood").fit(_set(TRAIN), ood_val=FeatureSet(OOD[:0]))
    with pytest.raises(ValueError, match="labels"):
        detectors.build("grood").fit(_set(TRAIN, LABELS + 4), ood_val=FeatureSet(OOD))
    # one train batch: the reference's IVF has nothing to train on (it fails); searched exactly here
    one_batch = detectors.build("grood", train_batch_rows=len(TRAIN)).fit(_set(TRAIN), ood_val=FeatureSet(OOD))
    np.testing.assert_array_equal(one_batch.score(FeatureSet(TEST)), _ours(index="flat", ood_batch_rows=200))


@pytest.mark.parametrize("index", ["ivf", "flat"])
def test_grood_round_trips(tmp_path, index):
    det = detectors.build("grood", index=index, **BATCHES).fit(_set(TRAIN), ood_val=FeatureSet(OOD))
    det.save_pretrained(tmp_path)
    np.testing.assert_array_equal(detectors.load(tmp_path).score(FeatureSet(TEST)), det.score(FeatureSet(TEST)))


@pytest.mark.parametrize("index", ["ivf", "flat"])
def test_grood_streamed_fit_equals_one_chunk(index):
    from detectors.posthoc import streaming

    with streaming.chunk_rows(1 << 30):
        whole = _ours(index=index)
    with streaming.chunk_rows(7):
        np.testing.assert_allclose(_ours(index=index), whole, rtol=5e-6, atol=1e-12)  # float32 sums, reordered
