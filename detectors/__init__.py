"""OOD detectors behind one protocol (see detectors.base.Detector) and one registry."""
from detectors.base import Detector, FeatureSet, ImageSet, LinearHead
from detectors.registry import available, build, detector_class, register_detector
from detectors.selection import select

__all__ = ["Detector", "FeatureSet", "ImageSet", "LinearHead", "available", "build", "detector_class", "register_detector", "select"]
