"""Zero-shot MCM and GL-MCM (Ming et al., NeurIPS 2022; Miyai et al., 2023): softmax over class prompts on CLIP's
raw cosine similarities, globally (MCM) and plus the best patch (GL-MCM).

Reference: deeplearning-wisc/MCM utils/detection_util.py (prompt "a photo of a {label}", no full stop; T = 1) and
AtsuMiyai/GL-MCM (same prompt; lambda = 1).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from detectors.clip import scores
from detectors.clip.common import MCM_TEMPLATE, ClipDetector
from detectors.registry import register_detector
from pipelines.params import param


@register_detector("mcm")
class MCM(ClipDetector):
    """s = max_i softmax_i(cos(x, t_i) / T), T = 1, prompts "a photo of a {label}" (the official one; the full-stop
    variant or CLIP's 80-template ensemble are options through `templates`)."""

    label = "MCM"
    reference_code = "deeplearning-wisc/MCM utils/detection_util.py"
    paper = "Ming et al., Delving into Out-of-Distribution Detection with Vision-Language Representations, NeurIPS 2022"

    @dataclass(frozen=True)
    class Params(ClipDetector.Params):
        templates: list[str] | None = param([MCM_TEMPLATE], "class prompts ('{}' = class name)")
        temperature: float = param(1.0, "softmax temperature T on the cosine similarities", gt=0)

    # no search_space: OpenOOD v1.5's mcm.yml has APS_mode False (T = 1, no sweep)
    grids = {"openood_v1.5": {}}

    def _score(self, batch: Any) -> np.ndarray:
        return scores.mcm(self.features(batch).global_, self.class_text(), self.params["temperature"])


@register_detector("glmcm")
class GLMCM(ClipDetector):
    """s = MCM(global) + lambda * max over patches of MCM(local), lambda = 1 (0.5 in a later version of the paper)."""

    label = "GL-MCM"
    reference_code = "AtsuMiyai/GL-MCM utils/detection_util.py"
    reads_patches = True

    paper = ("Miyai et al., Zero-Shot In-Distribution Detection in Multi-Object Settings Using Vision-Language "
             "Foundation Models, 2023")

    @dataclass(frozen=True)
    class Params(MCM.Params):
        lam: float = param(1.0, "weight of the local (patch) MCM term", ge=0)

    search_space = {"lam": [0.5, 1.0]}

    def _score(self, batch: Any) -> np.ndarray:
        feats = self.features(batch)
        return scores.glmcm(feats.global_, feats.local, self.class_text(), self.params["temperature"],
                            self.params["lam"])
