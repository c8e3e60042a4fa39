"""OpenOOD v1.5's released classifier checkpoints (`best.ckpt`) as the `model:` of an evaluation.

OpenOOD saves `torch.save(net.state_dict(), 'best.ckpt')` and its evaluation scripts load it with
`net.load_state_dict(torch.load(...))`, strict and without renaming (scripts/eval_ood.py:146-147,
scripts/eval_ood_imagenet.py:122-123; Jingkang50/OpenOOD 3c35632). Three networks hold the v1.5 runs:
`ResNet18_32x32` (CIFAR-10 / CIFAR-100, `pipelines.resnet18_32x32`), `ResNet18_224x224` (ImageNet-200) and `ResNet50`
(ImageNet-1K), the last two torchvision's ResNet with its parameter names (openood/networks/resnet18_224x224.py,
resnet50.py), run here as transformers' ResNet through `pipelines.torchvision_resnet.convert_state_dict`.

`load_openood_classifier(path)` reads the file as tensors only (`pipelines.checkpoints.safe_torch_load`), tells the
network from its keys (a 3x3 stem with `shortcut` blocks: ResNet18_32x32; a 7x7 stem with `downsample` blocks:
torchvision's, bottleneck when blocks have `conv3`), reads the widths, block counts and class count from the shapes,
loads strictly (a missing, unknown or mis-shaped key is one line naming the file) and returns an `ImageClassifier`
with the benchmark's test preprocessing (`pipelines.openood_benchmarks`: the benchmark whose class count the head
has) recorded as its reference evaluation transform.
"""
from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

import torch

from pipelines.classifier import ImageClassifier
from pipelines.errors import ConfigError, UserInputError
from pipelines.openood_benchmarks import Benchmark, benchmark_of_classes
from pipelines.pixels import record_pixels

SUFFIX = ".ckpt"
"""OpenOOD's checkpoint suffix (`best.ckpt`, `last_epoch*.ckpt`)."""


def is_openood_checkpoint(path: str | os.PathLike | None) -> bool:
    """True for an existing file named `*.ckpt` (OpenOOD's checkpoint files)."""
    return path is not None and str(path).endswith(SUFFIX) and os.path.isfile(path)


def _blocks(state: Mapping[str, Any]) -> list[int]:
    """Blocks per stage, from the `layer{s}.{i}.` keys."""
    found: dict[int, int] = {}
    for key in state:
        hit = re.match(r"layer(\d)\.(\d+)\.", key)
        if hit:
            stage, index = int(hit[1]), int(hit[2])
            found[stage] = max(found.get(stage, 0), index + 1)
    return [found[s] for s in sorted(found)]


def _strict(state: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor], where: str) -> None:
    """One line naming `where` when the keys or shapes differ from the network's."""
    missing = sorted(set(expected) - set(state))
    unknown = sorted(set(state) - set(expected))
    if missing or unknown:
        raise ConfigError(f"{where}: not this network's state dict: {len(missing)} missing key(s) {missing[:3]}, "
                          f"{len(unknown)} unexpected key(s) {unknown[:3]}")
    for key, value in state.items():
        if tuple(value.shape) != tuple(expected[key].shape):
            raise ConfigError(f"{where}: {key} has shape {tuple(value.shape)} where the network has "
                              f"{tuple(expected[key].shape)}")


def _benchmark(num_classes: int, where: str) -> Benchmark:
    found = benchmark_of_classes(num_classes)
    if found is None:
        raise ConfigError(f"{where}: its head has {num_classes} classes, which names no OpenOOD v1.5 benchmark "
                          "(cifar10 10, cifar100 100, imagenet200 200, imagenet 1000)")
    return found


def _resnet18_32x32(state: Mapping[str, torch.Tensor], where: str) -> torch.nn.Module:
    from pipelines.resnet18_32x32 import ResNet18_32x32

    net = ResNet18_32x32(int(state["fc.weight"].shape[0]), int(state["conv1.weight"].shape[0]), tuple(_blocks(state)))
    _strict(state, net.state_dict(), where)
    net.load_state_dict(state)
    return net.eval()


def _torchvision_resnet(state: Mapping[str, torch.Tensor], where: str) -> torch.nn.Module:
    """torchvision's ResNet (ResNet18_224x224 / ResNet50) as transformers' `ResNetForImageClassification`."""
    from transformers import ResNetConfig, ResNetForImageClassification

    from pipelines.torchvision_resnet import convert_state_dict

    bottleneck = "layer1.0.conv3.weight" in state
    blocks = _blocks(state)
    outputs = [int(state[f"layer{s}.0.bn{3 if bottleneck else 2}.weight"].shape[0]) for s in range(1, len(blocks) + 1)]
    config = ResNetConfig(num_channels=3, embedding_size=int(state["conv1.weight"].shape[0]), hidden_sizes=outputs,
                          depths=blocks, layer_type="bottleneck" if bottleneck else "basic", hidden_act="relu",
                          downsample_in_first_stage=False, downsample_in_bottleneck=False,
                          num_labels=int(state["fc.weight"].shape[0]))
    model = ResNetForImageClassification(config)
    try:
        converted = convert_state_dict(state, model.state_dict())
    except ValueError as err:
        raise ConfigError(f"{where}: not a torchvision ResNet state dict: {err}") from None
    model.load_state_dict(converted)
    return model.eval()


def _processor(bench: Benchmark) -> Any:
    """A transformers image processor with the benchmark's sizes and normalisation (its evaluation pixels are the
    recorded reference transform; the processor carries the sizes and statistics)."""
    from transformers import ConvNextImageProcessor

    pre = bench.preprocessing
    return ConvNextImageProcessor(size={"shortest_edge": pre.image_size}, crop_pct=pre.image_size / pre.pre_size,
                                  resample=2, image_mean=list(pre.mean), image_std=list(pre.std))


def load_openood_classifier(path: str | os.PathLike, key: str = "model") -> ImageClassifier:
    """The classifier of OpenOOD's checkpoint at `path` (module docstring); errors are one ConfigError naming `key`
    and the file."""
    from pipelines.checkpoints import safe_torch_load

    where = f"{key}: {os.fspath(path)}"
    try:
        state = safe_torch_load(path, "OpenOOD checkpoint")
    except UserInputError as err:  # more than tensors (or no torch file at all): refused
        raise ConfigError(f"{key}: {err}") from None
    except (RuntimeError, EOFError, OSError) as err:  # a truncated torch file
        raise ConfigError(f"{where}: not a readable torch checkpoint ({' '.join(str(err).split())[:160]})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ConfigError(f"{where}: not a state dict of tensors (OpenOOD saves net.state_dict())")
    for needed in ("conv1.weight", "fc.weight"):
        if needed not in state:
            raise ConfigError(f"{where}: no {needed!r}: not an OpenOOD ResNet checkpoint (keys: {list(state)[:3]})")
    bench = _benchmark(int(state["fc.weight"].shape[0]), where)
    pre = bench.preprocessing
    if any(".shortcut." in k for k in state) or state["conv1.weight"].shape[-1] == 3:
        net = _resnet18_32x32(state, where)
        made = ImageClassifier.from_module(net, image_size=pre.image_size, mean=pre.mean, std=pre.std, head=net.fc,
                                           model_id=os.fspath(path))
    else:
        made = ImageClassifier.from_model(_torchvision_resnet(state, where), _processor(bench), os.fspath(path))
    made.record = {"transform": "reference", "image_size": pre.image_size, "pre_size": pre.pre_size,
                   "resample": "bilinear", "orient": False}
    made.pixels = record_pixels(made.record)
    return made
