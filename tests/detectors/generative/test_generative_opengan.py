"""OpenGAN: architecture as published, learning on separable features, epoch selection, BN modes, save/load."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import detectors
from detectors import FeatureSet
from detectors.generative.opengan import Discriminator, Generator, init_weights
from detectors.metrics import auroc


def blobs(n: int, center: float, dim: int = 16, seed: int = 0) -> FeatureSet:
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 1, (n, dim)) + center
    return FeatureSet(features=x.astype(np.float32))


def test_architecture_and_init():
    g, d = Generator(40), Discriminator(40)
    g.apply(init_weights)
    d.apply(init_weights)
    g_sizes = [(m.in_features, m.out_features, m.bias is not None)
               for m in g.modules() if isinstance(m, torch.nn.Linear)]
    d_sizes = [(m.in_features, m.out_features, m.bias is not None)
               for m in d.modules() if isinstance(m, torch.nn.Linear)]
    assert g_sizes == [(100, 512, False), (512, 256, False), (256, 128, False), (128, 256, False), (256, 40, True)]
    assert d_sizes == [(40, 512, False), (512, 256, False), (256, 128, False), (128, 64, False), (64, 1, False)]
    bn_d = [m.num_features for m in d.modules() if isinstance(m, torch.nn.BatchNorm1d)]
    assert bn_d == [256, 128, 64]  # no BN after the first layer
    weights = torch.cat([m.weight.flatten() for m in d.modules() if isinstance(m, torch.nn.Linear)])
    assert abs(float(weights.detach().std()) - 0.02) < 0.002
    bn_w = torch.cat([m.weight for m in d.modules() if isinstance(m, torch.nn.BatchNorm1d)])
    assert abs(float(bn_w.detach().mean()) - 1.0) < 0.01


def mixed_auroc(det, id_set: FeatureSet, ood_set: FeatureSet) -> float:
    scores = det.score(FeatureSet(features=np.concatenate([id_set.features, ood_set.features])))
    return auroc(scores[: len(id_set)], scores[len(id_set):])


def test_separable_features_and_bn_modes():
    train, id_val, ood_val = blobs(512, 0.0, seed=1), blobs(128, 0.0, seed=2), blobs(128, 3.0, seed=3)
    det = detectors.build("opengan", epochs=5)
    det.fit(train, id_val=id_val, ood_val=ood_val, outliers=blobs(256, 3.0, seed=4))
    test_id, test_ood = blobs(200, 0.0, seed=5), blobs(200, 3.0, seed=6)
    eval_auroc = mixed_auroc(det, test_id, test_ood)
    assert eval_auroc > 0.95
    assert auroc(det.score(test_id), det.score(test_ood)) == pytest.approx(eval_auroc, abs=1e-12)  # per-sample scores
    # BN with batch statistics: scores depend on what is scored together, and rank worse (why "eval" is the default)
    det.params["bn_mode"] = "batch"
    alone = det.score(test_id)
    together = det.score(FeatureSet(features=np.concatenate([test_id.features, test_ood.features])))[:200]
    assert np.abs(alone - together).max() > 1e-3
    assert mixed_auroc(det, test_id, test_ood) <= eval_auroc


def test_model_selection_keeps_the_best_validation_epoch(monkeypatch):
    # a scripted validation curve makes the choice known: best 0.9 at epochs 1 and 3, the later one kept (OpenOOD: >=)
    curve = iter([0.5, 0.9, 0.7, 0.9, 0.6])
    states = []

    def scripted(self, id_val, ood_val):
        states.append({k: v.clone() for k, v in self.discriminator.state_dict().items()})
        return next(curve)

    monkeypatch.setattr(type(detectors.build("opengan")), "validation_auroc", scripted)
    train, id_val, ood_val = blobs(512, 0.0, seed=1), blobs(128, 0.0, seed=2), blobs(128, 3.0, seed=3)
    det = detectors.build("opengan", epochs=5, seed=0, joint_batches=False, bn_train="train")
    det.fit(train, id_val=id_val, ood_val=ood_val, outliers=blobs(256, 3.0, seed=4))
    assert [h["auroc"] for h in det.history] == [0.5, 0.9, 0.7, 0.9, 0.6] and det.best_epoch == 3
    kept = det.discriminator.state_dict()
    assert all(torch.equal(kept[k], states[3][k]) for k in kept)
    assert any(not torch.equal(kept[k], states[4][k]) for k in kept)  # the last epoch's D was not kept


def test_model_selection_on_real_validation_auroc():
    train, id_val, ood_val = blobs(512, 0.0, seed=1), blobs(128, 0.0, seed=2), blobs(128, 3.0, seed=3)
    det = detectors.build("opengan", epochs=6, seed=0, joint_batches=False, bn_train="train")
    det.fit(train, id_val=id_val, ood_val=ood_val, outliers=blobs(256, 3.0, seed=4))
    aurocs = [h["auroc"] for h in det.history]
    assert det.best_epoch == len(aurocs) - 1 - int(np.argmax(aurocs[::-1]))  # ties: the later epoch (OpenOOD)
    assert det.validation_auroc(id_val, ood_val) == pytest.approx(max(aurocs), abs=1e-12)


def test_opengan0_without_outliers_keeps_last_epoch_without_validation():
    train = blobs(256, 0.0, seed=1)
    det = detectors.build("opengan", epochs=3).fit(train)
    assert det.best_epoch == 2 and len(det.history) == 3 and "auroc" not in det.history[0]
    assert np.isfinite(det.score(train)).all()
    only_id_val = detectors.build("opengan", epochs=2).fit(train, id_val=train)
    assert only_id_val.best_epoch == 1 and "auroc" not in only_id_val.history[0]


def _hand_training(real, epochs, seed, outliers=None, lr=1e-4, nz=100):
    """OpenOOD's OpenGAN-0 epoch loop (outliers None) or the official notebook's outlier loop, written out with
    sigmoid + nn.BCELoss on one full batch per epoch, replaying the detector's random draws."""
    real = torch.from_numpy(real)
    gen = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        netG = Generator(real.shape[1], nz).apply(init_weights)
        netD = Discriminator(real.shape[1]).apply(init_weights)
    opt_d = torch.optim.Adam(netD.parameters(), lr=lr / 1.5, betas=(0.5, 0.999))
    opt_g = torch.optim.Adam(netG.parameters(), lr=lr, betas=(0.5, 0.999))
    prob = lambda net, x: torch.sigmoid(net(x))  # noqa: E731  (the references end D with nn.Sigmoid)
    bce = torch.nn.BCELoss()
    for epoch in range(epochs):
        if outliers is None:  # OpenOOD: validation after epoch 1 leaves G and D in eval mode for good
            netG.train(epoch == 0)
            netD.train(epoch == 0)
        batch = real[torch.randperm(len(real), generator=gen)]
        n_fake = len(batch) if outliers is None else len(batch) // 2
        fake = netG(torch.randn(n_fake, nz, generator=gen))
        opt_d.zero_grad()
        if outliers is None:
            loss_d = bce(prob(netD, batch), torch.ones(len(batch))) + bce(prob(netD, fake.detach()),
                                                                          torch.zeros(n_fake))
        else:
            open_ = torch.from_numpy(outliers)[torch.randint(0, len(outliers), (len(batch),), generator=gen)]
            weights = torch.cat([torch.ones(2 * len(batch)), torch.full((n_fake,), 0.2)])
            target = torch.cat([torch.ones(len(batch)), torch.zeros(len(batch) + n_fake)])
            loss_d = torch.nn.BCELoss(weight=weights)(prob(netD, torch.cat([batch, open_, fake.detach()])), target)
        loss_d.backward()
        opt_d.step()
        opt_g.zero_grad()
        bce(prob(netD, fake), torch.ones(n_fake)).backward()
        opt_g.step()
    return netD


@pytest.mark.parametrize("with_outliers", [False, True])
def test_training_matches_the_references_step_by_step(with_outliers):
    real = blobs(64, 0.0, dim=12, seed=1).features
    outliers = blobs(40, 2.0, dim=12, seed=2).features if with_outliers else None
    det = detectors.build("opengan", epochs=3, batch_size=64, seed=5)
    det.fit(FeatureSet(features=real), outliers=None if outliers is None else FeatureSet(features=outliers))
    plan = det.training_plan(with_outliers)
    assert plan == ({"joint_d": True, "joint_g": False, "bn_train": "train", "fake_fraction": 0.5} if with_outliers
                    else {"joint_d": False, "joint_g": False, "bn_train": "openood", "fake_fraction": 1.0})
    expected = _hand_training(real, 3, 5, outliers)
    got = det.discriminator.state_dict()
    for name, value in expected.state_dict().items():
        torch.testing.assert_close(got[name], value, rtol=1e-4, atol=1e-6, msg=name)
