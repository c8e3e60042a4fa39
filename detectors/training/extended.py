"""Extended (Open-Insects baseline): NovelBranch's loss with one second-head class per auxiliary species (C+A).

See novel_branch.py for the loss and the scores; the aux rows need their species index (`aux_label` in the split
manifests, `aux_label_field`; the aux FeatureSet's labels in the heads-only mode).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from detectors.base import param
from detectors.registry import register_detector
from detectors.training.novel_branch import BranchDetector


@register_detector("extended")
class Extended(BranchDetector):
    paper = "Chen et al., Open-Insects: a benchmark for open-set recognition of insects (Extended baseline)"

    @dataclass(frozen=True)
    class Params(BranchDetector.Params):
        score_rule: Literal["msp", "novel"] = param("msp", "how the trained model scores")
        pooled: bool = param(True, "one pooled novel class (False: one per branch level)")
        aux_label_field: str | None = param("aux_label",
                                            "the species splits' auxiliary class index (scripts/make_splits.py); "
                                                         "heads mode reads the aux FeatureSet's labels")

    search_space = {"score_rule": ["msp", "novel"]}
    per_species = True
