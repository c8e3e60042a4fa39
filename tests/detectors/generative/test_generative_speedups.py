"""DIFFGUARD's speed-ups give the plain computation's values: the early-stop rule computes the input's perceptual
features once per batch; Grad-CAM takes the prediction from its own forward pass."""
from __future__ import annotations

import pytest
import torch

import detectors
from detectors.generative.diffguard import resize_center_crop
from detectors.generative.distances import DISTS, against, vgg16_features
from detectors.generative.gradcam import grad_cam, last_spatial_block, logits_and_cam
from detectors.generative.pixel_backend import PixelDiffusion, invert_with_early_stop


@pytest.fixture(scope="module")
def dists_files(tmp_path_factory):
    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("dists")
    torch.save({f"features.{k}": v for k, v in vgg16_features().state_dict().items()}, root / "vgg16.pt")
    channels = sum(DISTS.channels)
    torch.save({"alpha": torch.rand(1, channels, 1, 1), "beta": torch.rand(1, channels, 1, 1)}, root / "dists.pt")
    return [root / "vgg16.pt", root / "dists.pt"]


def test_early_stop_rule_computes_the_input_features_once(pixel_unet, tiny_classifier, dists_files, synthetic,
                                                          monkeypatch):
    det = detectors.build("diffguard", classifier=tiny_classifier, perceptual_weights=dists_files, early_stop_psnr=None,
                          early_stop_similarity="dists", early_stop_similarity_threshold=0.95)
    similarity = det.similarity("dists")
    x0 = 2 * resize_center_crop(synthetic(4), 32, 32) - 1
    g = torch.Generator().manual_seed(0)
    x_t = x0 + 0.3 * torch.randn(x0.shape, generator=g)
    rows = torch.tensor([3, 0, 2])
    # the same values as comparing with the input rows directly (the plain computation)
    cached = against(similarity, (x0 + 1) / 2)((x_t[rows] + 1) / 2, rows)
    plain = similarity((x_t[rows] + 1) / 2, (x0[rows] + 1) / 2)
    torch.testing.assert_close(cached, plain, atol=1e-6, rtol=0)
    # over a whole inversion: one feature pass for the input batch plus one per step for x_t (the input's is cached)
    calls: list[int] = []
    original = DISTS.features
    monkeypatch.setattr(DISTS, "features", lambda self, x: calls.append(len(x)) or original(self, x))
    model = PixelDiffusion.build(pixel_unet, steps=10)
    latents, stop = invert_with_early_stop(model, x0, 8, det.stop_rule(x0))
    steps = int(stop.max()) + 1
    assert calls[0] == 4 and len(calls) == 1 + min(steps, 7)  # the last step has no rule
    # ... and the same stop steps as the plain rule, similarity(x_t, x0) at every step
    threshold = det.params["early_stop_similarity_threshold"]
    previous = lambda x, rows: similarity((x + 1) / 2, (x0[rows] + 1) / 2) < threshold  # noqa: E731
    latents_prev, stop_prev = invert_with_early_stop(model, x0, 8, previous)
    assert stop.tolist() == stop_prev.tolist() and len(set(stop.tolist())) > 1
    torch.testing.assert_close(latents, latents_prev)


def test_grad_cam_takes_the_prediction_from_its_own_forward_pass(tiny_classifier, sd_folder, synthetic):
    x = torch.rand(3, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    layer = tiny_classifier.get_submodule(last_spatial_block(tiny_classifier,
                                                             lambda: tiny_classifier.forward_images(x[:1])))
    calls = []
    handle = tiny_classifier.register_forward_hook(lambda *args: calls.append(1))
    logits_fn = lambda v: tiny_classifier.forward_images(v)[0]  # noqa: E731
    try:
        logits, cam = logits_and_cam(logits_fn, layer, x)
        assert len(calls) == 1
        with torch.no_grad():  # the plain computation: a prediction pass, then the hooked pass for its labels
            predicted = logits_fn(x)
        previous = grad_cam(logits_fn, layer, x, predicted.argmax(1))
        assert len(calls) == 3
    finally:
        handle.remove()
    torch.testing.assert_close(logits, predicted)
    torch.testing.assert_close(cam, previous, atol=0, rtol=0)
    # the latent back-end predicts inside its Grad-CAM pass: one classifier forward per batch
    det = detectors.build("diffguard", backend="latent", classifier=tiny_classifier, sd_id=str(sd_folder),
                          latent_steps=2, class_names=["a", "b", "c", "d"])
    x01 = resize_center_crop(synthetic(2), 32, 32)
    det.cam_layer(x01)  # the block is found once per detector
    calls.clear()
    handle = tiny_classifier.register_forward_hook(lambda *args: calls.append(1))
    try:
        labels, _, _ = det.reconstruct_latent(x01)
    finally:
        handle.remove()
    assert len(calls) == 1 and labels.tolist() == det.predict(x01).tolist()
