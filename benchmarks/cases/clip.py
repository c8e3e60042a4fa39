"""Throughput measurements of the CLIP detectors (used by benchmarks/clip.py): scoring with cached vs uncached
image features, prompt-training steps on cached features vs re-running the image tower every step (what a
straightforward CoOp/LoCoOp loop does), and the training features of a few-shot sweep (shots x seeds) sliced from one
cached pass vs embedded per subset."""
from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from detectors.base import ImageSet
from detectors.clip.backbone import ClipBackbone
from detectors.clip.prompts import PromptLearner, locoop_loss
from detectors.clip.scores import cosine


def save_random_clip(folder: str | Path, full_size: bool = False) -> Path:
    """The tiny CLIP, or (full_size) random weights with ViT-B/16 sizes (vision 768x12 at 224 px, text 512x12) and
    the tiny tokenizer."""
    from pipelines.tiny import save_tiny_clip

    folder = Path(folder)
    save_tiny_clip(folder)
    if not full_size:
        return folder
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor

    processor = CLIPProcessor.from_pretrained(folder)
    tiny = CLIPConfig.from_pretrained(folder).text_config
    text = dict(vocab_size=tiny.vocab_size, hidden_size=512, intermediate_size=2048, num_hidden_layers=12,
                num_attention_heads=8,
                max_position_embeddings=77, bos_token_id=tiny.bos_token_id, eos_token_id=tiny.eos_token_id,
                pad_token_id=tiny.pad_token_id)
    vision = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12, image_size=224,
                  patch_size=16)
    CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=512)).save_pretrained(folder)
    image_processor = CLIPImageProcessor(size={"shortest_edge": 224}, crop_size={"height": 224, "width": 224})
    CLIPProcessor(image_processor=image_processor, tokenizer=processor.tokenizer).save_pretrained(folder)
    return folder


def random_images(n: int, size: int, seed: int = 0) -> list[Any]:
    from PIL import Image

    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)) for _ in range(n)]


def _timed(fn: Callable[[], Any], device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def bench_scoring(backbone: ClipBackbone, n_images: int, batch_size: int, class_names: list[str],
                  repeats: int = 3) -> dict[str, float]:
    """images/s of MCM scoring (best of `repeats`) on a fresh image set (image tower runs) and on the same set again
    (cached embeddings); each run builds a new detector, so both include encoding the class prompts."""
    import detectors

    size = backbone.model.config.vision_config.image_size
    pils = random_images(n_images, size)
    build = lambda: detectors.build("mcm", model=backbone, class_names=class_names, embed_batch_size=batch_size)  # noqa: E731
    build().score(ImageSet(images=random_images(batch_size, size, 1)))  # warm-up
    cached_set = ImageSet(images=pils)
    build().score(cached_set)
    uncached = min(_timed(lambda: build().score(ImageSet(images=pils)), backbone.device) for _ in range(repeats))
    cached = min(_timed(lambda: build().score(cached_set), backbone.device) for _ in range(repeats))
    return {"uncached_images_per_s": n_images / uncached, "cached_images_per_s": n_images / cached,
            "cached_over_uncached": uncached / cached}


def bench_training(backbone: ClipBackbone, steps: int, batch_size: int, class_names: list[str],
                   repeats: int = 3) -> dict[str, float]:
    """LoCoOp training steps/s (best of `repeats` runs of `steps`) on cached embeddings vs with the image tower re-run
    every step."""
    size = backbone.model.config.vision_config.image_size
    device = backbone.device
    learner = PromptLearner(backbone, class_names).to(device)
    optimizer = torch.optim.SGD([learner.ctx], lr=0.002, momentum=0.9)
    pixels = backbone.preprocess(random_images(batch_size, size, 2))
    labels = torch.arange(batch_size, device=device) % len(class_names)
    with torch.no_grad(), backbone.autocast():
        cached = backbone.image_embeddings(pixels)
    top_k = max(1, len(class_names) // 5)

    def step(embed: Callable[[], tuple[torch.Tensor, torch.Tensor]]) -> None:
        with backbone.autocast():
            g, l = embed()
            text = learner()
            loss, _ = locoop_loss(100 * cosine(g, text), 100 * cosine(l, text), labels, top_k)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    def tower() -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            return backbone.image_embeddings(pixels)

    def run(embed: Callable[[], Any]) -> float:
        step(embed)  # warm-up
        return max(steps / _timed(lambda: [step(embed) for _ in range(steps)], device) for _ in range(repeats))

    per_step_tower = run(tower)
    with_cache = run(lambda: cached)
    return {"tower_steps_per_s": per_step_tower, "cached_steps_per_s": with_cache,
            "cached_over_tower": with_cache / per_step_tower}


def bench_fewshot_features(backbone: ClipBackbone, n_classes: int, per_class: int,
                           shots: tuple[int, ...] = (1, 2, 4, 8, 16),
                           seeds: tuple[int, ...] = (1, 2, 3), batch_size: int = 64) -> dict[str, float]:
    """Seconds and images embedded to get the training features of every (shots, seed) subset: one image-tower pass
    over the union of the subsets then slicing (what the sweep does) vs one pass per subset."""
    from detectors.clip.common import few_shot_indices
    from detectors.clip.features import image_features, subset_imageset

    size = backbone.model.config.vision_config.image_size
    labels = np.repeat(np.arange(n_classes), per_class)
    pils = random_images(len(labels), size, 3)
    subsets = [few_shot_indices(labels, k, s) for k in shots for s in seeds]
    union = sorted(set().union(*subsets))

    def per_subset() -> None:
        train = ImageSet(images=pils, labels=labels)
        for idx in subsets:
            image_features(backbone, subset_imageset(train, idx), batch_size=batch_size, progress=False)

    def sliced() -> None:
        train = ImageSet(images=pils, labels=labels)
        image_features(backbone, train, batch_size=batch_size, progress=False, rows=union)
        for idx in subsets:
            image_features(backbone, train, batch_size=batch_size, progress=False, rows=idx)

    t_subset, t_sliced = _timed(per_subset, backbone.device), _timed(sliced, backbone.device)
    return {"runs": len(subsets), "images_embedded_per_subset": sum(len(i) for i in subsets),
            "images_embedded_sliced": len(union), "per_subset_s": t_subset, "sliced_s": t_sliced,
            "sliced_over_per_subset": t_subset / t_sliced}


def run_benchmark(folder: str | Path, full_size: bool, n_images: int, batch_size: int, steps: int, n_classes: int,
                  device: str | None = None) -> dict[str, Any]:
    """Both measurements on a random-weight CLIP saved to `folder`; returns a JSON-ready dict."""
    backbone = ClipBackbone.load(str(save_random_clip(folder, full_size)), device=device)
    class_names = [f"class {i}" for i in range(n_classes)]
    return {"model": "ViT-B/16 sizes, random weights" if full_size else "tiny CLIP", "device": str(backbone.device),
            "n_images": n_images, "batch_size": batch_size, "steps": steps, "n_classes": n_classes,
            "scoring": bench_scoring(backbone, n_images, batch_size, class_names),
            "training": bench_training(backbone, steps, batch_size, class_names),
            "fewshot_features": bench_fewshot_features(backbone, n_classes, per_class=20, batch_size=batch_size)}
