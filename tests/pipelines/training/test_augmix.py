"""pipelines.training.augmix against torchvision's own AugMix (Debian's python3-torchvision 0.14, run under
/usr/bin/python3 in a separate process by torchvision_augmix.py): every op at every magnitude bin on small images, and
whole AugMix calls replayed with torchvision's recorded draws (the RNGs differ, so the draws are forced, then the
pixels must agree); the mixing formula by hand; the draws' distribution; OpenOOD's clean + two views."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from pipelines.training.augmix import BINS, AugMix, AugMixDraw, AugMixViews, apply_op, augmix_ops, magnitudes
from pipelines.training.transforms import Compose, HorizontalFlip, RandomCrop

HERE = Path(__file__).parent
SYSTEM_PYTHON = "/usr/bin/python3"


def _has_torchvision() -> bool:
    try:
        return subprocess.run([SYSTEM_PYTHON, "-c", "import torchvision"], capture_output=True).returncode == 0
    except OSError:
        return False


def _images() -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    smooth = np.clip(np.add.outer(np.arange(16) * 9, np.arange(16) * 5)[None] + rng.integers(-20, 20, (3, 16, 16)), 0,
                     255)
    return [rng.integers(0, 256, (3, 9, 11)).astype(np.uint8), smooth.astype(np.uint8),
            np.full((3, 5, 6), 77, np.uint8),  # flat: autocontrast's and equalize's degenerate case
            rng.integers(0, 256, (3, 2, 3)).astype(np.uint8)]  # too small to sharpen


def _ops() -> list[list]:
    out = []
    for op in augmix_ops(True):
        bins, signed = magnitudes(op, 16, 16)
        values = [0.0] if bins is None else [float(v) for v in bins]
        values += [-v for v in values if v] if signed else []
        modes = ("bilinear", "nearest") if op in ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate") else \
            ("bilinear",)
        out += [[op, v, mode] for v in values for mode in modes]
    return out


CALLS = [dict(severity=s, mixture_width=w, chain_depth=d, alpha=a, all_ops=o, interpolation=i, image=im, seed=seed,
              pil=pil)
         for (s, w, d, a, o, i, pil) in ((1, 3, -1, 1.0, True, "bilinear", True),  # OpenOOD's augmix_preprocessor.yml
                                         (3, 3, -1, 1.0, True, "bilinear", False),  # its CIFAR scripts' severity 3
                                         (10, 1, 2, 0.5, False, "nearest", False),
                                         (5, 4, 3, 2.0, True, "bilinear", True))
         for im in (0, 1) for seed in (0, 1, 2)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    if not _has_torchvision():
        pytest.skip(f"{SYSTEM_PYTHON} has no torchvision (Debian's python3-torchvision)")
    folder = tmp_path_factory.mktemp("augmix")
    images = _images()
    np.savez(folder / "in.npz", ops=np.array(json.dumps(_ops())), calls=np.array(json.dumps(CALLS)),
             **{f"image_{i}": im for i, im in enumerate(images)})
    script = str(HERE / "torchvision_augmix.py")
    subprocess.run([SYSTEM_PYTHON, script, str(folder / "in.npz"), str(folder / "out.npz")], check=True,
                   capture_output=True, env={"OMP_NUM_THREADS": "1"})
    out = np.load(folder / "out.npz")
    return images, {k: out[k] for k in out.files}


@pytest.mark.parametrize("image", range(4))
def test_every_op_matches_torchvision(reference, image):
    images, out = reference
    x = torch.from_numpy(images[image])[None]
    for k, (op, magnitude, mode) in enumerate(_ops()):
        ours = apply_op(x, op, magnitude, mode)[0].numpy()
        np.testing.assert_array_equal(ours, out[f"op_{image}_{k}"], err_msg=f"{op} {magnitude} {mode}")


def _replayed(record: dict) -> AugMixDraw:
    m = np.float32(record["m"])
    weights = np.float32(record["chain_weights"]) * m[1]  # torchvision: float32 Dirichlet * m[:, 1]
    return AugMixDraw((float(m[0]), float(m[1])), tuple(float(w) for w in weights),
                      tuple(tuple((op, magnitude) for op, magnitude in chain) for chain in record["chains"]))


def test_whole_calls_match_torchvision_with_its_draws(reference):
    images, out = reference
    records = json.loads(str(out["record"]))
    for j, (call, record) in enumerate(zip(CALLS, records)):
        aug = AugMix(call["severity"], call["mixture_width"], call["chain_depth"], call["alpha"], call["all_ops"],
                     call["interpolation"])
        draw = _replayed(record)
        assert len(draw.chains) == call["mixture_width"]
        ops = augmix_ops(call["all_ops"])
        for op, magnitude in (pair for chain in draw.chains for pair in chain):  # its draws lie in our space
            assert op in ops
            values, signed = magnitudes(op, images[call["image"]].shape[2], images[call["image"]].shape[1])
            allowed = {0.0} if values is None else {float(v) * s for v in values[:call["severity"]]
                                                     for s in ((1, -1) if signed else (1,))}
            assert magnitude in allowed, (op, magnitude)
        ours = aug.mix(torch.from_numpy(images[call["image"]]), draw).numpy()
        np.testing.assert_array_equal(ours, out[f"call_{j}"], err_msg=str(call))


def test_mix_formula_by_hand():
    """float64 by hand: m0 * x + sum w_i chain_i(x), truncated; chains of known ops (identity-like, posterize, solarize,
    invert-free brightness)."""
    x = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (3, 5, 7)).astype(np.uint8))
    draw = AugMixDraw((0.25, 0.75), (0.5, 0.25), ((("Posterize", 4.0), ("Solarize", 128.0)), (("Brightness", 0.5),)))
    ours = AugMix(severity=10, mixture_width=2).mix(x, draw).numpy()
    v = x.numpy().astype(np.int64)
    post = v & 0xF0
    chain1 = np.where(post >= 128, 255 - post, post)
    chain2 = np.clip(1.5 * v, 0, 255).astype(np.uint8)  # float32 blend with zeros, truncated
    expected = np.floor(0.25 * v + 0.5 * chain1 + 0.25 * chain2 + 1e-4)
    np.testing.assert_array_equal(ours, expected.astype(np.uint8))
    flat = torch.full((3, 4, 4), 200, dtype=torch.uint8)  # weights summing to 1 never leave [0, 255]
    same = AugMixDraw((0.3, 0.7), (0.7,), ((("AutoContrast", 0.0),),))
    np.testing.assert_array_equal(AugMix(mixture_width=1).mix(flat, same).numpy(), 200)


def test_draws_follow_torchvisions_distribution():
    aug = AugMix(severity=3, mixture_width=3, chain_depth=-1, alpha=1.0, all_ops=True)
    rng = np.random.default_rng(0)
    draws = [aug.draw(32, 24, rng) for _ in range(3000)]
    m0 = np.array([d.m[0] for d in draws])
    assert abs(m0.mean() - 0.5) < 0.02 and abs(m0.var() - 1 / 12) < 0.01  # Beta(1, 1): uniform
    np.testing.assert_allclose([sum(d.weights) for d in draws], [d.m[1] for d in draws], rtol=1e-5)
    depths = np.bincount([len(c) for d in draws for c in d.chains], minlength=4)[1:] / (3 * len(draws))
    np.testing.assert_allclose(depths, 1 / 3, atol=0.02)
    pairs = [p for d in draws for c in d.chains for p in c]
    ops = np.array([augmix_ops(True).index(op) for op, _ in pairs])
    np.testing.assert_allclose(np.bincount(ops, minlength=13) / len(ops), 1 / 13, atol=0.01)
    rotate = np.array([m for op, m in pairs if op == "Rotate"])
    levels = sorted({round(abs(m), 4) for m in rotate})
    assert levels == [0.0, round(30 / 9, 4), round(60 / 9, 4)]  # bins 0..severity-1 of linspace(0, 30, 10)
    assert abs((rotate < 0).sum() / (rotate != 0).sum() - 0.5) < 0.06
    translate = {abs(m) for op, m in pairs if op == "TranslateX"}
    assert max(translate) == pytest.approx(2 * 32 / 3 / 9, rel=1e-6)  # width / 3 over 9 steps
    narrow = AugMix(severity=1, mixture_width=2, chain_depth=4, all_ops=False)
    for draw in (narrow.draw(8, 8, rng) for _ in range(200)):
        assert [len(c) for c in draw.chains] == [4, 4]
        assert all(op in augmix_ops(False) and (m == 0.0 or op in ("Posterize", "Solarize"))
                   for c in draw.chains for op, m in c)


def test_magnitude_tables():
    assert magnitudes("Posterize", 8, 8)[0].tolist() == [4, 4, 3, 3, 2, 2, 1, 1, 0, 0]  # 4 - round(k / 2.25)
    assert magnitudes("Solarize", 8, 8)[0][0] == 255 and magnitudes("Solarize", 8, 8)[0][-1] == 0
    assert magnitudes("TranslateY", 30, 12)[0][-1] == pytest.approx(4.0)
    assert len(augmix_ops(True)) == 13 and len(augmix_ops(False)) == 9 and BINS == 10
    with pytest.raises(ValueError, match="severity"):
        AugMix(severity=0)
    with pytest.raises(ValueError, match="severity"):
        AugMix(severity=11)


def test_views_are_one_crop_and_two_draws(tmp_path):
    """OpenOOD's preprocessor: the clean crop, then two AugMix draws of that same crop (jsd); AugMix alone without."""
    rng_image = np.random.default_rng(1).integers(0, 256, (10, 12, 3)).astype(np.uint8)
    image = Image.fromarray(rng_image)
    base = Compose([HorizontalFlip(), RandomCrop(8, padding=2)])
    aug = AugMix(severity=3)
    views = AugMixViews(base, aug, jsd=True)(image, np.random.default_rng(5))
    assert views.shape == (3, 3, 8, 8) and views.dtype == torch.uint8
    rng = np.random.default_rng(5)
    crop = base(image, rng)
    first, second = aug(crop, rng), aug(crop, rng)
    np.testing.assert_array_equal(views[0], crop)
    np.testing.assert_array_equal(views[1], first)
    np.testing.assert_array_equal(views[2], second)
    single = AugMixViews(base, aug, jsd=False)(image, np.random.default_rng(5))
    np.testing.assert_array_equal(single, first)
    image.save(tmp_path / "a.png")
    np.testing.assert_array_equal(AugMixViews(base, aug).load(tmp_path / "a.png", np.random.default_rng(5)), views)
    assert AugMixViews(base, aug).identity() != AugMixViews(base, AugMix(severity=2)).identity()
    pil = aug(image, np.random.default_rng(2))
    assert isinstance(pil, Image.Image) and pil.size == image.size


def test_normalize_broadcasts_over_the_view_axis():
    """A collated batch of view stacks [B, 3, 3, H, W] normalises per channel as each view would alone (channels-last
    memory applies to 4-D batches only)."""
    from pipelines.training.transforms import Normalize

    x = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (2, 3, 3, 4, 5)).astype(np.uint8))
    norm = Normalize([0.4, 0.5, 0.6], [0.2, 0.25, 0.3], channels_last=True)
    out = norm(x)
    assert out.shape == x.shape
    for v in range(3):
        np.testing.assert_array_equal(out[:, v].numpy(), norm(x[:, v]).numpy())
