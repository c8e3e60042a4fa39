"""LoCoOp (Miyai et al., NeurIPS 2023): CoOp prompt learning with OOD regularisation from local features: patches
whose top-K classes miss the image's label are treated as OOD and their class-softmax entropy is maximised."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from torch.utils.data import TensorDataset

from detectors.clip import scores
from detectors.clip.prompt_training import PromptDetector, Schedule, train_loop
from detectors.clip.prompts import locoop_loss
from detectors.clip.scores import cosine
from detectors.registry import register_detector
from pipelines.params import param
from pipelines.training.settings import TrainSettings, setting


@register_detector("locoop")
class LoCoOp(PromptDetector):
    """Learned context (16 tokens) trained with CE + 0.25 * (-entropy of OOD patches); scored with GL-MCM or MCM.

    `top_k` None takes 20% of the classes (200 of ImageNet-1k's 1000, 20 of 100). Schedule as CoOp's configs: one
    warm-up epoch at lr 1e-5, then a cosine over the epochs. Training reads the cached global and local image
    embeddings (the image tower is frozen), so no image augmentation is applied.
    """

    label = "LoCoOp"
    reference_code = "AtsuMiyai/LoCoOp trainers/locoop.py"
    reads_patches = True

    reads_train_features = True
    paper = "Miyai et al., LoCoOp: Few-Shot Out-of-Distribution Detection via Prompt Learning, NeurIPS 2023"

    @dataclass(frozen=True)
    class Params(PromptDetector.Params):
        training: ClassVar[TrainSettings] = TrainSettings(epochs=50, lr=0.002, weight_decay=5e-4, batch_size=32,
                                                          warmup_epochs=1)
        """The reference training (AtsuMiyai/LoCoOp `scripts/locoop/train.sh` on CoOp's configs): SGD at lr 0.002,
        weight decay 5e-4, 50 epochs of batch 32, one warm-up epoch at `warmup_lr`."""

        epochs: int = setting("epochs", default=training.epochs)
        lr: float = setting("lr", default=training.lr, doc="SGD learning rate")
        momentum: float = param(0.9, "SGD momentum", ge=0)
        weight_decay: float = setting("weight_decay", default=training.weight_decay, doc="SGD weight decay")
        train_batch: int = setting("batch_size", default=training.batch_size, doc="training batch size")
        schedule: Schedule = param("cosine_epoch", "learning-rate schedule")
        warmup_epochs: int = setting("warmup_epochs", default=training.warmup_epochs,
                                     doc="epochs at warmup_lr before the cosine")
        warmup_lr: float = param(1e-5, "warm-up learning rate", gt=0)
        lam: float = param(0.25, "weight of the OOD-patch entropy term", ge=0)
        top_k: int | None = param(None, "a patch is OOD when its label is outside its top-K classes (None: 20% of C)",
                                  ge=1, le="classes")
        score_rule: Literal["mcm", "glmcm"] = param("glmcm", "score with MCM or GL-MCM on the learned prompts")
        temperature: float = param(1.0, "softmax temperature of the score", gt=0)
        glmcm_lam: float = param(1.0, "GL-MCM's weight of the local term", ge=0)

    search_space = {"score_rule": ["mcm", "glmcm"]}

    def resolved_params(self) -> dict[str, Any]:
        return {"top_k": self.patch_top_k()} if self.params["class_names"] else {}

    def patch_top_k(self) -> int:
        """K of the OOD-patch rule: `top_k`, or 20% of the classes when it is None."""
        k = self.params["top_k"] or math.ceil(0.2 * self.num_classes)
        if not 1 <= k <= self.num_classes:
            raise ValueError(f"locoop: top_k must lie in [1, {self.num_classes}], got {k}")
        return int(k)

    def _fit(self, id_train: Any, *, id_val: Any = None, ood_val: Any = None) -> None:
        feats, labels = self.training_features(id_train)
        dataset = TensorDataset(feats.global_, feats.local, labels)
        learner, top_k, lam = self.learner, self.patch_top_k(), self.params["lam"]
        scale = self.backbone.logit_scale

        def step_loss(module: Any, batch: Any) -> torch.Tensor:
            global_, local, y = batch
            text = module()
            loss, _ = locoop_loss(scale * cosine(global_, text), scale * cosine(local, text), y, top_k, lam)
            return loss

        params = [learner.ctx]
        settings = TrainSettings.read(self.Params, self.params)
        optimizer = torch.optim.SGD(params, lr=settings.lr, momentum=self.params["momentum"],
                                    weight_decay=settings.weight_decay)
        self._after_fit(train_loop(learner, dataset, step_loss, epochs=settings.epochs,
                                   batch_size=settings.batch_size,
                                   optimizer=optimizer, seed=self.params["seed"], device=self.backbone.device,
                                   schedule=self.params["schedule"], warmup_epochs=settings.warmup_epochs,
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
