"""ODIN: temperature-scaled MSP after a small input perturbation (Liang et al., ICLR 2018).

x' = x - eps * sign(-grad_x log max_k softmax(f(x) / T)_k) / s, applied to the normalised pixel values. OpenOOD's
`odin_postprocessor.py:18-21` (Open-Insect's copy: the same lines) sets s to the std of
`normalization_dict[dataset.name]` (`preprocessors/transform.py:3-12`) and to 0.5 for a dataset name missing there.
OpenOOD v1.5's evaluation API names the benchmark (imagenet, ...: `evaluation_api/postprocessor.py:94-95`), so s is the
normalisation std, an eps step in [0, 1] pixel space (`grad_std: null`, the default and `exact`'s); Open-Insect's
`scripts/eval.sh:67` sets `dataset.name` to the region, which the table lacks, so s = 0.5 there (`grad_std: 0.5`,
protocol `open-insects`, ODIN and RP-ODIN alike; `REFERENCE_GRAD_STD`, which MDSEns's postprocessor divides by too).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from detectors.base import Detector, ImageSet, as_numpy
from detectors.posthoc.common import softmax
from detectors.posthoc.pixels import pixel_batches
from detectors.registry import register_detector
from pipelines.collectives import sharing
from pipelines.data import Manifest
from pipelines.params import Params, param
from pipelines.progress import progress
from pipelines.runtime import partial_state, resolve_device, resolve_dtype

REFERENCE_GRAD_STD = 0.5
"""The gradient divisor of OpenOOD's ODIN for a dataset name missing from its normalisation table
(`odin_postprocessor.py:20-21`): what Open-Insect's runs divide by; MDSEns's postprocessor divides by it always."""


def odin_perturb(classifier: Any, pixel_values: torch.Tensor, temperature: float, noise: float,
                 grad_std: float | None = None) -> torch.Tensor:
    """The perturbed normalised input x - noise * sign(grad CE(f(x)/T, argmax f(x))) / s (sign(0) counts as +1), s the
    classifier's normalisation std per channel, or `grad_std` for every channel when given."""
    x, grad = input_gradient(classifier, pixel_values, temperature)
    return x - noise * sign_step(classifier, grad, grad_std)


def input_gradient(classifier: Any, pixel_values: torch.Tensor,
                   temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(x detached, grad_x of T * CE(f(x)/T, argmax f(x))): the gradient ODIN's step takes the sign of (T times the
    reference's, the same signs and ranking of magnitudes)."""
    x = pixel_values.detach().requires_grad_(True)
    with torch.enable_grad():
        logits = classifier(x)[0].float()
        pred = logits.argmax(dim=1, keepdim=True)
        # T * CE(z / T) has the gradient sign of CE(z / T) and does not underflow in half precision
        loss = -temperature * torch.log_softmax(logits / temperature, dim=1).gather(1, pred).sum()
        (grad,) = torch.autograd.grad(loss, x)
    return x.detach(), grad


def sign_step(classifier: Any, grad: torch.Tensor, grad_std: float | None = None) -> torch.Tensor:
    """sign(grad) (sign(0) = +1) over the classifier's normalisation std per channel, or over `grad_std`."""
    std = getattr(classifier, "std", None) if grad_std is None else torch.tensor(float(grad_std))
    if std is None:
        raise AttributeError("odin: the classifier needs a `std` attribute (normalisation std, shape [1,3,1,1])")
    return torch.where(grad >= 0, 1.0, -1.0).to(grad.dtype) / torch.as_tensor(std).to(device=grad.device,
                                                                                        dtype=grad.dtype)


@register_detector("odin")
class ODIN(Detector):
    """s(x) = max_k softmax(f(x') / T)_k on the perturbed input x'. Needs the classifier and images."""

    label = "ODIN"
    reference_code = "OpenOOD openood/postprocessors/odin_postprocessor.py"
    family = "posthoc"
    inputs = frozenset({"images"})
    keeps_batches = True  # a killed rerun resumes within a set (Detector.score)
    paper = "Liang et al., Enhancing the Reliability of OOD Image Detection in Neural Networks (ODIN), ICLR 2018"

    @dataclass(frozen=True)
    class Params(Params):
        temperature: float = param(1000.0, "softmax temperature T", gt=0)
        noise: float = param(0.0014, "input perturbation step (in normalised pixel units)", ge=0)
        grad_std: float | None = param(None, "divisor of the gradient sign: null the classifier's normalisation std "
                                             "(OpenOOD on a named benchmark), 0.5 Open-Insect's runs", gt=0)

    needs = frozenset({"classifier", "device", "precision"})
    search_space: dict[str, list[Any]] = {"temperature": [1, 10, 100, 1000], "noise": [0.0014, 0.0028]}  # OpenOOD v1.5
    # Open-Insect's eval.sh:67 names the region, missing from transform.py:3-12: odin_postprocessor.py:18-21 takes 0.5
    protocol_defaults = {"open-insects": {"grad_std": REFERENCE_GRAD_STD}}

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

    def _score(self, batch: Any) -> np.ndarray:
        if self.classifier is None:
            raise ValueError("odin needs the classifier: build('odin', classifier=ImageClassifier...)")
        state = partial_state()
        if isinstance(batch, ImageSet) and batch.manifest is not None and sharing() > 1:
            return self._score_shards(batch, state)
        return self._score_local(batch)

    def _score_shards(self, batch: ImageSet, state: Any) -> np.ndarray:
        """Each process scores its share of the rows (as feature extraction does); the scores are gathered in order."""
        from pipelines.collectives import all_gather, share

        rows = batch.manifest.rows
        mine = list(share(len(rows), state.process_index, state.num_processes))
        part = ImageSet(manifest=Manifest(batch.manifest.root, [rows[i] for i in mine]), pixels=batch.pixels,
                        seed=batch.seed, num_workers=batch.num_workers, offset=batch.offset + (mine[0] if mine else 0))
        scores = self._score_local(part) if mine else np.zeros(0)
        pieces = all_gather((mine, scores.tolist()), f"{self.name}'s sharded scores")
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
            chunks, total = pixel_batches(model, batch, self.batch_size, self.name)
            for x in progress(chunks, total=total, desc=self.name, leave=False, disable=total < 2):
                with torch.autocast(param.device.type, dtype=dtype, enabled=dtype != torch.float32):
                    scores.append(self._chunk_scores(model, x, temperature, noise))
        finally:
            for module, training in modes:
                module.training = training
        return np.concatenate(scores) if scores else np.zeros(0)

    def _chunk_scores(self, model: Any, x: torch.Tensor, temperature: float, noise: float) -> np.ndarray:
        """max softmax(f(x') / T) of one batch of normalised pixels (RP-ODIN re-weights it)."""
        perturbed = odin_perturb(model, x, temperature, noise, self.params["grad_std"])
        with torch.no_grad():
            logits = model(perturbed)[0]
        return softmax(as_numpy(logits, np.float64) / temperature).max(axis=1)
