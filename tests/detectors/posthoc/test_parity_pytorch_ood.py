"""Post-hoc detectors against pytorch-ood 0.4 itself (`pip install --no-deps pytorch-ood==0.4.0`, .ci/parity_deps).

pytorch-ood's package `__init__` imports torchvision (not installable beside CPU torch here); `helpers.pytorch_ood`
puts a bare `pytorch_ood` package in sys.modules so that only `pytorch_ood.detector` (torch, numpy, scipy, sklearn)
loads.
Both sides see the same fixed float32 features, logits and head. pytorch-ood returns outlier scores (higher = more
OOD), ours are ID scores, so ours = -theirs, up to the conventions noted per method.
"""
import numpy as np
import pytest
from helpers.pytorch_ood import pytorch_ood_detector

import detectors
from detectors import FeatureSet, LinearHead

torch = pytest.importorskip("torch")
N_TRAIN, N_TEST, D, C = 600, 80, 32, 5


@pytest.fixture(scope="module")
def pood():
    return pytorch_ood_detector()


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(C), N_TRAIN // C)
    centers = rng.normal(scale=2.0, size=(C, D))
    train = np.maximum(centers[labels] + rng.normal(size=(N_TRAIN, D)) * np.linspace(2.0, 0.3, D), 0).astype(np.float32)
    test = np.maximum(np.concatenate([centers[labels[::15]] + rng.normal(size=(N_TRAIN // 15, D)),
                                      rng.normal(scale=3.0, size=(N_TEST - N_TRAIN // 15, D))]), 0).astype(np.float32)
    weight = 0.3 * np.maximum(centers, 0) + rng.normal(scale=0.1, size=(C, D))  # most train rows classified right
    head = LinearHead(weight.astype(np.float32), rng.normal(size=C).astype(np.float32))
    return train, labels, test, head


def _linear(head: LinearHead):
    layer = torch.nn.Linear(head.weight.shape[1], head.weight.shape[0])
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(np.asarray(head.weight)))
        layer.bias.copy_(torch.from_numpy(np.asarray(head.bias)))
    return layer


def _theirs(det, train, labels, test, maps: bool = False) -> np.ndarray:
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a))  # noqa: E731
    with torch.no_grad():
        if maps:
            if hasattr(det, "fit_feature_maps"):
                det.fit_feature_maps(t(train)[:, :, None, None], t(labels))
            return det.predict_feature_maps(t(test)[:, :, None, None]).double().numpy()
        det.fit_features(t(train), t(labels))
        return det.predict_features(t(test)).double().numpy()


def _ours(name: str, train, labels, test, head, **params) -> np.ndarray:
    fit = FeatureSet(train, logits=head(train), labels=labels)
    det = detectors.build(name, **params).fit(fit, head=head)
    return np.asarray(det.score(FeatureSet(test, logits=head(test))), dtype=np.float64)


@pytest.mark.parametrize("ours, theirs", [("msp", "MaxSoftmax"), ("ebo", "EnergyBased"), ("mls", "MaxLogit")])
def test_logit_scores(pood, data, ours, theirs):
    train, labels, test, head = data
    logits = torch.from_numpy(head(test))
    expected = -getattr(pood, theirs)(None).predict_logits(logits).double().numpy()
    np.testing.assert_allclose(_ours(ours, train, labels, test, head), expected, rtol=1e-5, atol=1e-5)


def test_klm(pood, data):
    train, labels, test, head = data
    det = pood.KLMatching(None).fit_logits(torch.from_numpy(head(train)), torch.from_numpy(labels))
    expected = -det.predict_logits(torch.from_numpy(head(test))).double().numpy()
    np.testing.assert_allclose(_ours("klm", train, labels, test, head), expected, rtol=1e-4, atol=1e-5)


def test_mahalanobis(pood, data):
    # pytorch-ood: half the squared distance to the closest class mean, its shared covariance the scatter sum (not
    # divided by N); OpenOOD's MDS: minus the squared distance with the covariance. Same ranking, factor -2 N
    train, labels, test, head = data
    expected = -2.0 * N_TRAIN * _theirs(pood.Mahalanobis(None), train, labels, test)
    np.testing.assert_allclose(_ours("mds", train, labels, test, head), expected, rtol=1e-4)


def test_rmds(pood, data):
    # both scatter sums undivided, factor -N; their float32 difference of two large distances keeps ~4 digits
    train, labels, test, head = data
    expected = -N_TRAIN * _theirs(pood.RMD(None), train, labels, test)
    ours = _ours("rmds", train, labels, test, head)
    np.testing.assert_allclose(ours, expected, rtol=0, atol=2e-4 * np.abs(expected).max())


@pytest.mark.parametrize("dim", [8, 24])
def test_vim(pood, data, dim):
    train, labels, test, head = data
    w, b = torch.from_numpy(head.weight), torch.from_numpy(head.bias)
    expected = -_theirs(pood.ViM(None, d=dim, w=w, b=b), train, labels, test)
    # pytorch-ood fits in float32 (covariance, eigh): agreement to its precision, relative to the score scale
    ours = _ours("vim", train, labels, test, head, dim=dim)
    np.testing.assert_allclose(ours, expected, rtol=0, atol=1e-4 * np.abs(expected).max())


def test_knn(pood, data):
    train, labels, test, head = data
    expected = -_theirs(pood.KNN(None, k=50), train, labels, test)
    np.testing.assert_allclose(_ours("knn", train, labels, test, head, k=50), expected, rtol=1e-5, atol=1e-6)


def test_dice(pood, data):
    train, labels, test, head = data
    w, b = torch.from_numpy(head.weight), torch.from_numpy(head.bias)
    expected = -_theirs(pood.DICE(None, w=w, b=b, p=0.9), train, labels, test)
    np.testing.assert_allclose(_ours("dice", train, labels, test, head, percentile=90), expected, rtol=1e-5, atol=1e-4)


def test_react(pood, data):
    train, labels, test, head = data
    det = pood.ReAct(None, head=lambda x: _linear(head)(x.flatten(1)), percentile=0.9)
    expected = -_theirs(det, train, labels, test, maps=True)
    np.testing.assert_allclose(_ours("react", train, labels, test, head, percentile=90), expected, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("variant", ["b", "p", "s"])
def test_ash(pood, data, variant):
    train, labels, test, head = data
    det = pood.ASH(None, head=lambda x: _linear(head)(x.flatten(1)), variant=f"ash-{variant}", percentile=0.9)
    expected = -_theirs(det, train, labels, test, maps=True)
    np.testing.assert_allclose(_ours("ash", train, labels, test, head, percentile=90, variant=variant), expected,
                               rtol=1e-5, atol=1e-4)


def test_she(pood, data):
    train, labels, test, head = data
    expected = -_theirs(pood.SHE(None, head=_linear(head)), train, labels, test)
    np.testing.assert_allclose(_ours("she", train, labels, test, head), expected, rtol=1e-4, atol=1e-4)


def test_fdbd(pood, data):
    # pytorch-ood averages the C - 1 boundary terms, OpenOOD sums them: factor C - 1
    train, labels, test, head = data
    expected = -(C - 1) * _theirs(pood.fDBD(None, head=_linear(head)), train, labels, test)
    np.testing.assert_allclose(_ours("fdbd", train, labels, test, head), expected, rtol=1e-5, atol=1e-6)


def test_nci(pood, data):
    train, labels, test, head = data
    expected = -_theirs(pood.NCI(None, head=_linear(head), alpha=1e-4), train, labels, test)
    np.testing.assert_allclose(_ours("nci", train, labels, test, head, alpha=1e-4), expected, rtol=1e-5, atol=1e-5)


# pytorch-ood 0.4.0 classes that name no post-hoc detector here, each with the reason
NOT_POSTHOC_HERE = {
    "MCD": "Monte Carlo dropout there; `mcd` here is OpenOOD's maximum classifier discrepancy (training-time)",
    "MCM": "CLIP's maximum concept matching: the clip family's `mcm`",
    "MahalanobisODIN": "Mahalanobis after input pre-processing: the family of `mdsens` (OpenOOD's), no class of "
                       "its own",
}


def test_every_pytorch_ood_detector_is_registered(pood):
    """Each detector class pytorch-ood 0.4.0 exports resolves (by its name, an alias, or our name in another case) to
    a registered post-hoc detector, except those listed with their reason."""
    from detectors.registry import detector_class

    classes = [n for n in pood.__all__ if isinstance(getattr(pood, n), type)]
    assert len(classes) >= 35
    for name in classes:
        if name in NOT_POSTHOC_HERE:
            continue
        assert detector_class(name).family == "posthoc", name
    for name in ("vra", "graduncertainty", "mmahalanobis", "nac"):
        assert name in detectors.available("posthoc")
