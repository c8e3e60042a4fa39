"""Extended (Open-Insects baseline): NovelBranch's loss with one second-head class per auxiliary species (C+A).

See novel_branch.py for the loss and the scores; the aux rows need their species index (`aux_label` in the split
manifests, `aux_label_field`; the aux FeatureSet's labels in the heads-only mode).
"""
from __future__ import annotations

from dataclasses import dataclass

from detectors.registry import register_detector
from detectors.training.novel_branch import BranchDetector
from pipelines.params import param


@register_detector("extended")
class Extended(BranchDetector):
    label = "Extended"
    paper = "Chen et al., Open-Insects: a benchmark for open-set recognition of insects (Extended baseline)"

    @dataclass(frozen=True)
    class Params(BranchDetector.Params):
        aux_label_field: str | None = param("aux_label", "the species splits' auxiliary class index (oodforge "
                                                         "make-splits); heads mode reads the aux FeatureSet's labels")

    per_species = True
