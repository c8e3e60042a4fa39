"""Training-time detectors end to end: training moves AUROC the expected way, heads have the right sizes, state
saves."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from detectors import FeatureSet, LinearHead, build
from detectors.metrics import auroc

D, C, A = 8, 3, 4
FAST = dict(epochs=6, lr=5e-2, batch_size=32, warmup_epochs=1)
HEADS = dict(mode="heads", **FAST)


def _toy(seed: int = 0):
    """ID classes at 4*e_k (k < C). Auxiliary / OOD species k >= C sit at 4*e_(k mod C) + 4*e_k: along an ID class
    direction (a plain cross-entropy head is confident there) plus a direction only outliers have."""
    rng = np.random.default_rng(seed)
    centres = 4.0 * np.eye(D)
    centres[C:C + A] += centres[np.arange(C, C + A) % C]

    def draw(classes, n):
        labels = np.repeat(classes, n)
        return centres[labels] + rng.normal(size=(len(labels), D)), labels

    x_id, y_id = draw(np.arange(C), 60)
    x_te, y_te = draw(np.arange(C), 40)
    x_aux, aux_species = draw(np.arange(C, C + A), 40)
    x_ood, _ = draw(np.arange(C, C + A), 30)
    head = LinearHead(rng.normal(size=(C, D)) * 0.1, np.zeros(C))
    return (FeatureSet(x_id, None, y_id), FeatureSet(x_te, None, y_te), FeatureSet(x_aux, None, aux_species - C),
            FeatureSet(x_ood), head)


def _baseline_auroc(train, test, ood, head):
    """MSP AUROC of a head trained with plain cross-entropy under the same budget."""
    from pipelines.training import train_heads

    det = build("logitnorm")  # scores with MSP on whatever head it holds
    layer, _ = train_heads(head, train.features, train.labels, seed=0, **FAST)
    det.head = LinearHead(layer.weight.detach().numpy(), layer.bias.detach().numpy())
    det.fitted = True
    return auroc(det.score(test), det.score(ood))


@pytest.mark.parametrize("name,params", [
    ("oe", {}), ("energy_oe", {"m_in": -6.0, "m_out": -2.0, "margins": "fixed"}), ("energy_oe", {}), ("mixoe", {}),
    ("novel_branch", {"score_rule": "novel"}), ("extended", {"score_rule": "novel"}),
])
def test_outlier_methods_beat_plain_cross_entropy(name, params):
    train, test, aux, ood, head = _toy()
    base = _baseline_auroc(train, test, ood, head)
    det = build(name, **params, **HEADS).fit(train, head=head, id_val=test, aux=aux)
    got = auroc(det.score(test), det.score(ood))
    assert got > base + 0.2, (name, base, got)
    assert det.history[-1]["acc_label"] > 0.95


@pytest.mark.parametrize("name", ["logitnorm", "confbranch"])
def test_id_only_methods_separate_id_from_ambiguous_inputs(name):
    """From a zero head (every score equal: AUROC 0.5), training separates ID clusters from low-norm inputs that sit
    near every class boundary."""
    train, test, _, _, _ = _toy()
    rng = np.random.default_rng(5)
    ambiguous = FeatureSet(rng.normal(size=(80, D)) * 0.5)
    zero = LinearHead(np.zeros((C, D)), np.zeros(C))
    untrained = build(name)
    untrained.head, untrained.fitted = zero, True
    if name == "confbranch":
        untrained.extra = {"branch.weight": np.zeros((1, D)), "branch.bias": np.zeros(1)}
    before = auroc(untrained.score(test), untrained.score(ambiguous))
    det = build(name, **HEADS).fit(train, head=zero, id_val=test)
    after = auroc(det.score(test), det.score(ambiguous))
    assert before == pytest.approx(0.5) and after > 0.75, (name, before, after)


def test_branch_head_sizes():
    train, test, aux, ood, head = _toy()
    for name, size in (("novel_branch", C + 1), ("extended", C + A)):
        det = build(name, mode="heads", score_rule="novel", epochs=1, batch_size=32).fit(train, head=head, aux=aux)
        assert det.branch_size == size and det.extra["branch.weight"].shape == (size, D)


def test_novel_score_is_minus_novel_logit():
    train, _, aux, ood, head = _toy()
    det = build("novel_branch", mode="heads", score_rule="novel", epochs=1).fit(train, head=head, aux=aux)
    x = ood.features
    novel_logit = x @ det.extra["branch.weight"][C] + det.extra["branch.bias"][C]
    np.testing.assert_allclose(det.score(ood), -novel_logit, rtol=1e-12)


def test_clear_errors():
    train, _, aux, _, head = _toy()
    with pytest.raises(ValueError, match="aux"):
        build("oe", mode="heads", epochs=1).fit(train, head=head)
    with pytest.raises(ValueError, match="auxiliary class"):
        build("extended", mode="heads", epochs=1).fit(train, head=head,
                                                      aux=FeatureSet(aux.features, None, np.full(len(aux), -1)))
    with pytest.raises(ValueError, match="score_rule"):
        build("oe", score_rule="novel")
    with pytest.raises(ValueError, match="classifier"):
        from detectors import ImageSet

        build("logitnorm", epochs=1).fit(ImageSet(images=[np.zeros((4, 4, 3), np.uint8)]))


def test_full_mode_finetunes_the_classifier_on_images(tmp_path):
    from PIL import Image

    from pipelines.classifier import ImageClassifier
    from pipelines.data import make_row, write_manifest

    rng = np.random.default_rng(0)
    colours = {0: (220, 30, 30), 1: (30, 200, 30), "aux": (30, 30, 220)}

    def image(colour):
        return Image.fromarray(np.clip(np.array(colour)[None, None] + rng.integers(-20, 20, (12, 12, 3)), 0, 255)
                               .astype(np.uint8))

    rows, aux_rows = [], []
    for label in (0, 1):
        for i in range(6):
            image(colours[label]).save(tmp_path / f"id_{label}_{i}.png")
            rows.append(make_row(f"id_{label}_{i}.png", split="train", label=label))
    for i in range(6):
        image(colours["aux"]).save(tmp_path / f"aux_{i}.png")
        aux_rows.append(make_row(f"aux_{i}.png", split="train", role="ood", ood_set="auxiliary", species=f"s{i % 2}"))
    train = write_manifest(tmp_path, rows)
    from pipelines.data import Manifest

    aux = Manifest(tmp_path, aux_rows)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten())

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body, self.fc = net, torch.nn.Linear(4, 2)

        def forward(self, x):
            h = self.body(x)
            return self.fc(h), h

    clf = ImageClassifier.from_module(Net(), image_size=12)
    before = clf.head.weight.detach().clone()
    det = (build("extended", classifier=clf, epochs=2, batch_size=4, lr=1e-2, aux_label_field="species")
           .fit(train, aux=aux))
    assert not torch.equal(before, clf.head.weight.detach())
    np.testing.assert_allclose(det.head.weight, clf.head.weight.detach().double().numpy())
    assert det.branch_size == 2 + 2  # two ID classes + two auxiliary species


def test_energy_margins_from_data_are_the_untrained_mean_energies():
    from detectors.training.energy_oe import EnergyOELoss
    from pipelines.training import train_heads

    train, _, aux, _, head = _toy()  # 180 ID rows, 160 aux rows: whole batches of 20
    objective = EnergyOELoss(margins="data")
    train_heads(head, train.features, train.labels, aux_features=aux.features, objective=objective, epochs=1,
                batch_size=20, seed=0)

    def mean_energy(x):
        z = x @ head.weight.T + head.bias
        m = z.max(1)
        return float(np.mean(-(m + np.log(np.exp(z - m[:, None]).sum(1)))))

    assert objective.m_in == pytest.approx(mean_energy(train.features), rel=1e-5)
    assert objective.m_out == pytest.approx(mean_energy(aux.features), rel=1e-5)


def test_mixoe_cutmix_trains_on_images(tmp_path):
    from PIL import Image

    from pipelines.classifier import ImageClassifier
    from pipelines.data import make_row, write_manifest

    rng = np.random.default_rng(1)
    rows = []
    for i in range(8):
        Image.fromarray(rng.integers(0, 255, (12, 12, 3)).astype(np.uint8)).save(tmp_path / f"{i}.png")
        rows.append(make_row(f"{i}.png", split="train", label=i % 2) if i < 6 else
                    make_row(f"{i}.png", split="train", role="ood", ood_set="auxiliary"))
    manifest = write_manifest(tmp_path, rows)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten())
            self.fc = torch.nn.Linear(4, 2)

        def forward(self, x):
            h = self.body(x)
            return self.fc(h), h

    torch.manual_seed(0)
    clf = ImageClassifier.from_module(Net(), image_size=12)
    det = build("mixoe", classifier=clf, epochs=1, batch_size=3)  # the recipe: cutmix, two forward passes
    det.fit(manifest.select(role="id"), aux=manifest.select(role="ood"))
    assert np.isfinite(det.history[-1]["loss"]) and det.head.weight.shape == (2, 4)
