"""i-ODIN (Regmi, the post-hoc score of ASCOOD): ODIN whose perturbation moves one input element only, the one of
largest gradient magnitude.

OpenOOD (`openood/postprocessors/iodin_postprocessor.py`, a subclass of its ODIN postprocessor: the same temperature,
loss and divisor, `odin_postprocessor.py:18-21`) takes the gradient of CE(f(x) / T, argmax f(x)) (`:25-33`), a mask
holding the single element of largest |gradient| over channels and pixels per image (`:14-23`, `torch.argmax`: the
first of ties), and steps x - noise * mask * sign(grad) / std (`:35-45`) before the temperature-scaled MSP (`:46-53`),
with T 1000, noise 0.0014 and the ODIN sweep under APS (`configs/postprocessors/iodin.yml:3, 5-9`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from detectors.base import as_numpy
from detectors.posthoc.common import softmax
from detectors.posthoc.odin import ODIN, input_gradient, sign_step
from detectors.registry import register_detector
from pipelines.params import Params, param


def largest_gradient_mask(grad: torch.Tensor) -> torch.Tensor:
    """1 at each image's element of largest |grad| (the first of ties, as torch.argmax), 0 elsewhere; grad's shape."""
    flat = grad.abs().flatten(1)
    mask = torch.zeros_like(flat)
    mask.scatter_(1, flat.argmax(dim=1, keepdim=True), 1.0)
    return mask.reshape(grad.shape)


def iodin_perturb(classifier: Any, pixel_values: torch.Tensor, temperature: float, noise: float,
                  grad_std: float | None = None) -> torch.Tensor:
    """x - noise * mask * sign(grad) / s: ODIN's step on the largest-|gradient| element of each image only."""
    x, grad = input_gradient(classifier, pixel_values, temperature)
    return x - noise * largest_gradient_mask(grad) * sign_step(classifier, grad, grad_std)


@register_detector("iodin")
class IODIN(ODIN):
    """s(x) = max_k softmax(f(x') / T)_k, x' = x moved by ODIN's signed step at its one element of largest |gradient|.
    Needs the classifier and images."""

    label = "i-ODIN"
    reference_code = "OpenOOD openood/postprocessors/iodin_postprocessor.py"
    paper = "Regmi, Image-based Outlier Synthesis With Training Data (ASCOOD; i-ODIN), arXiv 2411.10794, 2024"

    @dataclass(frozen=True)
    class Params(Params):
        temperature: float = param(1000.0, "softmax temperature T (iodin.yml:5)", gt=0)
        noise: float = param(0.0014, "step of the one perturbed element, in normalised pixel units (iodin.yml:6)",
                             ge=0)
        grad_std: float | None = param(None, "divisor of the gradient sign: null the classifier's normalisation std "
                                             "(OpenOOD on a named benchmark), 0.5 for a dataset name missing from "
                                             "its table (odin_postprocessor.py:18-21)", gt=0)

    # search_space: ODIN's (iodin.yml:8-9 sweeps the same grid); protocol_defaults: ODIN's (the divisor comes from
    # the ODIN __init__ the reference inherits)

    def _chunk_scores(self, model: Any, x: torch.Tensor, temperature: float, noise: float) -> np.ndarray:
        perturbed = iodin_perturb(model, x, temperature, noise, self.params["grad_std"])
        with torch.no_grad():
            logits = model(perturbed)[0]
        return softmax(as_numpy(logits, np.float64) / temperature).max(axis=1)
