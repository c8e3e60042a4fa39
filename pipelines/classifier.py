"""The classifier ("pre-model") of post-hoc detectors: a backbone plus its last linear layer.

`ImageClassifier.forward(pixel_values) -> (logits, features)` where features are the head's input (penultimate layer).
Two sources: a transformers `AutoModelForImageClassification` (hub id or local folder), or any `torch.nn.Module`
returning `(logits, features)`. Training lives in `pipelines/training/` (`scripts/train_classifier.py`).

Its evaluation pixels are `pixels` (`pipelines.pixels`): a transform from an image (or, with `load`, an image file) to
a uint8 [3,H,W] tensor, which `standardize` normalises on the device in whole batches, or the image processor itself
(normalised floats, passed through). Loader workers run `pixels`; `preprocess` runs both in-process. A model folder
records a reference evaluation transform in `eval_pixels.json` (`save_pretrained` writes it, `from_pretrained` reads
it).
"""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from pipelines.io import umask_modes
from pipelines.runtime import load_pretrained
from pipelines.training.transforms import Normalize

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def find_head(model: nn.Module, num_classes: int | None = None) -> nn.Linear:
    """The classification layer: `model.classifier` (or its last Linear), else the last Linear with `num_classes`
    outputs."""
    candidate = getattr(model, "classifier", None) or getattr(model, "fc", None) or getattr(model, "head", None)
    if isinstance(candidate, nn.Linear):
        return candidate
    modules = list(candidate.modules()) if isinstance(candidate, nn.Module) else list(model.modules())
    linears = [m for m in modules if isinstance(m, nn.Linear)
               and (num_classes is None or m.out_features == num_classes)]
    if not linears:
        raise ValueError(f"could not find the classifier's linear head in {type(model).__name__}; pass head= "
                         "explicitly")
    return linears[-1]


def _size_from_processor(processor: Any) -> tuple[int, int]:
    size = getattr(processor, "crop_size", None) if getattr(processor, "do_center_crop", False) else None
    size = size or getattr(processor, "size", None) or {}
    size = dict(size) if not isinstance(size, int) else {"height": size, "width": size}
    if "height" in size and "width" in size:
        return int(size["height"]), int(size["width"])
    edge = size.get("shortest_edge") or size.get("longest_edge")
    if edge:
        return int(edge), int(edge)
    raise ValueError(f"cannot read the input size from {type(processor).__name__}: {size}")


class ImageClassifier(nn.Module):
    """Backbone + linear head with one interface for transformers models and plain modules."""

    def __init__(self, model: nn.Module, head: nn.Linear, *, image_size: tuple[int, int],
                 mean: Sequence[float] = IMAGENET_MEAN,
                 std: Sequence[float] = IMAGENET_STD, model_id: str = "module", processor: Any = None,
                 kind: str = "module"):
        super().__init__()
        self.model, self.head = model, head
        self.image_size = (int(image_size[0]), int(image_size[1]))
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1), persistent=False)
        self.model_id, self.processor, self.kind = model_id, processor, kind
        self._captured: torch.Tensor | None = None
        if kind == "hf":
            self.head.register_forward_pre_hook(self._capture)
        self.standardize = Normalize(self.mean.flatten().tolist(), self.std.flatten().tolist())
        self.pixels: Any = self.own_pixels()
        self.record: dict[str, Any] | None = None  # the model folder's eval_pixels.json (pipelines.pixels.RECORD)

    def own_pixels(self) -> Any:
        """The model's own evaluation pixels: its image processor, or a plain module's bicubic resize."""
        from pipelines.pixels import ProcessorPixels, module_pixels

        return ProcessorPixels(self.processor) if self.processor is not None else module_pixels(self.image_size)

    def _capture(self, module: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        self._captured = args[0]

    # -- construction ---------------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, name_or_path: str | os.PathLike, **kwargs: Any) -> ImageClassifier:
        """A transformers image classifier and its image processor (hub id or local folder)."""
        from transformers import AutoImageProcessor, AutoModelForImageClassification

        from pipelines.pixels import read_record, record_pixels

        model = load_pretrained(AutoModelForImageClassification.from_pretrained, name_or_path, "image classifier",
                                **kwargs)
        processor = load_pretrained(AutoImageProcessor.from_pretrained, name_or_path, "image processor")
        made = cls.from_model(model.eval(), processor, str(name_or_path))
        made.record = read_record(name_or_path)
        if made.record is not None:  # the transform it was trained and validated with
            made.pixels = record_pixels(made.record)
        return made

    @classmethod
    def from_model(cls, model: nn.Module, processor: Any, model_id: str = "module") -> ImageClassifier:
        """Wrap a transformers image classifier with its image processor (input size, mean and std read from it)."""
        head = find_head(model, model.config.num_labels)
        mean = getattr(processor, "image_mean", None) or IMAGENET_MEAN
        std = getattr(processor, "image_std", None) or IMAGENET_STD
        if not getattr(processor, "do_normalize", True):
            mean, std = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)
        return cls(model, head, image_size=_size_from_processor(processor), mean=mean, std=std,
                   model_id=model_id, processor=processor, kind="hf")

    @property
    def class_names(self) -> list[str] | None:
        """Index -> class name of a transformers classifier (its config's `id2label`), None for plain modules."""
        id2label = getattr(getattr(self.model, "config", None), "id2label", None)
        return [str(id2label[i]) for i in range(len(id2label))] if id2label else None

    @classmethod
    def from_module(cls, module: nn.Module, *, image_size: int | tuple[int, int], mean: Sequence[float] = IMAGENET_MEAN,
                    std: Sequence[float] = IMAGENET_STD, head: nn.Linear | None = None,
                    model_id: str = "module") -> ImageClassifier:
        """Wrap any module returning `(logits, features)`; its head is `head` or found by `find_head`."""
        size = (image_size, image_size) if isinstance(image_size, int) else image_size
        return cls(module, head or find_head(module), image_size=size, mean=mean, std=std, model_id=model_id,
                   kind="module")

    def save_pretrained(self, folder: str | os.PathLike) -> Path:
        """Save a transformers classifier with its processor (reload with `from_pretrained(folder)`)."""
        if self.kind != "hf":
            raise TypeError("save_pretrained needs a transformers classifier; save a plain module's state_dict "
                            "yourself")
        from pipelines.io import atomic_write_json
        from pipelines.pixels import RECORD, reference_record

        folder = Path(folder)
        with umask_modes(folder):  # transformers' safetensors writer makes model.safetensors 0600: the umask decides
            self.model.save_pretrained(folder)
            self.processor.save_pretrained(folder)
        record = reference_record(self.pixels)
        if record is not None:
            atomic_write_json(folder / RECORD, record)
        else:
            (folder / RECORD).unlink(missing_ok=True)
        return folder

    # -- inference ------------------------------------------------------------------------------------------
    @property
    def num_classes(self) -> int:
        return self.head.out_features

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def forward(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits [B,C], penultimate features [B,D]) for normalised pixel values."""
        if self.kind == "hf":
            logits = self.model(pixel_values=pixel_values).logits
            features, self._captured = self._captured, None
            return logits, features.flatten(1)
        logits, features = self.model(pixel_values)
        return logits, features.flatten(1)

    def preprocess(self, images: Sequence[Any]) -> torch.Tensor:
        """PIL images -> normalised pixel values [B,3,H,W] on the CPU: `pixels` per image, then `standardize`."""
        if not len(images):
            return torch.zeros((0, 3, *self.image_size))
        return self.standardize(torch.stack([self.pixels(image) for image in images]))

    def normalize(self, x01: torch.Tensor) -> torch.Tensor:
        """Differentiable: images in [0,1] of any size -> bilinear resize to `image_size` -> normalised."""
        if tuple(x01.shape[-2:]) != self.image_size:
            x01 = F.interpolate(x01, size=self.image_size, mode="bilinear", align_corners=False, antialias=False)
        return (x01 - self.mean.to(x01)) / self.std.to(x01)

    def hidden_maps(self, pixel_values: torch.Tensor, layers: str = "hidden_states",
                    reduce: Callable[[torch.Tensor], Any] | None = None) -> tuple[torch.Tensor, list[Any]]:
        """(logits [B,C], intermediate activations in forward order), each passed through `reduce` when given.

        `layers`: "hidden_states" the transformers model's `hidden_states` (`output_hidden_states=True`: the embedding
        output and every stage / block output), or a plain module's own `hidden_states(x)` (the same maps);
        "relu_conv" the output of every `nn.ReLU` and `nn.Conv2d` module call, in call order (forward hooks; a module
        called twice contributes twice), which works for plain modules too.
        """
        if layers == "hidden_states":
            own = getattr(self.model, "hidden_states", None) if self.kind != "hf" else None
            if own is not None:  # a plain module that lists its stages' outputs (pipelines.resnet18_32x32)
                logits, maps = own(pixel_values)
                return logits, [m if reduce is None else reduce(m) for m in maps]
            if self.kind != "hf":
                raise ValueError("hidden_maps(layers='hidden_states') needs a transformers classifier or a module with "
                                 "hidden_states(); use 'relu_conv'")
            out = self.model(pixel_values=pixel_values, output_hidden_states=True)
            self._captured = None
            return out.logits, [s if reduce is None else reduce(s) for s in out.hidden_states]
        if layers != "relu_conv":
            raise ValueError(f"layers must be 'hidden_states' or 'relu_conv', got {layers!r}")
        maps: list[Any] = []

        def keep(module: nn.Module, args: Any, output: torch.Tensor) -> None:
            maps.append(output if reduce is None else reduce(output))

        handles = [m.register_forward_hook(keep) for m in self.model.modules() if isinstance(m, (nn.ReLU, nn.Conv2d))]
        try:
            logits = self(pixel_values)[0]
        finally:
            for handle in handles:
                handle.remove()
        if not maps:
            raise ValueError(f"hidden_maps(layers='relu_conv'): {type(self.model).__name__} has no nn.ReLU or "
                             "nn.Conv2d module")
        return logits, maps

    def forward_images(self, x01: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`forward` on images in [0,1] (differentiable, for guidance and input perturbation)."""
        return self(self.normalize(x01))
