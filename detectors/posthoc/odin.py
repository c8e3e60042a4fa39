"""ODIN: temperature-scaled MSP after a small input perturbation (Liang et al., ICLR 2018).

x' = x - eps * sign(-grad_x log max_k softmax(f(x) / T)_k), applied to the normalised pixel values with the step
divided by the normalisation std per channel (as OpenOOD does), which is an eps step in [0, 1] pixel space.
"""
from __future__ import annotations

from dataclasses import dataclass

import math
from typing import Any

import numpy as np
import torch

from detectors.base import Detector, ImageSet, as_numpy
from detectors.posthoc.common import softmax
from detectors.posthoc.pixels import preprocessed
from pipelines.params import Params, param
from detectors.registry import register_detector
from pipelines.data import Manifest
from pipelines.progress import progress
from pipelines.runtime import partial_state, resolve_device, resolve_dtype


def odin_perturb(classifier: Any, pixel_values: torch.Tensor, temperature: float, noise: float) -> torch.Tensor:
    """The perturbed normalised input x - noise * sign(grad CE(f(x)/T, argmax f(x))) / std (sign(0) counts as +1)."""
    std = getattr(classifier, "std", None)
    if std is None:
        raise AttributeError("odin: the classifier needs a `std` attribute (normalisation std, shape [1,3,1,1])")
    x = pixel_values.detach().requires_grad_(True)
    with torch.enable_grad():
        logits = classifier(x)[0].float()
        pred = logits.argmax(dim=1, keepdim=True)
        # T * CE(z / T) has the gradient sign of CE(z / T) and does not underflow in half precision
        loss = -temperature * torch.log_softmax(logits / temperature, dim=1).gather(1, pred).sum()
        (grad,) = torch.autograd.grad(loss, x)
    step = torch.where(grad >= 0, 1.0, -1.0).to(x.dtype) / torch.as_tensor(std).to(device=x.device, dtype=x.dtype)
    return x.detach() - noise * step


@register_detector("odin")
class ODIN(Detector):
    """s(x) = max_k softmax(f(x') / T)_k on the perturbed input x'. Needs the classifier and images."""

    family = "posthoc"
    inputs = frozenset({"images"})
    keeps_batches = True  # a killed rerun resumes within a set (Detector.score)
    paper = "Liang et al., Enhancing the Reliability of OOD Image Detection in Neural Networks (ODIN), ICLR 2018"

    @dataclass(frozen=True)
    class Params(Params):
        temperature: float = param(1000.0, "softmax temperature T", gt=0)
        noise: float = param(0.0014, "input perturbation step (in normalised pixel units)", ge=0)

    fit_inputs = frozenset()
    needs = frozenset({"classifier", "device", "precision"})
    search_space: dict[str, list[Any]] = {"temperature": [1, 10, 100, 1000], "noise": [0.0014, 0.0028]}  # OpenOOD v1.5

    def __init__(self, classifier: Any = None, batch_size: int = 32, device: str | None = None, precision: str = "fp32",
                 **params: Any) -> None:
        """`classifier`: an ImageClassifier (forward -> (logits, features), `.preprocess`, `.std`); kept out of params.
        `device` (default: the classifier's, or the process's accelerator under accelerate) and `precision`: fp32 by
        default as in OpenOOD, also when the runner's precision is `auto` (the 0.0014 step is below bf16's resolution
        of normalised pixels, so a bf16 forward pass would quantise most of the perturbation away); an explicit
        bf16/fp16 runs the forward passes under autocast."""
        super().__init__(**params)
        self.classifier = classifier
        self.batch_size = int(batch_size)
        self.device, self.precision = device, precision
        resolve_dtype(precision)  # a bad precision fails at construction

    def _chunks(self, batch: Any) -> tuple[Any, int]:
        """Normalised pixel-value batches [b,3,H,W] and their number."""
        if isinstance(batch, ImageSet):
            return preprocessed(self.classifier, batch, self.batch_size), math.ceil(len(batch) / self.batch_size)
        if isinstance(batch, torch.Tensor) and batch.ndim == 4 and batch.is_floating_point():
            return batch.split(self.batch_size), math.ceil(len(batch) / self.batch_size)
        raise TypeError(f"odin: score takes an ImageSet or a float tensor [B,3,H,W] of preprocessed images, got "
                        f"{type(batch).__name__}{tuple(batch.shape) if isinstance(batch, torch.Tensor) else ''}")

    def _score(self, batch: Any) -> np.ndarray:
        if self.classifier is None:
            raise ValueError("odin needs the classifier: build('odin', classifier=ImageClassifier...)")
        state = partial_state()
        if isinstance(batch, ImageSet) and batch.manifest is not None and state.num_processes > 1:
            return self._score_shards(batch, state)
        return self._score_local(batch)

    def _score_shards(self, batch: ImageSet, state: Any) -> np.ndarray:
        """Each process scores its share of the rows (as feature extraction does); the scores are gathered in order."""
        from accelerate.utils import gather_object

        rows = batch.manifest.rows
        with state.split_between_processes(list(range(len(rows)))) as mine:
            part = ImageSet(manifest=Manifest(batch.manifest.root, [rows[i] for i in mine]))
            scores = self._score_local(part) if mine else np.zeros(0)
            pieces = gather_object([(list(mine), scores.tolist())])
        out = np.empty(len(rows), dtype=np.float64)
        for positions, values in pieces:
            out[positions] = values
        return out

    def _score_local(self, batch: Any) -> np.ndarray:
        temperature, noise = float(self.params["temperature"]), float(self.params["noise"])
        model = self.classifier
        if self.device is not None or partial_state().num_processes > 1:
            model.to(resolve_device(self.device) if self.device is not None else partial_state().device)
        param = next(model.parameters())
        dtype = resolve_dtype(self.precision, param.device)
        modes = [(module, module.training) for module in model.modules()]  # restored exactly, module by module
        model.eval()
        scores = []
        try:
            chunks, total = self._chunks(batch)
            for x in progress(chunks, total=total, desc="odin", leave=False, disable=total < 2):
                x = x.to(device=param.device, dtype=param.dtype)
                with torch.autocast(param.device.type, dtype=dtype, enabled=dtype != torch.float32):
                    scores.append(self._chunk_scores(model, x, temperature, noise))
        finally:
            for module, training in modes:
                module.training = training
        return np.concatenate(scores) if scores else np.zeros(0)

    def _chunk_scores(self, model: Any, x: torch.Tensor, temperature: float, noise: float) -> np.ndarray:
        """max softmax(f(x') / T) of one batch of normalised pixels (RP-ODIN re-weights it)."""
        perturbed = odin_perturb(model, x, temperature, noise)
        with torch.no_grad():
            logits = model(perturbed)[0]
        return softmax(as_numpy(logits, np.float64) / temperature).max(axis=1)
