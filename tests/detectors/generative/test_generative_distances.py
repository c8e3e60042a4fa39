"""Image similarities against independent computations (scikit-image, the PSNR formula, numpy)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from skimage.metrics import structural_similarity

from detectors.generative.distances import DISTS, LPIPS, L2Pool, build_similarity, l2, psnr, ssim, vgg16_features


def pair(seed: int = 0, size: int = 24):
    g = torch.Generator().manual_seed(seed)
    a = torch.rand(3, 3, size, size, generator=g)
    b = (a + 0.1 * torch.randn(3, 3, size, size, generator=g)).clamp(0, 1)
    return a, b


def test_ssim_matches_skimage():
    a, b = pair()
    ours = ssim(a, b).numpy()
    for i in range(len(a)):
        ref = structural_similarity(a[i].permute(1, 2, 0).double().numpy(), b[i].permute(1, 2, 0).double().numpy(),
                                    data_range=1.0, channel_axis=2, gaussian_weights=True, sigma=1.5,
                                    use_sample_covariance=False)
        assert ours[i] == pytest.approx(ref, abs=1e-10)
    assert ssim(a, a).numpy() == pytest.approx(1.0)


def test_psnr_and_l2_formulas():
    a, b = pair(1)
    mse = ((a.double() - b.double()) ** 2).reshape(len(a), -1).mean(1).numpy()
    np.testing.assert_allclose(psnr(a, b).numpy(), 10 * np.log10(1.0 / mse), rtol=1e-12)
    np.testing.assert_allclose(l2(a, b).numpy(), -np.sqrt(mse), rtol=1e-12)
    # DIFFGUARD's early-stop threshold 48.5 dB (peak 255 on [-1,1] images) is 6.39 dB on [0,1] images
    x, y = 2 * a - 1, 2 * b - 1
    code_db = 20 * np.log10(255.0 / np.sqrt(((x.double() - y.double()) ** 2).reshape(3, -1).mean(1).numpy()))
    np.testing.assert_allclose(code_db - psnr(a, b).numpy(), 48.5 - 6.39, atol=0.01)


def test_logit_l1_uses_the_classifier(tiny_classifier):
    a, b = pair(2, 32)
    sim = build_similarity("logit_l1", classifier=tiny_classifier)
    with torch.no_grad():
        la, lb = tiny_classifier.forward_images(a)[0], tiny_classifier.forward_images(b)[0]
    np.testing.assert_allclose(sim(a, b).numpy(), -(la - lb).abs().mean(1).double().numpy(), rtol=1e-6)
    with pytest.raises(ValueError, match="classifier"):
        build_similarity("logit_l1")


def test_l2pool_is_the_hann_weighted_root_mean_square():
    x = torch.rand(1, 2, 8, 8)
    out = L2Pool(2)(x)
    w = np.outer([0.5, 1, 0.5], [0.5, 1, 0.5]) / 4.0
    padded = np.pad(x.numpy()[0, 1] ** 2, 1)
    assert out[0, 1, 1, 2].item() == pytest.approx(np.sqrt((padded[2:5, 4:7] * w).sum() + 1e-12), rel=1e-5)


def test_perceptual_metrics_need_local_weights(tmp_path):
    with pytest.raises(FileNotFoundError, match="perceptual_weights"):
        build_similarity("dists")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        build_similarity("lpips", weights=str(tmp_path / "missing.pth"))


def test_perceptual_metrics_from_weight_files(tmp_path):
    torch.manual_seed(0)
    vgg = {f"features.{k}": v for k, v in vgg16_features().state_dict().items()}
    channels = sum(DISTS.channels)
    dists_file, lpips_file = tmp_path / "dists.pt", tmp_path / "lpips.pt"
    torch.save({"alpha": torch.rand(1, channels, 1, 1), "beta": torch.rand(1, channels, 1, 1)}, dists_file)
    torch.save({f"lin{k}.model.1.weight": torch.rand(1, c, 1, 1) for k, c in enumerate((64, 128, 256, 512, 512))},
               lpips_file)
    torch.save(vgg, tmp_path / "vgg16.pt")
    a, b = pair(3, 32)
    for name, extra in (("dists", dists_file), ("lpips", lpips_file)):
        sim = build_similarity(name, weights=[tmp_path / "vgg16.pt", extra])
        same, diff = sim(a, a).numpy(), sim(a, b).numpy()
        np.testing.assert_allclose(same, 1.0, atol=1e-5)
        assert (diff < same).all()
    # DISTS' input stage alone: with all weight on the raw image's structure term the formula is explicit
    state = {**vgg, "alpha": torch.zeros(1, channels, 1, 1), "beta": torch.zeros(1, channels, 1, 1)}
    state["alpha"][0, :3] = 1.0
    darker = 0.5 * b
    d = DISTS(state)(a, darker).numpy()
    ma, mb = a.double().mean((2, 3)), darker.double().mean((2, 3))
    expected = 1 - ((2 * ma * mb + 1e-6) / (ma**2 + mb**2 + 1e-6)).mean(1).numpy()
    np.testing.assert_allclose(d, expected, rtol=1e-5)
    with pytest.raises(KeyError, match="lin0"):
        LPIPS(vgg)


def test_distances_widen_to_float64_but_float32_on_mps():
    """MPS has no float64: the distances' sums widen to float32 there (`.double()` would raise), float64 elsewhere."""
    from types import SimpleNamespace

    from detectors.generative.distances import _wide

    assert _wide(torch.ones(2, dtype=torch.float16)).dtype == torch.float64
    on_mps = SimpleNamespace(device=torch.device("mps"), float=lambda: "float32", double=lambda: "float64")
    assert _wide(on_mps) == "float32"
