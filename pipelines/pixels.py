"""Which pixels a classifier sees, decided in one place: its evaluation transform under a protocol, the fit pixels of
ID train rows, the image processor as a transform, the model folder's record of how it evaluates, and the default
worker count of every image loader.

Evaluation transforms (`EVAL_TRANSFORMS`):
- "reference": torchvision's Resize(pre_size, bilinear) + CenterCrop(image_size), whose offset is
  int(round((L - image_size) / 2)) (half to even): Open-Insect's `TestStandardPreProcessor`
  (src/openood/preprocessors/test_preprocessor.py:14-21; pre_size 128, image_size 126 in
  configs/datasets/c-america.yml:5-8) and OpenOOD v1.5's (openood/evaluation_api/preprocessor.py:50-59, 256 / 224 for
  ImageNet). The sizes are the model folder's record (`RECORD`), else the processor's (image_size its crop, pre_size
  int(image_size / crop_pct)).
- "processor": the model's own image processor (transformers: its resample filter, floor offsets).
Fit pixels (`FIT_PIXELS`) of the ID train rows that post-hoc detectors fit on: "train" is Open-Insect's train
preprocessor, region branch (scripts/eval.sh:67 sets `dataset.name` to the region, so base_preprocessor.py:56-67 runs,
and datasets/utils.py:23 gives the train split that preprocessor): Resize + CenterCrop + flip + RandomCrop(padding 4),
drawn once per row from (seed, row); "eval" is the evaluation transform (OpenOOD v1.5's evaluation API gives every split
its test preprocessor: evaluation_api/datasets.py:455-464).
Orientation: both references read images with `Image.open(...).convert("RGB")` (Open-Insect and OpenOOD
openood/datasets/imglist_dataset.py:83): the stored pixel order, EXIF orientation not applied; `exact` applies it.

`PROTOCOL_PIXELS` holds each protocol's choice; `PixelSettings` (the `pixels:` section of an evaluation config) changes
any of them; `run_pixels` resolves them for a classifier. JPEG draft decoding (`pipelines.decode`) is off for
evaluation pixels by default (the reference protocols' scores are the full decode's; docs/training.md gives the
measured difference) and on for training pixels.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from pipelines.decode import Decode, decode
from pipelines.params import Config, config, param
from pipelines.training.transforms import Compose, Resize, reference_eval, reference_train

EVAL_TRANSFORMS = ("reference", "processor")
FIT_PIXELS = ("train", "eval")
EvalTransform = Literal[EVAL_TRANSFORMS]  # type: ignore[valid-type]
FitPixels = Literal[FIT_PIXELS]  # type: ignore[valid-type]
RECORD = "eval_pixels.json"
"""The model folder's record of the evaluation transform it was trained and validated with (written by
`ImageClassifier.save_pretrained`, read by `ImageClassifier.from_pretrained`)."""
DOC = "docs/training.md, section 'Pixels'"


@dataclass(frozen=True)
class ProtocolPixels:
    """A protocol's pixels: the evaluation transform, the fit pixels of ID train rows, EXIF orientation."""

    eval: EvalTransform
    fit: FitPixels
    orient: bool


PROTOCOL_PIXELS: dict[str, ProtocolPixels] = {
    "open-insects": ProtocolPixels("reference", "train", False),
    "openood_v1.5": ProtocolPixels("reference", "eval", False),
    "exact": ProtocolPixels("processor", "eval", True),
}
"""Protocol -> its pixels (module docstring: the reference files and lines)."""


@config
class PixelSettings(Config):
    """How evaluation turns images into pixels; null keys are the protocol's (`PROTOCOL_PIXELS`)."""

    DOC = DOC

    eval: EvalTransform | None = param(
        None,
        "evaluation transform: reference (torchvision Resize + CenterCrop, as Open-Insect and OpenOOD) or processor "
              "(the model's image processor); null: the protocol's, or under `exact` the model folder's record")
    fit: FitPixels | None = param(
        None,
        "pixels of the ID train rows detectors fit on: train (Open-Insect's region branch, seeded) or eval; null: "
              "the protocol's")
    orient: bool | None = param(None, "apply EXIF orientation (the references do not); null: the protocol's")
    draft: bool = param(False,
                        "decode evaluation JPEGs at the DCT scale the resize needs (faster; within the tolerance "
                               "docs/training.md states, not the reference's pixels)")
    seed: int = param(0, "seed of the fit pixels' draws (fit: train)")


class ProcessorPixels:
    """The model's image processor as a pixel transform: PIL image -> its normalised float [3,H,W]; `load` decodes a
    file in full first (picklable: loader workers run it)."""

    def __init__(self, processor: Any, decode: Decode = Decode()):
        self.processor, self.decode = processor, decode

    def __call__(self, image: Any, rng: np.random.Generator | None = None) -> torch.Tensor:
        # PIL images are height x width x channels; saying so keeps a 1x1 or 2x2 image from being read as
        # channels-first (transformers 5.2 guesses the layout from the shape)
        return self.processor(images=[image], return_tensors="pt", input_data_format="channels_last")["pixel_values"][0]

    def load(self, path: Any, rng: np.random.Generator | None = None) -> torch.Tensor:
        return self(decode(path, self.decode)[0].image)

    def with_decode(self, decode: Decode) -> ProcessorPixels:
        return ProcessorPixels(self.processor, decode)

    def identity(self) -> dict[str, Any]:
        return {"processor": self.processor.to_dict(), "decode": self.decode.identity()}

    def __repr__(self) -> str:
        return f"the image processor ({type(self.processor).__name__})"


def module_pixels(image_size: tuple[int, int]) -> Compose:
    """A plain module's pixels: a bicubic resize to its input size (no crop)."""
    return Compose([Resize(tuple(image_size), resample=3)])


def reference_sizes(classifier: Any, record: dict[str, Any] | None = None) -> tuple[int, int]:
    """(image_size, pre_size) of the reference transform: the record's, else the processor's crop and
    int(crop / crop_pct) (a processor without crop_pct: pre_size = image_size)."""
    if record and record.get("transform") == "reference":
        return int(record["image_size"]), int(record["pre_size"])
    size = int(classifier.image_size[0])
    crop_pct = getattr(getattr(classifier, "processor", None), "crop_pct", None)
    return size, int(size / crop_pct) if crop_pct else size


def reference_record(pixels: Any) -> dict[str, Any] | None:
    """The record of a reference evaluation transform (`RECORD`), None for any other."""
    if not isinstance(pixels, Compose) or [type(op).__name__ for op in pixels.ops] != ["Resize", "CenterCrop"]:
        return None
    resize, crop = pixels.ops
    if not isinstance(resize.size, int) or resize.resample != 2:
        return None
    return {"transform": "reference", "image_size": crop.size, "pre_size": resize.size, "resample": "bilinear",
            "orient": pixels.decode.orient}


def record_pixels(record: dict[str, Any]) -> Any:
    """The evaluation transform a `RECORD` names (a reference transform at its sizes, decoded in full)."""
    return reference_eval(int(record["image_size"]), int(record["pre_size"]),
                          Decode(orient=bool(record.get("orient", True))))


def read_record(folder: str | os.PathLike) -> dict[str, Any] | None:
    """A model folder's `RECORD`, None when absent or not a mapping."""
    path = Path(folder) / RECORD
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) and found.get("transform") == "reference" else None


@dataclass(frozen=True)
class RunPixels:
    """A run's resolved pixels: the evaluation transform, the fit pixels of ID train rows (None: the evaluation ones)
    and their seed."""

    eval: Any
    fit: Compose | None
    seed: int

    def fit_identity(self) -> dict[str, Any]:
        """What decides the ID train rows' pixels (their feature caches' key)."""
        if self.fit is None:
            return {"fit": "eval"}
        return {"fit": "train", "transform": self.fit.identity(), "seed": self.seed}


def run_pixels(classifier: Any, protocol: str, settings: PixelSettings | None = None,
               record: dict[str, Any] | None = None) -> RunPixels:
    """The pixels of an evaluation run under `protocol` with `settings` (null keys: the protocol's) for `classifier`,
    whose model folder's `record` (default: `classifier.record`) gives the reference sizes and, under `exact`, the
    transform it was validated with."""
    settings = settings or PixelSettings()
    record = record if record is not None else getattr(classifier, "record", None)
    chosen = PROTOCOL_PIXELS[protocol]
    orient = chosen.orient if settings.orient is None else settings.orient
    eval_decode = Decode(draft=settings.draft, orient=orient)
    mode = settings.eval or (record["transform"] if record and protocol == "exact" else chosen.eval)
    if mode == "reference":
        image_size, pre_size = reference_sizes(classifier, record)
        eval_pixels: Any = reference_eval(image_size, pre_size, eval_decode)
    elif getattr(classifier, "processor", None) is not None:
        eval_pixels = ProcessorPixels(classifier.processor, eval_decode)
    else:
        eval_pixels = module_pixels(classifier.image_size).with_decode(eval_decode)
    fit = None
    if (settings.fit or chosen.fit) == "train":
        image_size, pre_size = reference_sizes(classifier, record)
        fit = reference_train("region", image_size, pre_size, Decode(draft=settings.draft, orient=orient))
    return RunPixels(eval_pixels, fit, settings.seed)


def finetune_transforms(classifier: Any, augment: str, draft: bool = True) -> tuple[Compose, Any]:
    """(training, evaluation) pixels of a fine-tune of `classifier`: the `augment` branch of
    `transforms.reference_train` at the classifier's reference sizes (`reference_sizes`; pre_size from its evaluation
    transform when that is the reference one) decoded with its orientation (drafted when `draft`), and its own
    evaluation pixels for validation and a separate auxiliary stream (the reference's test preprocessor on aux rows)."""
    record = reference_record(classifier.pixels)
    image_size, pre_size = reference_sizes(classifier, record)
    orient = getattr(getattr(classifier.pixels, "decode", None), "orient", True)
    return reference_train(augment, image_size, pre_size, Decode(draft=draft, orient=orient)), classifier.pixels


def training_pixels(classifier: Any, transforms: tuple[Any, Any], protocol: str, draft: bool = True) -> tuple[Any, Any]:
    """A classifier training run's (train, eval) transforms decoded as `protocol` reads images (its orientation;
    training JPEGs drafted when `draft`: random crops have no reference pixels to equal; evaluation ones in full),
    the evaluation transform set as the classifier's `pixels` (so its saved folder records a reference one)."""
    orient = PROTOCOL_PIXELS[protocol].orient
    train, evaluate = transforms
    if hasattr(train, "with_decode"):
        train = train.with_decode(Decode(draft=draft, orient=orient))
    if hasattr(evaluate, "with_decode"):
        evaluate = evaluate.with_decode(Decode(draft=False, orient=orient))
    if reference_record(evaluate) is not None:
        classifier.pixels = evaluate
    return train, evaluate


def default_workers() -> int:
    """Image-loading workers when none are set: every core this process may use but one (for the main process) beside
    a GPU; 0 on a CPU-only machine (workers would compete with the model for the same cores; tests stay in-process)."""
    if not torch.cuda.is_available():
        return 0
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(cores - 1, 0)
