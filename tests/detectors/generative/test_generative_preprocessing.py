"""DIFFGUARD's reference preprocessing (cure-lab/DiffGuard), each against an independent computation: torchvision's
Resize + CenterCrop arithmetic, the official cutouts (slice + nearest F.interpolate), piq's DISTS downsampling, the
classifier / diffusion / distance views, the reference images and the ADM checkpoint path."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

import detectors
from benchmarks.cases.diffguard import SmallConvClassifier
from detectors import ImageSet
from detectors.generative.diffguard import DiffGuard, resize_center_crop
from detectors.generative.distances import DISTS, vgg16_features
from detectors.generative.pixel_backend import random_crops
from pipelines.classifier import ImageClassifier

FAST = dict(steps=10, max_inversion_steps=6, n_crops=2, early_stop_similarity=None, early_stop_psnr=15.0,
            distance="ssim")


@pytest.fixture(scope="module")
def classifier_28() -> ImageClassifier:
    """The 224-of-256 geometry at small size: the classifier sees 28 px, the diffusion model 32 px."""
    torch.manual_seed(0)
    return ImageClassifier.from_module(SmallConvClassifier().eval(), image_size=28).eval()


def test_resize_center_crop_is_torchvision_resize_then_center_crop():
    # no resize needed (short side = 256): the crop offsets are int(round((side - 224) / 2)), round half to even
    rows = np.repeat(np.arange(293)[:, None], 256, axis=1)  # pixel = its row index (low byte, high byte)
    cols = np.repeat(np.arange(256)[None, :], 293, axis=0)
    tall = Image.fromarray(np.stack([rows % 256, rows // 256, cols], -1).astype(np.uint8))
    out = np.rint(resize_center_crop([tall], 256, 224)[0].numpy() * 255)
    assert out.shape == (3, 224, 224)
    np.testing.assert_array_equal(out[0, :, 0] + 256 * out[1, :, 0], np.arange(34, 34 + 224))  # 34.5 -> 34
    np.testing.assert_array_equal(out[2, 0], np.arange(16, 16 + 224))
    # resize: short side -> 256, long side int(256 * 333 / 250) = 340 (truncated, not 341), PIL bilinear
    rng = np.random.default_rng(0)
    wide = Image.fromarray(rng.integers(0, 256, (250, 333, 3), dtype=np.uint8))
    expected = np.asarray(wide.resize((340, 256), Image.BILINEAR), dtype=np.float32)[16:240, 58:282] / 255
    np.testing.assert_allclose(resize_center_crop([wide], 256, 224)[0].permute(1, 2, 0).numpy(), expected, atol=1e-7)
    with pytest.raises(ValueError, match="larger"):
        resize_center_crop([wide], 200, 224)


def test_guidance_crops_are_the_official_nearest_cutouts():
    x = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0), requires_grad=True)
    crops = random_crops(x, 4, 28, [torch.Generator().manual_seed(s) for s in (5, 6)])
    assert crops.shape == (8, 3, 28, 28)
    # DIFFGUARD's MakeCutouts with the same draws: side int(u * (32 - 28) + 28), offsets, slice, nearest resize
    for b, seed in enumerate((5, 6)):
        gen = torch.Generator().manual_seed(seed)
        for j in range(4):
            side = int(torch.rand([], generator=gen) * (32 - 28) + 28)
            ox = int(torch.randint(0, 32 - side + 1, (), generator=gen))
            oy = int(torch.randint(0, 32 - side + 1, (), generator=gen))
            cutout = x[b:b + 1, :, oy:oy + side, ox:ox + side]
            torch.testing.assert_close(crops[4 * b + j], F.interpolate(cutout, 28)[0], atol=0, rtol=0)
    crops.sum().backward()  # differentiable: the guidance gradient reaches the image
    assert x.grad.abs().sum() > 0


@pytest.mark.slow
def test_dists_downsamples_inputs_over_256_pixels_like_piq():
    torch.manual_seed(0)
    state = {f"features.{k}": v for k, v in vgg16_features().state_dict().items()}
    state.update(alpha=torch.rand(1, sum(DISTS.channels), 1, 1), beta=torch.rand(1, sum(DISTS.channels), 1, 1))
    dists = DISTS(state)
    g = torch.Generator().manual_seed(1)
    a, b = torch.rand(1, 3, 262, 270, generator=g), torch.rand(1, 3, 262, 270, generator=g)

    def piq_resize(x):  # piq.DISTS.forward: scale 256 / short side, bilinear, given scale factor
        return F.interpolate(x, scale_factor=256 / 262, recompute_scale_factor=False, mode="bilinear",
                             align_corners=False)

    assert piq_resize(a).shape[-2:] == (256, 263)
    with torch.no_grad():
        torch.testing.assert_close(dists(a, b), dists(piq_resize(a), piq_resize(b)), atol=1e-6, rtol=0)
        assert dists.features(a[..., :256, :256])[0].shape[-2:] == (256, 256)  # at 256 px nothing is resized


class Recording(DiffGuard):
    """DIFFGUARD whose pixel reconstruction is replaced by a record of its input (guided = 1 - x, unguided = x / 2)."""

    seen: list[torch.Tensor]

    def reconstruct_pixel(self, x01, labels, seeds, unguided=True, progress=False):
        self.seen.append(x01)
        return 1 - x01, (x01 / 2 if unguided else None), torch.zeros(len(x01), dtype=torch.long)


def test_pixel_views_classifier_crop_diffusion_resize_distance_at_crop(pixel_unet, classifier_28):
    image = Image.fromarray(np.random.default_rng(2).integers(0, 256, (40, 50, 3), dtype=np.uint8))
    x = resize_center_crop([image], 32, 28)  # Resize(28 * 256 / 224 = 32) + CenterCrop(28)
    distances = []
    for reference, expected_ref in (("auto", x / 2), ("unguided", x / 2), ("input", x)):
        det = Recording(classifier=classifier_28, unet=pixel_unet, reference=reference, **FAST)
        det.seen = []
        det._similarities["ssim"] = lambda a, b: distances.append((a, b)) or torch.zeros(len(a))
        det.score(ImageSet(images=[image]))
        torch.testing.assert_close(det.seen[0], F.interpolate(x, size=(32, 32), mode="bilinear", align_corners=False))
        guided, ref = distances[-1]
        assert guided.shape[-2:] == ref.shape[-2:] == (28, 28)
        back = F.interpolate(1 - det.seen[0], size=(28, 28), mode="bilinear", align_corners=False)
        torch.testing.assert_close(guided, back)
        torch.testing.assert_close(ref, F.interpolate(F.interpolate(expected_ref, size=(32, 32), mode="bilinear"),
                                                      size=(28, 28), mode="bilinear") if reference != "input" else x)


def test_reference_image_defaults_and_precision(pixel_unet, classifier_28, monkeypatch):
    assert detectors.build("diffguard", classifier=classifier_28).reference_image == "unguided"  # exp6.1 uncond_aux
    assert detectors.build("diffguard", backend="latent", classifier=classifier_28).reference_image == "input"
    assert detectors.build("diffguard", backend="latent", reference="unguided").reference_image == "unguided"
    with pytest.raises(ValueError, match="reference"):
        detectors.build("diffguard", reference="noise")
    det = detectors.build("diffguard", classifier=classifier_28)
    assert det.dtype == torch.float32  # CPU
    monkeypatch.setattr(DiffGuard, "device", property(lambda self: torch.device("cuda")))
    assert det.dtype == torch.float16  # guided-diffusion's use_fp16, not bf16


def test_latent_unguided_reference_is_the_null_text_reconstruction(sd_folder, classifier_28, synthetic):
    common = dict(backend="latent", sd_id=str(sd_folder), latent_steps=3, class_names=["a", "b", "c", "d"])
    det = detectors.build("diffguard", classifier=classifier_28, **common)
    x = resize_center_crop(synthetic(2, seed=4), 32, 32)
    labels, guided, plain = det.reconstruct_latent(x, unguided=True)
    empty = detectors.build("diffguard", classifier=classifier_28, cam_threshold=2.0, pipeline=det.latent_model().pipe,
                            **common)
    # an empty Grad-CAM mask = the null text everywhere; compared within one batch layout, since DDIM inversion with
    # random tiny weights amplifies the 1e-5 batch-size-dependent GEMM rounding of the UNet into visible differences
    _, no_guidance, empty_plain = empty.reconstruct_latent(x, labels, unguided=True)
    torch.testing.assert_close(no_guidance, empty_plain, atol=1e-5, rtol=0)
    torch.testing.assert_close(plain, empty_plain, atol=1e-5, rtol=0)
    assert not torch.allclose(guided, plain, atol=1e-3)  # the guidance inside the mask changes the reconstruction
    # given = predicted labels
    torch.testing.assert_close(guided, det.reconstruct_latent(x, labels, unguided=True)[1], atol=1e-5, rtol=0)


@pytest.mark.slow
def test_pixel_backend_loads_an_adm_checkpoint_file(classifier_28, tmp_path, synthetic):
    script_util = (pytest.importorskip("guided_diffusion.script_util",
                                       reason="pip install --no-deps guided-diffusion-sdk"))
    from detectors.generative.guided_diffusion import resolve_flags, shrink_flags

    flags = shrink_flags()
    kwargs = {k: v for k, v in resolve_flags(flags).items() if k not in ("diffusion_steps", "noise_schedule")}
    torch.manual_seed(0)
    official = script_util.create_model(**{**kwargs, "use_fp16": False}).eval()
    with torch.no_grad():
        for p in official.parameters():  # the zero-initialised output convolution would make every output 0
            p.normal_(0, 0.05) if p.dim() > 1 else p.normal_(0, 0.5)
    torch.save(official.state_dict(), tmp_path / "256x256_diffusion_uncond.pt")
    det = detectors.build("diffguard", classifier=classifier_28, unet_id=str(tmp_path / "256x256_diffusion_uncond.pt"),
                          adm_flags=flags, **{**FAST, "steps": 4, "max_inversion_steps": 3, "n_crops": 1})
    scores = det.score(ImageSet(images=synthetic(2, seed=5)))
    assert scores.shape == (2,) and np.isfinite(scores).all()
    # learned sigma: 6 output channels, DIFFGUARD uses the epsilon half at the respaced step's training timestep
    model = det.pixel_model()
    x = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(6)) * 2 - 1
    with torch.no_grad():
        expected = official(x, model.timesteps[2].expand(2))
    assert expected.shape[1] == 6
    torch.testing.assert_close(model.eps(x, 2), expected[:, :3], atol=1e-5, rtol=0)


def test_shared_crop_seeds_replay_the_official_generator_reset(classifier_28):
    from pipelines.runtime import item_seed

    det = detectors.build("diffguard", classifier=classifier_28)
    assert det.params["seed"] == 100  # testOOD/conf/config.yaml seed
    assert det.crop_seed_list(["a.png", "b.png"]) == [100, 100]
    # DIFFGUARD draws every image's cutouts from torch.Generator().manual_seed(100), reset before each image
    x = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    ours = random_crops(x, 8, 28, [torch.Generator().manual_seed(s) for s in det.crop_seed_list(["a.png", "b.png"])])
    official = random_crops(x[1:], 8, 28, [torch.Generator().manual_seed(100)])
    torch.testing.assert_close(ours[8:], official, atol=0, rtol=0)
    per_image = detectors.build("diffguard", classifier=classifier_28, crop_seeds="per_image", seed=7)
    assert per_image.crop_seed_list(["a.png", "b.png"]) == [item_seed(7, "a.png"), item_seed(7, "b.png")]
    with pytest.raises(ValueError, match="crop_seeds"):
        detectors.build("diffguard", crop_seeds="random")
