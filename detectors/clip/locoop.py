"""LoCoOp (Miyai et al., NeurIPS 2023): CoOp prompt learning with OOD regularisation from local features: patches
whose top-K classes miss the image's label are treated as OOD and their class-softmax entropy is maximised."""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch.utils.data import TensorDataset

from detectors.clip import scores
from detectors.clip.prompts import locoop_loss
from detectors.clip.scores import cosine
from detectors.clip.training import PROMPT_DEFAULTS, PromptDetector, train_loop
from detectors.registry import register_detector


@register_detector("locoop")
class LoCoOp(PromptDetector):
    """Learned context (16 tokens) trained with CE + 0.25 * (-entropy of OOD patches); scored with GL-MCM or MCM.

    `top_k` None takes 20% of the classes (200 of ImageNet-1k's 1000, 20 of 100). Schedule as CoOp's configs: one
    warm-up epoch at lr 1e-5, then a cosine over the epochs. Training reads the cached global and local image
    embeddings (the image tower is frozen), so no image augmentation is applied.
    """

    reads_patches = True

    reads_train_features = True
    paper = "Miyai et al., LoCoOp: Few-Shot Out-of-Distribution Detection via Prompt Learning, NeurIPS 2023"
    defaults = {**PROMPT_DEFAULTS, "epochs": 50, "lr": 0.002, "momentum": 0.9, "weight_decay": 5e-4, "train_batch": 32,
                "schedule": "cosine_epoch", "warmup_epochs": 1, "warmup_lr": 1e-5, "lam": 0.25, "top_k": None, "score_rule": "glmcm", "temperature": 1.0, "glmcm_lam": 1.0}
    search_space = {"score_rule": ["mcm", "glmcm"]}

    def top_k(self) -> int:
        k = self.params["top_k"] or math.ceil(0.2 * self.num_classes)
        if not 1 <= k <= self.num_classes:
            raise ValueError(f"locoop: top_k must lie in [1, {self.num_classes}], got {k}")
        return int(k)

    def _fit(self, id_train: Any, *, id_val: Any = None, ood_val: Any = None) -> None:
        feats, labels = self.training_features(id_train)
        dataset = TensorDataset(feats.global_, feats.local, labels)
        learner, top_k, lam = self.learner, self.top_k(), self.params["lam"]
        scale = self.backbone.logit_scale

        def step_loss(module: Any, batch: Any) -> torch.Tensor:
            global_, local, y = batch
            text = module()
            loss, _ = locoop_loss(scale * cosine(global_, text), scale * cosine(local, text), y, top_k, lam)
            return loss

        params = [learner.ctx]
        optimizer = torch.optim.SGD(params, lr=self.params["lr"], momentum=self.params["momentum"], weight_decay=self.params["weight_decay"])
        self._after_fit(train_loop(learner, dataset, step_loss, epochs=self.params["epochs"], batch_size=self.params["train_batch"],
                                   optimizer=optimizer, seed=self.params["seed"], device=self.backbone.device,
                                   schedule=self.params["schedule"], warmup_epochs=self.params["warmup_epochs"],
                                   warmup_lr=self.params["warmup_lr"], lr_log=self.lrs,
                                   progress=self.params["progress"], desc="LoCoOp"))

    def _score(self, batch: Any) -> np.ndarray:
        feats = self.features(batch)
        text, temp = self.prompt_text(), self.params["temperature"]
        rule = self.params["score_rule"]
        if rule == "mcm":
            return scores.mcm(feats.global_, text, temp)
        if rule == "glmcm":
            return scores.glmcm(feats.global_, feats.local, text, temp, self.params["glmcm_lam"])
        raise ValueError(f"locoop: score_rule must be 'mcm' or 'glmcm', got {rule!r}")
