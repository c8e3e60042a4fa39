"""Throughput of DIFFGUARD's batched per-sample early stop against the batch-1 loop (used by benchmarks/*.py).

The reference is the original design's constraint: samples stop inversion at different steps, so the original code
denoises one image at a time. Here the reference loop runs the same detector on one image at a time, and the batched
runs score the same images `batch_size` at a time, in the same process on the same model.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import nn

from detectors.generative.diffguard import DiffGuard, resize_center_crop


class SmallConvClassifier(nn.Module):
    """A 2-layer convnet with global average pooling and a linear head, returning (logits, features): the protected
    classifier of the CPU benchmark and the tests (wrap it with `ImageClassifier.from_module`)."""

    def __init__(self, num_classes: int = 4) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU(), nn.Conv2d(8, 16, 3, padding=1),
                                  nn.ReLU())
        self.fc = nn.Linear(16, num_classes)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.body(x).mean((2, 3))
        return self.fc(features), features


def contrast_ramp_images(n: int, size: int = 32, seed: int = 0) -> list[Image.Image]:
    """Smooth colour waves of increasing contrast: their inversions cross the PSNR threshold at different steps."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size] / size
    images = []
    for i in range(n):
        contrast = 0.15 + 0.85 * i / max(n - 1, 1)
        phases = rng.uniform(0, 2 * np.pi, 3)
        wave = 0.5 + 0.5 * contrast * np.stack([np.sin(2 * np.pi * (xx + yy) + p) for p in phases], -1)
        images.append(Image.fromarray((wave * 255).round().astype(np.uint8)))
    return images


def timed_seconds(fn: Callable[[], Any], device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def bench_early_stop_batching(detector: DiffGuard, images: list[Image.Image], batch_sizes: list[int],
                              loop_images: int | None = None, rounds: int = 1,
                              log: Callable[[str], None] = print) -> dict[str, Any]:
    """images/s of `detector.reconstruct_pixel` on `images` at each batch size and on a batch-1 loop over the first
    `loop_images` images; ratios are against the loop. The cases run interleaved for `rounds` rounds and each keeps
    its fastest round (robust to load bursts on a shared machine). Also reports the inversion stop steps."""
    device = detector.device
    size = int(detector.pixel_model().unet.config.sample_size)
    x01 = resize_center_crop(images, size, size).to(device)
    labels = detector.predict(x01)
    seeds = list(range(len(images)))
    loop_n = loop_images or len(images)
    detector.reconstruct_pixel(x01[:1], labels[:1], seeds[:1])  # warm-up
    stops = [int(detector.reconstruct_pixel(x01[i:i + 1], labels[i:i + 1], seeds[i:i + 1])[2]) for i in range(loop_n)]

    def run(batch: int, n: int) -> None:
        for start in range(0, n, batch):
            detector.reconstruct_pixel(x01[start:min(start + batch, n)], labels[start:min(start + batch, n)],
                                       seeds[start:min(start + batch, n)])

    plan = [("loop", 1, loop_n)] + [("batched", b, len(images)) for b in batch_sizes]
    best = {case: float("inf") for case in plan}
    for round_ in range(rounds):
        for case in plan:
            best[case] = min(best[case], timed_seconds(lambda case=case: run(case[1], case[2]), device))
            log(f"[diffguard] round {round_ + 1}: {case[0]} {case[1]:3d}: {case[2] / best[case]:.3f} img/s (best so "
                "far)")
    reference = loop_n / best[plan[0]]
    cases = [dict(mode=mode, batch_size=batch, images=n, seconds=best[(mode, batch, n)],
                  images_per_s=n / best[(mode, batch, n)],
                  ratio=n / best[(mode, batch, n)] / reference) for mode, batch, n in plan]
    return dict(reference="batch-1 loop", rounds=rounds, stop_steps=stops, cases=cases)


def random_diffguard_models(size: str, device: torch.device, dtype: torch.dtype) -> tuple[Any, Any, Any]:
    """(pixel UNet, Stable Diffusion pipeline, image classifier) with random weights, built on `device` in `dtype`.

    "full": guided-diffusion's 256x256 unconditional ADM (`detectors.generative.guided_diffusion.ADM_256_UNCOND`, 552.8
    M parameters, the layout of 256x256_diffusion_uncond.pt), Stable Diffusion 1.5 (UNet 859.5 M, VAE 83.7 M, CLIP ViT-L
    text encoder 123 M) and a ResNet-50 classifier at 224 px. "tiny": the pipelines.tiny stand-ins and a small ResNet at
    32 px, for a CPU check of the code path.
    """
    import tempfile

    from diffusers import AutoencoderKL, DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel, UNet2DModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer, ResNetConfig, ResNetForImageClassification

    from detectors.generative.guided_diffusion import ADM_256_UNCOND, build_unet
    from pipelines.classifier import ImageClassifier, find_head
    from pipelines.tiny import save_tiny_pixel_unet, save_tiny_stable_diffusion, save_tiny_tokenizer

    if size == "tiny":
        with tempfile.TemporaryDirectory() as tmp:
            unet = UNet2DModel.from_pretrained(save_tiny_pixel_unet(f"{tmp}/unet"))
            pipe = StableDiffusionPipeline.from_pretrained(save_tiny_stable_diffusion(f"{tmp}/sd"))
        resnet, image_size = ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], num_labels=10), 32
    elif size == "full":
        unet = build_unet(ADM_256_UNCOND)
        with tempfile.TemporaryDirectory() as tmp:
            tokenizer = CLIPTokenizer.from_pretrained(save_tiny_tokenizer(tmp))
        pipe = StableDiffusionPipeline(
            vae=AutoencoderKL(block_out_channels=(128, 256, 512, 512), down_block_types=("DownEncoderBlock2D",) * 4,
                              up_block_types=("UpDecoderBlock2D",) * 4, layers_per_block=2, latent_channels=4,
                              sample_size=512),
            text_encoder=CLIPTextModel(CLIPTextConfig(hidden_size=768, intermediate_size=3072, num_attention_heads=12,
                                                      num_hidden_layers=12, projection_dim=768)),
            tokenizer=tokenizer, unet=UNet2DConditionModel(sample_size=64, cross_attention_dim=768),
            scheduler=DDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                                    clip_sample=False, set_alpha_to_one=False, steps_offset=1),
            safety_checker=None, feature_extractor=None, requires_safety_checker=False,
        )
        resnet, image_size = ResNetConfig(num_labels=1000), 224
    else:
        raise ValueError(f"size must be 'tiny' or 'full', got {size!r}")
    model = ResNetForImageClassification(resnet).eval()
    classifier = ImageClassifier(model, find_head(model, resnet.num_labels), image_size=(image_size, image_size),
                                 kind="hf")
    return unet.to(device, dtype), pipe.to(device, dtype), classifier.to(device).eval()


def bench_latent_batching(detector: DiffGuard, images: list[Image.Image], batch_sizes: list[int],
                          loop_images: int, log: Callable[[str], None] = print) -> dict[str, Any]:
    """images/s of the latent back-end's reconstruction per batch size, with the batch-1 loop as the ratio reference."""
    device = detector.device
    side = detector.latent_model().resolution
    x01 = resize_center_crop(images, side, side).to(device)
    labels = detector.predict(x01)
    detector.reconstruct_latent(x01[:1], labels[:1])  # warm-up
    loop_s = timed_seconds(lambda: [detector.reconstruct_latent(x01[i:i + 1], labels[i:i + 1])
                                    for i in range(loop_images)], device)
    reference = loop_images / loop_s
    log(f"[diffguard-latent] batch-1 loop: {reference:.3f} img/s")
    cases = [dict(mode="loop", batch_size=1, images=loop_images, seconds=loop_s, images_per_s=reference, ratio=1.0)]
    for batch in batch_sizes:
        seconds = timed_seconds(lambda batch=batch: detector.reconstruct_latent(x01[:batch], labels[:batch]),
                                device)
        cases.append(dict(mode="batched", batch_size=batch, images=batch, seconds=seconds, images_per_s=batch / seconds,
                          ratio=batch / seconds / reference))
        log(f"[diffguard-latent] batch {batch:3d}: {batch / seconds:.3f} img/s = {batch / seconds / reference:.2f}x")
    return dict(reference="batch-1 loop", cases=cases)


def _best_of(cases: dict[str, Callable[[], Any]], rounds: int, device: torch.device) -> dict[str, float]:
    """Fastest of `rounds` interleaved timings of each case."""
    best = {name: float("inf") for name in cases}
    for _ in range(rounds):
        for name, fn in cases.items():
            best[name] = min(best[name], timed_seconds(fn, device))
    return best


def bench_early_stop_features(detector: DiffGuard, images: list[Image.Image], rounds: int = 3,
                              log: Callable[[str], None] = print) -> dict[str, Any]:
    """The early-stop rule with the input's perceptual features computed once per batch (`detector.stop_rule`)
    against the plain rule, which compares x_t with the input afresh at every inversion step. Times the rule
    alone (replayed on the inversion's recorded steps) and the whole inversion; ratios = plain / cached seconds."""
    from detectors.generative.pixel_backend import invert_with_early_stop

    model = detector.pixel_model()
    size = int(model.unet.config.sample_size)
    x0 = (2 * resize_center_crop(images, size, size) - 1).to(detector.device)
    similarity = detector.similarity(detector.params["early_stop_similarity"])
    threshold = detector.params["early_stop_similarity_threshold"]

    def previous(x_t: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        return similarity((x_t + 1) / 2, (x0[rows] + 1) / 2).to(x_t.device) < threshold

    steps: list[tuple[torch.Tensor, torch.Tensor]] = []
    recording = lambda x_t, rows: steps.append((x_t, rows)) or previous(x_t, rows)  # noqa: E731
    _, stop = invert_with_early_stop(model, x0, detector.params["max_inversion_steps"], recording)

    def replay(make_rule: Callable[[], Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]) -> None:
        rule = make_rule()
        for x_t, rows in steps:
            rule(x_t, rows)

    rule_s = _best_of({"cached": lambda: replay(lambda: detector.stop_rule(x0)),
                       "previous": lambda: replay(lambda: previous)},
                      rounds, detector.device)
    most = detector.params["max_inversion_steps"]
    inversion_s = _best_of({
        "cached": lambda: invert_with_early_stop(model, x0, most, detector.stop_rule(x0)),
        "previous": lambda: invert_with_early_stop(model, x0, most, previous),
    }, rounds, detector.device)
    result = dict(images=len(images), rule_calls=len(steps), stop_steps=stop.tolist(),
                  rule_seconds=rule_s, rule_ratio=rule_s["previous"] / rule_s["cached"],
                  inversion_seconds=inversion_s, inversion_ratio=inversion_s["previous"] / inversion_s["cached"])
    log(f"[diffguard] early-stop rule: {result['rule_ratio']:.2f}x, whole inversion: {result['inversion_ratio']:.2f}x")
    return result


def bench_gradcam_single_pass(classifier: Any, x01: torch.Tensor, rounds: int = 3,
                              log: Callable[[str], None] = print) -> dict[str, Any]:
    """Prediction + Grad-CAM from one hooked forward pass (`logits_and_cam`) against two separate passes (a
    no-grad prediction, then `grad_cam` for its labels); ratio = separate / fused seconds."""
    from detectors.generative.gradcam import grad_cam, last_spatial_block, logits_and_cam

    def logits(v: torch.Tensor) -> torch.Tensor:
        return classifier.forward_images(v)[0]

    layer = classifier.get_submodule(last_spatial_block(classifier, lambda: logits(x01[:1])))

    def previous() -> None:
        with torch.no_grad():
            labels = logits(x01).argmax(1)
        grad_cam(logits, layer, x01, labels)

    seconds = _best_of({"fused": lambda: logits_and_cam(logits, layer, x01), "previous": previous}, rounds, x01.device)
    result = dict(images=len(x01), image_size=list(x01.shape[-2:]), seconds=seconds,
                  ratio=seconds["previous"] / seconds["fused"])
    log(f"[diffguard] Grad-CAM with the prediction in its pass: {result['ratio']:.2f}x")
    return result
