"""torchvision ResNet checkpoints (e.g. `resnet50-0676ba61.pth`, ResNet50_Weights.IMAGENET1K_V1, the weights
Open-Insect's ImageNet variant started from) as transformers `ResNetForImageClassification` weights.

The architectures are the same network: a 7x7/2 stem + BN + ReLU + 3x3/2 max-pool, bottleneck blocks with the stride
on the 3x3 convolution (torchvision's "v1.5"; transformers' `downsample_in_bottleneck=False`), a 1x1 + BN projection
shortcut where the shape changes, global average pooling, one linear layer. Only the names differ:

    conv1 / bn1                       -> resnet.embedder.embedder.convolution / .normalization
    layer{s}.{i}.conv{k} / bn{k}      -> resnet.encoder.stages.{s-1}.layers.{i}.layer.{k-1}.convolution / .normalization
    layer{s}.{i}.downsample.0 / .1    -> resnet.encoder.stages.{s-1}.layers.{i}.shortcut.convolution / .normalization
    fc                                -> classifier.1

`load_torchvision_resnet(path, config)` reads the file safely (`torch.load(weights_only=True)`: tensors only, no code)
and returns the converted state dict; `convert_state_dict` does the renaming, refusing unknown or missing keys.
"""
from __future__ import annotations

import os
import re
from collections.abc import Mapping

import torch

from pipelines.errors import ConfigError

CHECKPOINT_SUFFIXES = (".pth", ".pt")
_BN = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")


def is_torchvision_checkpoint(path: str | os.PathLike) -> bool:
    """True for a file path with a torch checkpoint suffix (a folder is a transformers model folder)."""
    return os.path.isfile(path) and str(path).endswith(CHECKPOINT_SUFFIXES)


def _rename(key: str) -> str | None:
    """The transformers name of a torchvision ResNet key (None when it is not one)."""
    stem = re.fullmatch(r"(conv1|bn1)\.(.+)", key)
    if stem:
        part = "convolution" if stem[1] == "conv1" else "normalization"
        return f"resnet.embedder.embedder.{part}.{stem[2]}"
    block = re.fullmatch(r"layer(\d)\.(\d+)\.(conv|bn)(\d)\.(.+)", key)
    if block:
        stage, layer, kind, k, leaf = block.groups()
        part = "convolution" if kind == "conv" else "normalization"
        return f"resnet.encoder.stages.{int(stage) - 1}.layers.{layer}.layer.{int(k) - 1}.{part}.{leaf}"
    short = re.fullmatch(r"layer(\d)\.(\d+)\.downsample\.([01])\.(.+)", key)
    if short:
        stage, layer, which, leaf = short.groups()
        part = "convolution" if which == "0" else "normalization"
        return f"resnet.encoder.stages.{int(stage) - 1}.layers.{layer}.shortcut.{part}.{leaf}"
    head = re.fullmatch(r"fc\.(weight|bias)", key)
    return f"classifier.1.{head[1]}" if head else None


def convert_state_dict(state: Mapping[str, torch.Tensor],
                       expected: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """torchvision keys -> the transformers model's keys (`expected`: its state dict). Batch-norm step counters absent
    from the checkpoint (older files) are filled with zeros; any other missing, unknown or mis-shaped key is an
    error."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        name = _rename(key)
        if name is None or name not in expected:
            raise ValueError(f"not a torchvision ResNet key of this architecture: {key!r}")
        if tuple(value.shape) != tuple(expected[name].shape):
            raise ValueError(f"{key}: shape {tuple(value.shape)} where the model has {tuple(expected[name].shape)}")
        out[name] = value
    for name, value in expected.items():
        if name not in out and name.endswith("num_batches_tracked"):
            out[name] = torch.zeros_like(value)
    missing = sorted(set(expected) - set(out))
    if missing:
        raise ValueError(f"the checkpoint lacks {len(missing)} tensor(s) of the model, e.g. {missing[:3]}")
    return out


def load_torchvision_resnet(path: str | os.PathLike, model: torch.nn.Module, key: str = "model") -> None:
    """Load the torchvision checkpoint at `path` into the transformers ResNet `model` in place. A checkpoint whose
    head has another number of classes keeps the model's (new) head. Errors are one ConfigError naming `key`."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # not a tensor-only file: refused, nothing runs
        raise ConfigError(f"{key}: {path} is not a tensor-only torch checkpoint "
                          f"({' '.join(str(err).split())[:200]})") from None
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise ConfigError(f"{key}: {path} holds no state dict")
    expected = model.state_dict()
    head = {k: v for k, v in state.items() if k.startswith("fc.")}
    if head and tuple(head["fc.weight"].shape) != tuple(expected["classifier.1.weight"].shape):
        state = {k: v for k, v in state.items() if not k.startswith("fc.")}
        state.update({"fc.weight": expected["classifier.1.weight"], "fc.bias": expected["classifier.1.bias"]})
    try:
        converted = convert_state_dict(state, expected)
    except ValueError as err:
        raise ConfigError(f"{key}: {path}: {err}") from None
    model.load_state_dict(converted)
