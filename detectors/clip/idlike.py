"""ID-like (Bai et al., CVPR 2024): prompt learning with outliers mined from the ID images themselves. Random crops
most similar to "a photo of a {label}." serve as ID, the least similar as ID-like OOD; ID prompts (context + class)
and learned OOD prompts (shared context + one token each) are trained together."""
from __future__ import annotations

import random
from typing import Any, Sequence

import numpy as np
import torch
from torch.utils.data import TensorDataset
from tqdm.auto import tqdm

from detectors.clip.backbone import ClipBackbone
from detectors.clip.prompts import idlike_loss
from detectors.clip.scores import cosine
from detectors.clip.training import PROMPT_DEFAULTS, PromptDetector, train_loop
from detectors.registry import register_detector
from pipelines.runtime import item_seed


def random_crops(image: Any, n: int, seed: int, scale: Sequence[float] = (0.08, 1.0), ratio: Sequence[float] = (3 / 4, 4 / 3)) -> list[Any]:
    """`n` random crops of a PIL image (area fraction in `scale`, log-uniform aspect `ratio`), seeded."""
    rng = random.Random(seed)
    width, height = image.size
    crops = []
    for _ in range(n):
        area = width * height * rng.uniform(*scale)
        aspect = float(np.exp(rng.uniform(np.log(ratio[0]), np.log(ratio[1]))))
        w = int(round(min(width, max(1.0, (area * aspect) ** 0.5))))
        h = int(round(min(height, max(1.0, (area / aspect) ** 0.5))))
        left, top = rng.randint(0, width - w), rng.randint(0, height - h)
        crops.append(image.crop((left, top, left + w, top + h)))
    return crops


@torch.inference_mode()
def crop_embeddings(backbone: ClipBackbone, crops: Sequence[Any], batch_size: int) -> torch.Tensor:
    """Projected global embeddings [n,P] (float32, CPU) of crops."""
    out = []
    for s in range(0, len(crops), batch_size):
        with backbone.autocast():
            out.append(backbone.image_embeddings(backbone.preprocess(crops[s:s + batch_size]))[0].float().cpu())
    return torch.cat(out)


def select_crops(crop_feats: torch.Tensor, class_text: torch.Tensor, n_select: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The `n_select` crops most similar to the class prompt (ID) and the `n_select` least similar (ID-like OOD)."""
    order = cosine(crop_feats, class_text[None]).squeeze(-1).argsort(descending=True)
    return crop_feats[order[:n_select]], crop_feats[order[-n_select:]]


@register_detector("idlike")
class IDLike(PromptDetector):
    """ID + 100 OOD prompts trained on 32 ID and 32 ID-like OOD crops (of 256) per image; score = sum of the softmax
    over ID classes with the OOD prompts inside the softmax (logits cos / T, T = 0.01 = CLIP's scale 100)."""

    paper = "Bai et al., ID-like Prompt Learning for Few-Shot Out-of-Distribution Detection, CVPR 2024"
    defaults = {**PROMPT_DEFAULTS, "shots": 1, "epochs": 3, "lr": 5e-3, "weight_decay": 0.01, "train_batch": 1,
                "n_ood_prompts": 100, "n_crops": 256, "n_select": 32, "crop_scale": (0.08, 1.0), "lam_ood": 0.3,
                "lam_div": 0.2, "temperature": 0.01}
    search_space = {"temperature": [0.01, 0.1, 1.0]}
    n_ood_param = "n_ood_prompts"

    def mine_crops(self, images: Any, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """ID crops [N,S,P] and ID-like OOD crops [N,S,P] of every training image."""
        p = self.params
        if p["n_select"] > p["n_crops"]:
            raise ValueError(f"idlike: n_select ({p['n_select']}) must not exceed n_crops ({p['n_crops']})")
        class_text = self.class_text()
        id_crops, ood_crops = [], []
        for i in tqdm(range(len(images)), desc="ID-like crops", disable=not p["progress"], leave=False):
            crops = random_crops(images.load(i), p["n_crops"], item_seed(p["seed"], i), p["crop_scale"])
            feats = crop_embeddings(self.backbone, crops, p["batch_size"])
            near, far = select_crops(feats, class_text[int(labels[i])], p["n_select"])
            id_crops.append(near)
            ood_crops.append(far)
        return torch.stack(id_crops), torch.stack(ood_crops)

    def _fit(self, id_train: Any, *, id_val: Any = None, ood_val: Any = None) -> None:
        subset, labels = self.training_subset(id_train)
        id_crops, ood_crops = self.mine_crops(subset, labels)
        dataset = TensorDataset(id_crops, ood_crops, labels)
        learner, n_cls, p = self.learner, self.num_classes, self.params
        scale = self.backbone.logit_scale

        def step_loss(module: Any, batch: Any) -> torch.Tensor:
            near, far, y = batch
            text = module()
            id_logits = scale * cosine(near.flatten(0, 1), text)
            ood_logits = scale * cosine(far.flatten(0, 1), text)
            y = y.repeat_interleave(near.shape[1])
            loss, _ = idlike_loss(id_logits, y, ood_logits, text[n_cls:], n_cls, p["lam_ood"], p["lam_div"])
            return loss

        optimizer = torch.optim.AdamW([learner.ctx, learner.ood], lr=p["lr"], weight_decay=p["weight_decay"])
        self._after_fit(train_loop(learner, dataset, step_loss, epochs=p["epochs"], batch_size=p["train_batch"],
                                   optimizer=optimizer, seed=p["seed"], device=self.backbone.device,
                                   progress=p["progress"], desc="ID-like"))

    def _score(self, batch: Any) -> np.ndarray:
        logits = cosine(self.features(batch).global_, self.prompt_text()).double() / self.params["temperature"]
        return torch.softmax(logits, dim=-1)[:, : self.num_classes].sum(-1).numpy()
