"""OOD detectors behind one protocol (see detectors.base.Detector) and one registry."""
from detectors.base import Detector, FeatureSet, ImageSet, LinearHead
from detectors.harness.selection import select
from detectors.registry import available, build, detector_class, load, register_detector
from pipelines.params import Params, param

__all__ = ["Detector", "FeatureSet", "ImageSet", "LinearHead", "Params", "available", "build", "detector_class", "load",
           "param", "register_detector", "select"]
