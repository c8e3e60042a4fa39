"""ID-like (Bai et al., CVPR 2024): prompt learning with outliers mined from the ID images themselves. Every epoch,
fresh random-resized crops (with horizontal flips) of each training image are embedded; those most similar to
"a photo of a {label}." serve as ID, the least similar as ID-like OOD. ID prompts (context + class) and OOD prompts
(their own context + one learned token each) are trained together with AdamW at a constant learning rate.

Reference: the authors' code (utils/id_like.py, utils/id_like_loss.py: `get_in_out`, `select_in_out`, `get_loss`,
`get_prompts`); ycfate/ID-like holds the README only.
"""
from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from torch.utils.data import TensorDataset

from detectors.clip.backbone import ClipBackbone
from detectors.clip.features import subset_imageset
from detectors.clip.prompt_training import PromptDetector, Schedule, train_loop
from detectors.clip.prompts import idlike_loss
from detectors.clip.scores import cosine
from detectors.registry import register_detector
from pipelines.params import param
from pipelines.progress import progress as progress_bar
from pipelines.runtime import item_seed
from pipelines.training.settings import TrainSettings, setting

IDLIKE_TEMPLATE = "a photo of a {}."  # the crop-selection prompt of the official code (with a full stop)


def resized_crop_box(width: int, height: int, rng: random.Random, scale: Sequence[float] = (0.08, 1.0),
                     ratio: Sequence[float] = (3 / 4, 4 / 3)) -> tuple[int, int, int, int]:
    """(left, top, w, h) of one RandomResizedCrop draw (torchvision's rule): up to 10 tries of an area fraction in
    `scale` and a log-uniform aspect in `ratio` that fits the image; else the largest centred crop whose aspect is
    clamped to `ratio`."""
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(*log_ratio))
        w, h = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return rng.randint(0, width - w), rng.randint(0, height - h), w, h
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        w, h = int(round(height * max(ratio))), height
    else:
        w, h = width, height
    return (width - w) // 2, (height - h) // 2, w, h


def random_crops(image: Any, n: int, seed: int, scale: Sequence[float] = (0.08, 1.0),
                 ratio: Sequence[float] = (3 / 4, 4 / 3), size: int | None = None, flip: bool = True) -> list[Any]:
    """`n` RandomResizedCrop crops of a PIL image, each resized to `size` x `size` (when given) and mirrored with
    probability 1/2 (`flip`), seeded."""
    from PIL import Image

    rng = random.Random(seed)
    crops = []
    for _ in range(n):
        left, top, w, h = resized_crop_box(image.width, image.height, rng, scale, ratio)
        crop = image.crop((left, top, left + w, top + h))
        if size is not None:
            crop = crop.resize((size, size), Image.BILINEAR)
        mirror = rng.random() < 0.5  # drawn either way: the boxes do not depend on `flip`
        if flip and mirror:
            crop = crop.transpose(Image.FLIP_LEFT_RIGHT)
        crops.append(crop)
    return crops


@torch.inference_mode()
def crop_embeddings(backbone: ClipBackbone, crops: Sequence[Any], batch_size: int) -> torch.Tensor:
    """Projected global embeddings [n,P] (float32, CPU) of crops."""
    out = []
    for s in range(0, len(crops), batch_size):
        with backbone.autocast():
            out.append(backbone.image_embeddings(backbone.preprocess(crops[s:s + batch_size]))[0].float().cpu())
    return torch.cat(out)


def select_crops(crop_feats: torch.Tensor, class_text: torch.Tensor,
                 n_select: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The `n_select` crops most similar to the class prompt (ID) and the `n_select` least similar (ID-like OOD)."""
    order = cosine(crop_feats, class_text[None]).squeeze(-1).argsort(descending=True)
    return crop_feats[order[:n_select]], crop_feats[order[-n_select:]]


@register_detector("idlike")
class IDLike(PromptDetector):
    """ID + 100 OOD prompts (own 16-token OOD context, `shared_ood_ctx=True` shares the ID context) trained on 32 ID
    and 32 ID-like OOD crops (of 256 fresh RandomResizedCrop + flip crops per image and epoch; `fixed_crops=True`
    mines them once) per image; AdamW lr 5e-3 (torch's default weight decay 0.01) held constant (`schedule`);
    score = sum of the softmax over ID classes with the OOD prompts inside the softmax (logits cos / T, T = 0.01 =
    CLIP's logit scale 100, as the official test)."""

    label = "ID-like"
    reference_code = "the authors' ID-like code utils/id_like.py"
    paper = "Bai et al., ID-like Prompt Learning for Few-Shot Out-of-Distribution Detection, CVPR 2024"

    @dataclass(frozen=True)
    class Params(PromptDetector.Params):
        training: ClassVar[TrainSettings] = TrainSettings(epochs=3, lr=5e-3, weight_decay=0.01, batch_size=1)
        """The reference training (the authors' `utils/id_like.py`): AdamW at lr 5e-3 with torch's default weight
        decay 0.01, 3 epochs, one image per batch."""

        templates: list[str] | None = param([IDLIKE_TEMPLATE], "class prompt used to rank the crops")
        shots: int | None = param(1, "training images per class (None: all)", ge=1)
        epochs: int = setting("epochs", default=training.epochs)
        lr: float = setting("lr", default=training.lr)
        weight_decay: float = setting("weight_decay", default=training.weight_decay)
        schedule: Schedule = param("constant", "learning-rate schedule")
        train_batch: int = setting("batch_size", default=training.batch_size, doc="training images per batch")
        n_ood_prompts: int = param(100, "learned OOD prompts", ge=1)
        shared_ood_ctx: bool = param(False, "the OOD prompts share the ID context")
        n_crops: int = param(256, "random crops per image and epoch", ge=1)
        n_select: int = param(32, "ID crops and ID-like OOD crops kept per image (<= n_crops)", ge=1)
        crop_scale: tuple[float, float] = param((0.08, 1.0), "RandomResizedCrop area range")
        crop_ratio: tuple[float, float] = param((3 / 4, 4 / 3), "RandomResizedCrop aspect-ratio range")
        flip: bool = param(True, "random horizontal flips")
        fixed_crops: bool = param(False, "mine the crops once instead of every epoch")
        lam_ood: float = param(0.3, "weight of the OOD-prompt loss", ge=0)
        lam_div: float = param(0.2, "weight of the prompt-diversity loss", ge=0)
        temperature: float = param(0.01, "softmax temperature of the score", gt=0)

        def check(self, dims: dict[str, int] | None = None) -> None:
            super().check(dims)
            if self.n_select > self.n_crops:
                raise ValueError(f"n_select ({self.n_select}) must not exceed n_crops ({self.n_crops})")

    search_space = {"temperature": [0.01, 0.1, 1.0]}
    n_ood_param = "n_ood_prompts"

    def mine_crops(self, images: Any, labels: torch.Tensor, epoch: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """ID crops [N,S,P] and ID-like OOD crops [N,S,P] of every training image, from the crops of `epoch`."""
        p = self.params
        class_text = self.class_text()
        size = self.backbone.model.config.vision_config.image_size
        id_crops, ood_crops = [], []
        for i in progress_bar(range(len(images)), desc=f"ID-like crops (epoch {epoch})", disable=not p["progress"],
                              leave=False):
            crops = random_crops(images.load(i), p["n_crops"], item_seed(p["seed"], f"{epoch}:{i}"), p["crop_scale"],
                                 p["crop_ratio"], size, p["flip"])
            feats = crop_embeddings(self.backbone, crops, p["embed_batch_size"])
            near, far = select_crops(feats, class_text[int(labels[i])], p["n_select"])
            id_crops.append(near)
            ood_crops.append(far)
        return torch.stack(id_crops), torch.stack(ood_crops)

    def _fit(self, id_train: Any, *, id_val: Any = None, ood_val: Any = None) -> None:
        idx = self.shot_indices(id_train)
        subset = subset_imageset(id_train, idx) if len(idx) < len(id_train) else id_train
        labels = torch.as_tensor(np.asarray(id_train.labels)[idx], dtype=torch.long)
        learner, n_cls, p = self.learner, self.num_classes, self.params
        scale = self.backbone.logit_scale
        fixed: list[TensorDataset] = []

        def epoch_data(epoch: int) -> TensorDataset:
            if p["fixed_crops"] and fixed:
                return fixed[0]
            data = TensorDataset(*self.mine_crops(subset, labels, epoch), labels)
            fixed.append(data)
            return data

        def step_loss(module: Any, batch: Any) -> torch.Tensor:
            near, far, y = batch
            text = module()
            id_logits = scale * cosine(near.flatten(0, 1), text)
            ood_logits = scale * cosine(far.flatten(0, 1), text)
            y = y.repeat_interleave(near.shape[1])
            loss, _ = idlike_loss(id_logits, y, ood_logits, text[n_cls:], n_cls, p["lam_ood"], p["lam_div"])
            return loss

        params = [t for t in (learner.ctx, learner.ood, learner.ood_ctx) if t.numel()]
        settings = TrainSettings.read(self.Params, p)
        optimizer = torch.optim.AdamW(params, lr=settings.lr, weight_decay=settings.weight_decay)
        self.lrs = []
        self._after_fit(train_loop(learner, epoch_data, step_loss, epochs=settings.epochs,
                                   batch_size=settings.batch_size,
                                   optimizer=optimizer, seed=p["seed"], device=self.backbone.device,
                                   schedule=p["schedule"], lr_log=self.lrs, progress=p["progress"], desc="ID-like"))

    def _score(self, batch: Any) -> np.ndarray:
        logits = cosine(self.features(batch).global_, self.prompt_text()).double() / self.params["temperature"]
        return torch.softmax(logits, dim=-1)[:, : self.num_classes].sum(-1).numpy()
