"""Temperature scaling: fitted T is the NLL minimiser (checked by a float64 grid and derivative-free Brent), state
round-trip."""
import numpy as np
import pytest
from scipy.optimize import minimize_scalar
from scipy.special import logsumexp, softmax

import detectors
from detectors import FeatureSet
from detectors.posthoc.tempscale import fit_temperature, fit_temperature_lbfgs


def _calibration_data(true_t=2.5, n=400, c=6, seed=0):
    """Labels drawn from softmax(z / true_t): the NLL-optimal temperature is close to true_t."""
    rng = np.random.default_rng(seed)
    z = rng.normal(scale=4.0, size=(n, c))
    p = softmax(z / true_t, axis=1)
    labels = np.minimum((np.cumsum(p, axis=1) < rng.random((n, 1))).sum(axis=1), c - 1)  # inverse-CDF sampling
    return z, labels


def _nll(z, y, t):
    """Mean NLL at temperature t; z [..., N, C] and t broadcastable to [..., 1, 1] (vectorised over a grid)."""
    scaled = z / t
    return np.mean(logsumexp(scaled, axis=-1) - scaled[..., np.arange(len(y)), y], axis=-1)


def test_fit_temperature_minimises_nll():
    z, y = _calibration_data()
    t = fit_temperature(z, y)
    grid = np.exp(np.linspace(np.log(1.0), np.log(6.0), 301))
    best = grid[np.argmin(_nll(z[None], y, grid[:, None, None]))]
    assert abs(np.log(t / best)) <= np.log(6.0) / 300
    assert _nll(z, y, t) <= min(_nll(z, y, t * 1.001), _nll(z, y, t / 1.001))
    assert 1.8 < t < 3.5  # near the temperature the labels were drawn with


def test_fit_temperature_agrees_with_derivative_free_brent():
    z, y = _calibration_data(true_t=0.7, seed=1)
    brent = minimize_scalar(lambda t: _nll(z, y, t), bounds=(0.05, 20.0), method="bounded", options={"xatol": 1e-9})
    assert fit_temperature(z, y) == pytest.approx(brent.x, rel=1e-5)


def _openood_lbfgs(z, y):
    """OpenOOD v1.5's TemperatureScalingPostprocessor.setup, verbatim but on the CPU."""
    import torch
    from torch import nn, optim

    temperature = nn.Parameter(torch.ones(1) * 1.5)
    logits, labels = torch.as_tensor(z, dtype=torch.float32), torch.as_tensor(y)
    nll_criterion = nn.CrossEntropyLoss()
    optimizer = optim.LBFGS([temperature], lr=0.01, max_iter=50)

    def eval():
        optimizer.zero_grad()
        loss = nll_criterion(logits / temperature, labels)
        loss.backward()
        return loss

    optimizer.step(eval)
    return temperature.item()


def test_default_fit_is_openood_lbfgs_and_exact_is_an_option():
    z, y = _calibration_data(true_t=4.0, seed=3)
    assert fit_temperature_lbfgs(z, y) == pytest.approx(_openood_lbfgs(z, y), rel=1e-6)
    det = detectors.build("tempscale").fit(FeatureSet(logits=z, labels=y))
    assert det.fitted_temperature == pytest.approx(_openood_lbfgs(z, y), rel=1e-6)
    exact = detectors.build("tempscale", fit="exact").fit(FeatureSet(logits=z, labels=y))
    assert exact.fitted_temperature == pytest.approx(fit_temperature(z, y))
    assert _nll(z, y, exact.fitted_temperature) <= _nll(z, y, det.fitted_temperature) + 1e-9


def test_tempscale_uses_id_val_when_given_and_round_trips():
    z_train, y_train = _calibration_data(true_t=1.0, seed=2)
    z_val, y_val = _calibration_data(true_t=4.0, seed=3)
    det = detectors.build("tempscale", fit="exact").fit(FeatureSet(logits=z_train, labels=y_train),
                                                        id_val=FeatureSet(logits=z_val, labels=y_val))
    assert det.fitted_temperature == pytest.approx(fit_temperature(z_val, y_val))
    only_train = detectors.build("tempscale", fit="exact").fit(FeatureSet(logits=z_train, labels=y_train))
    assert only_train.fitted_temperature == pytest.approx(fit_temperature(z_train, y_train))
    test = FeatureSet(logits=z_train[:25])
    p = softmax(z_train[:25] / det.fitted_temperature, axis=1).max(axis=1)
    np.testing.assert_allclose(det.score(test), np.log(p / (1 - p)), rtol=1e-9)  # default output: log-odds of max
                                                                                 # softmax


def test_fixed_temperature_needs_no_fit_and_unfitted_errors():
    z, _ = _calibration_data(seed=4)
    fixed = detectors.build("tempscale", temperature=3.0)
    np.testing.assert_allclose(fixed.score(z),
                               np.log(softmax(z / 3.0, axis=1).max(axis=1))
                               - np.log1p(-softmax(z / 3.0, axis=1).max(axis=1)), rtol=1e-9)
    prob = detectors.build("tempscale", temperature=3.0, output="prob")
    np.testing.assert_allclose(prob.score(z), softmax(z / 3.0, axis=1).max(axis=1), rtol=1e-12)
    with pytest.raises(RuntimeError, match="fit"):
        detectors.build("tempscale").score(z)


def test_logodds_does_not_saturate_at_small_temperature():
    """At T = 0.01 float64 softmax ties every confident sample at 1.0; log-odds keeps their margin order."""
    z = np.array([[10.0, 0.0], [20.0, 0.0], [30.0, 0.0]])
    prob = detectors.build("tempscale", temperature=0.01, output="prob").score(z)
    assert len(set(prob)) == 1
    np.testing.assert_allclose(detectors.build("tempscale", temperature=0.01).score(z), [1000.0, 2000.0, 3000.0])
