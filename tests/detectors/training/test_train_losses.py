"""Each training-time loss equals a float64 hand computation on fixed tensors."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from detectors.training.confbranch import ConfBranchLoss, hint_mask
from detectors.training.energy_oe import EnergyOELoss
from detectors.training.logitnorm import LogitNormLoss
from detectors.training.mixoe import MixOELoss, cutmix_box
from detectors.training.novel_branch import BranchLoss
from detectors.training.oe import OELoss
from pipelines.training import TrainBatch


def _lse(z: np.ndarray) -> np.ndarray:
    m = z.max(1)
    return m + np.log(np.exp(z - m[:, None]).sum(1))


def _ce(z: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean(_lse(z) - z[np.arange(len(y)), y]))


@pytest.fixture
def fixed():
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(7, 4)) * 3  # 4 ID rows then 3 aux rows
    y = np.array([0, 3, 1, 2])
    return logits, y


def _batch(y, n_aux=3, aux_y=None, features=None):
    aux = None if n_aux == 0 else torch.zeros(n_aux, 2)
    aux_t = None if n_aux == 0 else torch.as_tensor(aux_y if aux_y is not None else [-1] * n_aux)
    return TrainBatch(x=torch.zeros(len(y), 2), y=torch.as_tensor(y), aux_x=aux, aux_y=aux_t)


def test_logitnorm_loss(fixed):
    logits, y = fixed
    got = LogitNormLoss(0.04).loss(torch.as_tensor(logits[:4], dtype=torch.float32), None, _batch(y, 0))
    z = logits[:4] / (np.linalg.norm(logits[:4], axis=1, keepdims=True) + 1e-7) / 0.04
    assert float(got.detach()) == pytest.approx(_ce(z, y), rel=1e-5)


def test_oe_loss(fixed):
    logits, y = fixed
    got = OELoss(0.5).loss(torch.as_tensor(logits, dtype=torch.float32), None, _batch(y))
    aux = logits[4:]
    uniform_ce = np.mean([-np.mean(row - _lse(row[None])[0]) for row in aux])
    assert float(got.detach()) == pytest.approx(_ce(logits[:4], y) + 0.5 * uniform_ce, rel=1e-5)


def test_energy_oe_loss_and_data_margins(fixed):
    logits, y = fixed
    loss = EnergyOELoss(0.1, m_in=-3.0, m_out=-1.0)
    got = loss.loss(torch.as_tensor(logits, dtype=torch.float32), None, _batch(y))
    e_in, e_out = -_lse(logits[:4]), -_lse(logits[4:])
    want = (_ce(logits[:4], y)
            + 0.1 * (np.mean(np.maximum(e_in + 3.0, 0) ** 2) + np.mean(np.maximum(-1.0 - e_out, 0) ** 2)))
    assert float(got.detach()) == pytest.approx(want, rel=1e-5)
    data = EnergyOELoss(margins="data")
    assert data.needs_calibration
    data.calibrate(torch.as_tensor(logits[:4]), torch.as_tensor(logits[4:]))
    assert data.m_in == pytest.approx(e_in.mean()) and data.m_out == pytest.approx(e_out.mean())


def test_mixoe_mixup_loss():
    rng = np.random.default_rng(0)
    x, aux = torch.as_tensor(rng.normal(size=(4, 5))), torch.as_tensor(rng.normal(size=(6, 5)))
    y = torch.tensor([0, 2, 1, 2])
    objective = MixOELoss("mixup", alpha=1.0, beta=1.0, lambda_oe=5.0, passes=1)  # the MixOE paper code's choices
    batch = TrainBatch(x=x, y=y, aux_x=aux, generator=torch.Generator().manual_seed(1))
    inputs = objective.inputs(batch)
    k, lam = objective._mixed
    assert k == 4 and 0 < lam < 1
    torch.testing.assert_close(inputs[4:], lam * x + (1 - lam) * aux[:4])
    logits = rng.normal(size=(8, 3))
    got = objective.loss(torch.as_tensor(logits, dtype=torch.float32), None, batch)
    soft = lam * np.eye(3)[y.numpy()] + (1 - lam) / 3
    mixed = logits[4:]
    soft_ce = np.mean(-(soft * (mixed - _lse(mixed)[:, None])).sum(1))
    assert float(got.detach()) == pytest.approx(_ce(logits[:4], y.numpy()) + 5.0 * soft_ce, rel=1e-5)


def test_mixoe_cutmix_pastes_aux_box_and_lam_is_kept_area():
    x, aux = torch.zeros(2, 3, 16, 12), torch.ones(3, 3, 16, 12)
    objective = MixOELoss("cutmix", alpha=2.0, beta=2.0)
    mixed, lam = objective.mix(x, aux, torch.Generator().manual_seed(5))
    pasted = float(mixed[0, 0].mean())  # share of pixels that came from the outlier image
    assert lam == pytest.approx(1 - pasted)
    top, left, bottom, right = cutmix_box(16, 12, 0.3, torch.Generator().manual_seed(2))
    assert 0 <= top <= bottom <= 16 and 0 <= left <= right <= 12
    feats, aux_feats = torch.zeros(2, 5), torch.ones(2, 5)  # feature vectors have no box to cut: mixup
    mixed, lam = objective.mix(feats, aux_feats, torch.Generator().manual_seed(3))
    torch.testing.assert_close(mixed, torch.full((2, 5), 1 - lam))


def test_mixoe_recipe_defaults_two_passes_and_beta_draws():
    """Open-Insects recipe: cutmix, lam ~ Beta(0.1, 1.0), weight 1.0, ID batch and mixtures as two forward passes."""
    from scipy import stats

    from detectors import build
    from detectors.training.mixoe import beta_sample

    objective = build("mixoe").objective()
    assert ((objective.mix_op, objective.alpha, objective.beta, objective.lambda_oe, objective.passes)
            == ("cutmix", 0.1, 1.0, 1.0, 2))
    draws = [beta_sample(0.1, 1.0, torch.Generator().manual_seed(i)) for i in range(2000)]
    assert stats.kstest(draws, stats.beta(0.1, 1.0).cdf).pvalue > 0.01
    assert stats.kstest(draws, stats.beta(1.0, 1.0).cdf).pvalue < 1e-6
    x, aux = torch.zeros(3, 3, 8, 8), torch.ones(3, 3, 8, 8)
    batch = TrainBatch(x=x, y=torch.tensor([0, 1, 1]), aux_x=aux, generator=torch.Generator().manual_seed(0))
    first, mixed = objective.inputs(batch)  # a tuple: the loop runs one forward pass each
    assert first is x and mixed.shape == x.shape
    k, lam = objective._mixed
    assert lam == pytest.approx(1 - float(mixed[0, 0].mean()))
    rng = np.random.default_rng(4)
    logits = rng.normal(size=(6, 2))
    got = objective.loss(torch.as_tensor(logits, dtype=torch.float32), None, batch)
    soft = lam * np.eye(2)[[0, 1, 1]] + (1 - lam) / 2
    want = (_ce(logits[:3], np.array([0, 1, 1]))
            + 1.0 * np.mean(-(soft * (logits[3:] - _lse(logits[3:])[:, None])).sum(1)))
    assert float(got.detach()) == pytest.approx(want, rel=1e-5)


def test_energy_oe_defaults_to_data_margins():
    from detectors import build

    objective = build("energy_oe").objective()
    assert objective.needs_calibration and objective.lam == 0.1


@pytest.mark.parametrize("per_species", [False, True])
def test_branch_losses(per_species):
    rng = np.random.default_rng(1)
    objective = BranchLoss(per_species)
    objective.setup(5, 3, num_aux_classes=4)
    assert objective.branch.out_features == (3 + 4 if per_species else 3 + 1)
    features = rng.normal(size=(6, 5))
    logits = rng.normal(size=(6, 3))
    y, aux_y = np.array([2, 0, 1]), np.array([3, 0, 1])
    batch = TrainBatch(x=torch.zeros(3, 5), y=torch.as_tensor(y), aux_x=torch.zeros(3, 5), aux_y=torch.as_tensor(aux_y))
    got = objective.loss(torch.as_tensor(logits, dtype=torch.float32), torch.as_tensor(features, dtype=torch.float32),
                         batch)
    w = objective.branch.weight.detach().double().numpy()
    b = objective.branch.bias.detach().double().numpy()
    second = features @ w.T + b
    targets = np.r_[y, 3 + aux_y] if per_species else np.r_[y, [3, 3, 3]]
    assert float(got.detach()) == pytest.approx(0.5 * (_ce(logits[:3], y) + _ce(second, targets)), rel=1e-5)


def test_confbranch_loss_and_lambda_update():
    rng = np.random.default_rng(2)
    objective = ConfBranchLoss(lmbda=0.1, budget=0.3)
    objective.setup(5, 3)
    features, logits, y = rng.normal(size=(6, 5)), rng.normal(size=(6, 3)), np.array([0, 1, 2, 2, 1, 0])
    batch = TrainBatch(x=torch.zeros(6, 5), y=torch.as_tensor(y), generator=torch.Generator().manual_seed(4))
    got = objective.loss(torch.as_tensor(logits, dtype=torch.float32), torch.as_tensor(features, dtype=torch.float32),
                         batch)
    b = hint_mask(6, torch.Generator().manual_seed(4)).numpy()
    w, bias = objective.branch.weight.detach().double().numpy(), objective.branch.bias.detach().double().numpy()
    c = 1 / (1 + np.exp(-(features @ w.T + bias)))
    p = np.exp(logits - _lse(logits)[:, None])
    conf = c * b + (1 - b)
    mixed = p * conf + np.eye(3)[y] * (1 - conf)
    conf_loss = np.mean(-np.log(c))
    assert float(got.detach()) == pytest.approx(np.mean(-np.log(mixed[np.arange(6), y])) + 0.1 * conf_loss, rel=1e-5)
    assert objective.lmbda == pytest.approx(0.1 / 1.01 if conf_loss < 0.3 else 0.1 / 0.99)
