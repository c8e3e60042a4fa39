"""The Open-Insect model zoo as its authors released it (Hugging Face `yuyan-chen/open-insect-model-weights`): one
plain OpenOOD state dict a file, read as published.

Files (RolnickLab/Open-Insect `scripts/eval.sh`: `--network.checkpoint $WEIGHT_DIR/${METHOD}_${REGION}.pth`;
`configs/pipelines/test/test_arpl.yml:20-21`, `test_opengan.yml:17-18` for the two methods with their own scripts):

    <method>_<region>.pth           basics, logitnorm, oe, mixoe, energy (resnet50), conf_branch (conf_branch_net),
                                    godin (godin_net), rotpred (rot_net), udg (udg_net), extended and novel_branch
                                    (extended_net)
    arpl_netF_<region>.pth          ARPL's feature network (a ResNet-50 whose fc is nn.Identity: no fc keys)
    arpl_criterion_<region>.pth     its ARPLayer (`points`, `radius`, `Dist.centers`: the same tensor twice)
    opengan_DNet_<region>.ckpt      OpenGAN's discriminator (1x1 convolutions `main.*`; its backbone is basics_<region>)
    opengan_GNet_<region>.ckpt      OpenGAN's generator (not needed to score)

Key layouts (`src/openood/networks/`): `resnet50.py` subclasses torchvision's ResNet (`conv1`, `bn1`,
`layer{1-4}.{i}.conv{1-3}` / `bn{1-3}` / `downsample.{0,1}`, `fc`); the wrapped networks hold it as `backbone.` with
its fc replaced by nn.Identity (no `backbone.fc` keys) and add their heads: `fc` + `confidence` (conf_branch_net),
`h.h` (cosine, no bias) + `g.0` (linear) `g.1` (BatchNorm1d) (godin_net), `fc` + `rot_fc` (rot_net), `fc` + `fc_aux`
(udg_net), `fc` (the closed set) + `fc_extended` (C+1 for novel_branch, C+A for extended) (extended_net).
Class counts (eval.sh): NE-America 2497, W-Europe 2603, C-America 636; novel_branch +1, extended + 8000 / 8000 / 4000.

The reference loads with `load_state_dict(torch.load(ckpt, weights_only=True), strict=False)` and prints what differs
(`networks/utils.py:457-471`); here a file is read tensors only (`safe_torch_load`), its network is identified by its
key names (`identify_network`, reusable for any OpenOOD state dict) and checked against the file name, its class
count is read from its tensors, and every key must match: a difference is one line naming the file, the missing and
the unexpected keys. `released_classifier` turns a file's backbone and closed-set head into an `ImageClassifier`
(transformers ResNet, `pipelines.torchvision_resnet` renames the keys) evaluated at the reference's pixels.
"""
from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from pipelines.errors import UserInputError

METHOD_NETWORKS = {
    "basics": "resnet50", "logitnorm": "resnet50", "oe": "resnet50", "mixoe": "resnet50", "energy": "resnet50",
    "conf_branch": "conf_branch_net", "godin": "godin_net", "rotpred": "rot_net", "udg": "udg_net",
    "extended": "extended_net", "novel_branch": "extended_net", "arpl": "arpl_net", "opengan": "opengan",
}
"""The released methods and the OpenOOD network of each (README `NETWORK` options; test_eval_script.sh)."""
PART_NETWORKS = {("arpl", "netF"): "resnet50_features", ("arpl", "criterion"): "arpl_criterion",
                 ("opengan", "DNet"): "opengan_discriminator", ("opengan", "GNet"): "opengan_generator"}
"""The two-file methods: (method, part) -> the network that part holds."""
NETWORKS = ("resnet50", "resnet50_features", "conf_branch_net", "godin_net", "rot_net", "udg_net", "extended_net",
            "arpl_criterion", "opengan_discriminator", "opengan_generator")
"""What `identify_network` names (`resnet50`: any torchvision-layout ResNet with its fc; `_features`: without)."""
SUFFIXES = (".pth", ".ckpt", ".pt")

_BN = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")
_LINEAR = ("weight", "bias")
HEADS: dict[str, dict[str, tuple[str, ...]]] = {
    "resnet50": {"fc": _LINEAR},
    "resnet50_features": {},
    "conf_branch_net": {"fc": _LINEAR, "confidence": _LINEAR},
    "godin_net": {"h.h": ("weight",), "g.0": _LINEAR, "g.1": _BN},
    "rot_net": {"fc": _LINEAR, "rot_fc": _LINEAR},
    "udg_net": {"fc": _LINEAR, "fc_aux": _LINEAR},
    "extended_net": {"fc": _LINEAR, "fc_extended": _LINEAR},
}
"""Each backbone network's keys outside the ResNet: module -> its tensors."""
CLASSIFIER_NETWORKS = tuple(network for network, heads in HEADS.items() if "fc" in heads)
"""The networks with a linear closed-set head `fc`: what a run's classifier (`model:`) may be."""
_NAME = re.compile(r"(?P<method>{})(?:_(?P<part>netF|criterion|GNet|DNet))?_(?P<region>[A-Za-z0-9-]+)(?P<ext>{})"
                   .format("|".join(sorted(METHOD_NETWORKS, key=len, reverse=True)),
                           "|".join(re.escape(s) for s in SUFFIXES)))
ARPL_KEYS = ("points", "radius", "Dist.centers")
OPENGAN_D_CONV, OPENGAN_D_BN = (0, 2, 5, 8, 11), (3, 6, 9)  # networks/opengan.py Discriminator: nn.Sequential indices
OPENGAN_G_CONV, OPENGAN_G_BN = (0, 3, 6, 9, 12), (1, 4, 7, 10)  # Generator (the last conv has a bias)


class ReleasedFileError(UserInputError):
    """A released weight file that cannot be read as its network (one line naming the file)."""


@dataclass(frozen=True)
class ReleasedName:
    """What a released file's name says: `<method>[_<part>]_<region><ext>`."""

    method: str
    region: str
    part: str | None = None

    @property
    def network(self) -> str:
        """The network the name implies (a two-file method: the part's)."""
        return PART_NETWORKS.get((self.method, self.part or ""), METHOD_NETWORKS[self.method])

    def sibling(self, part: str, folder: str | os.PathLike) -> Path:
        """The other file of a two-file method, beside this one under the reference's naming."""
        ext = ".ckpt" if self.method == "opengan" else ".pth"
        return Path(folder) / f"{self.method}_{part}_{self.region}{ext}"


def parse_name(path: str | os.PathLike) -> ReleasedName | None:
    """The method, part and region a released file's name gives; None for any other name."""
    found = _NAME.fullmatch(Path(path).name)
    if found is None:
        return None
    method, part = found["method"], found["part"]
    two_file = method in ("arpl", "opengan")
    if two_file != (part is not None) or (part and (method, part) not in PART_NETWORKS):
        return None
    return ReleasedName(method, found["region"], part)


def files_read(path: str | os.PathLike) -> list[Path]:
    """The files a released method is read from when `path` is named: ARPL's two parts, OpenGAN's discriminator (its
    generator's name finds it), else the file itself (what a run's cache keys must cover)."""
    name = parse_name(path)
    folder = Path(path).parent
    if name is not None and name.method == "arpl":
        return [name.sibling("netF", folder), name.sibling("criterion", folder)]
    if name is not None and name.method == "opengan":
        return [name.sibling("DNet", folder)]
    return [Path(path)]


def is_released_file(path: str | os.PathLike | None) -> bool:
    """True for an existing file with a torch checkpoint suffix (a folder is a model or detector folder)."""
    return path is not None and os.path.isfile(path) and str(path).endswith(SUFFIXES)


def read_state(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The file's state dict, tensors only: a pickle with anything else is refused unread; a file that is not a flat
    name -> tensor mapping is one line naming it."""
    from pipelines.checkpoints import safe_torch_load

    try:
        state = safe_torch_load(path, "released weight file")
    except UserInputError as err:
        raise ReleasedFileError(str(err)) from None
    except Exception as err:  # noqa: BLE001 - not a torch file at all: one line, never a traceback
        raise ReleasedFileError(f"{os.fspath(path)}: not a torch state dict ({' '.join(str(err).split())[:160]})") \
            from None
    if not isinstance(state, Mapping) or not state or not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()):
        raise ReleasedFileError(f"{os.fspath(path)}: not a state dict of named tensors (the released files are "
                                "plain OpenOOD state dicts)")
    return dict(state)


# -- identification -------------------------------------------------------------------------------------------------
def identify_network(state: Mapping[str, Any]) -> str | None:
    """The network a state dict is, by its key names (one of `NETWORKS`), None when none fits."""
    keys = set(state)
    if {"points", "radius"} <= keys:
        return "arpl_criterion"
    if "main.0.weight" in keys:
        return "opengan_generator" if "main.1.running_mean" in keys else "opengan_discriminator"
    if "backbone.conv1.weight" in keys:
        for network, heads in HEADS.items():
            extra = [m for m in heads if m != "fc"]
            if extra and f"{extra[0]}.weight" in keys:
                return network
        return None
    if "conv1.weight" in keys:
        return "resnet50" if "fc.weight" in keys else "resnet50_features"
    return None


def resnet_architecture(state: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """The transformers `ResNetConfig` size fields of a torchvision-layout ResNet state dict (no `backbone.`):
    embedding size, stage widths and depths, bottleneck or basic blocks."""
    if "conv1.weight" not in state or "layer1.0.conv1.weight" not in state:
        raise ValueError("no torchvision ResNet stem and first stage (conv1.weight, layer1.0.conv1.weight)")
    bottleneck = "layer1.0.conv3.weight" in state
    last = "conv3" if bottleneck else "conv2"
    depths, widths = [], []
    stage = 1
    while f"layer{stage}.0.{last}.weight" in state:
        blocks = {int(m[1]) for k in state if (m := re.match(rf"layer{stage}\.(\d+)\.conv1\.weight$", k))}
        depths.append(max(blocks) + 1)
        widths.append(int(state[f"layer{stage}.0.{last}.weight"].shape[0]))
        stage += 1
    return {"embedding_size": int(state["conv1.weight"].shape[0]), "hidden_sizes": widths, "depths": depths,
            "layer_type": "bottleneck" if bottleneck else "basic"}


def torchvision_name(key: str) -> str:
    """The torchvision name of a transformers ResNet key (`pipelines.torchvision_resnet`'s renaming, inverted)."""
    stem = re.fullmatch(r"resnet\.embedder\.embedder\.(convolution|normalization)\.(.+)", key)
    if stem:
        return f"{'conv1' if stem[1] == 'convolution' else 'bn1'}.{stem[2]}"
    block = re.fullmatch(r"resnet\.encoder\.stages\.(\d+)\.layers\.(\d+)\.layer\.(\d+)\.(convolution|normalization)"
                         r"\.(.+)", key)
    if block:
        s, i, k, part, leaf = block.groups()
        return f"layer{int(s) + 1}.{i}.{'conv' if part == 'convolution' else 'bn'}{int(k) + 1}.{leaf}"
    short = re.fullmatch(r"resnet\.encoder\.stages\.(\d+)\.layers\.(\d+)\.shortcut\.(convolution|normalization)\.(.+)",
                         key)
    if short:
        s, i, part, leaf = short.groups()
        return f"layer{int(s) + 1}.{i}.downsample.{0 if part == 'convolution' else 1}.{leaf}"
    head = re.fullmatch(r"classifier\.1\.(weight|bias)", key)
    return f"fc.{head[1]}" if head else key


# -- a released file, read ------------------------------------------------------------------------------------------
@dataclass
class ReleasedNetwork:
    """A released file read and checked: its network, the backbone (torchvision keys, no prefix, no fc) and the
    network's own tensors by module (`heads["fc"]["weight"]`, ...), or the whole state for the non-ResNet parts."""

    path: Path
    network: str
    name: ReleasedName | None
    backbone: dict[str, torch.Tensor] = field(default_factory=dict)
    heads: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    state: dict[str, torch.Tensor] = field(default_factory=dict)

    def fail(self, what: str) -> ReleasedFileError:
        return ReleasedFileError(f"{self.path}: {self.network}: {what}")

    def head(self, module: str) -> dict[str, torch.Tensor]:
        return self.heads[module]

    @property
    def num_classes(self) -> int:
        """The closed-set class count its tensors give (fc rows; G-ODIN's h rows; ARPL's points)."""
        if "fc" in self.heads:
            return int(self.heads["fc"]["weight"].shape[0])
        if "h.h" in self.heads:
            return int(self.heads["h.h"]["weight"].shape[0])
        if self.network == "arpl_criterion":
            return int(self.state["points"].shape[0])
        raise self.fail("holds no closed-set head to count classes by")

    @property
    def feature_dim(self) -> int:
        """The width of the features its heads read (the backbone's last stage)."""
        return int(resnet_architecture(self.backbone)["hidden_sizes"][-1])


def _keys_line(missing: list[str], unexpected: list[str]) -> str:
    parts = [f"missing {missing[:8]}{' ...' if len(missing) > 8 else ''}" if missing else "",
             f"unexpected {unexpected[:8]}{' ...' if len(unexpected) > 8 else ''}" if unexpected else ""]
    return "keys differ from the reference network's: " + "; ".join(p for p in parts if p)


def _expected_head_keys(network: str) -> set[str]:
    return {f"{module}.{leaf}" for module, leaves in HEADS[network].items() for leaf in leaves}


def _other_keys(network: str) -> set[str]:
    if network == "arpl_criterion":
        return set(ARPL_KEYS)
    conv, bn = ((OPENGAN_D_CONV, OPENGAN_D_BN) if network == "opengan_discriminator"
                else (OPENGAN_G_CONV, OPENGAN_G_BN))
    out = {f"main.{i}.weight" for i in conv} | {f"main.{i}.{leaf}" for i in bn for leaf in _BN}
    return out | ({f"main.{conv[-1]}.bias"} if network == "opengan_generator" else set())


def read_released(path: str | os.PathLike, network: str | None = None) -> ReleasedNetwork:
    """A released file read as `network` (default: what its name `<method>_<region>.pth` implies, else what its keys
    are), every key checked: the backbone against the ResNet its own tensors describe, the rest against the network's
    heads. Any difference, or a name that says another network than the keys, is one line naming the file."""
    path = Path(path)
    name = parse_name(path)
    state = read_state(path)
    found = identify_network(state)
    if network is not None and network not in NETWORKS and network not in ("arpl_net", "opengan"):
        raise ReleasedFileError(f"{path}: unknown network {network!r} (one of {', '.join(NETWORKS)})")
    expected = network or (name.network if name else found)
    if expected is None:
        raise ReleasedFileError(f"{path}: no released network has these keys (first: {sorted(state)[:4]}); the zoo's "
                                f"networks: {', '.join(NETWORKS)}")
    if expected in ("arpl_net", "opengan"):  # a method name given where its part's file is needed
        files = "arpl_netF / arpl_criterion" if expected == "arpl_net" else "opengan_DNet / opengan_GNet"
        raise ReleasedFileError(f"{path}: {expected} is two files ({files}_<region>); name the one to read")
    made = ReleasedNetwork(path, expected, name)
    if expected not in HEADS:
        wanted = _other_keys(expected)
        if set(state) != wanted:
            raise made.fail(_keys_line(sorted(wanted - set(state)), sorted(set(state) - wanted)))
        made.state = state
        if expected == "arpl_criterion" and not torch.equal(state["points"], state["Dist.centers"]):
            raise made.fail("points and Dist.centers differ (ARPLayer holds one tensor under both names)")
        return made
    prefix = "" if expected.startswith("resnet50") else "backbone."
    heads = _expected_head_keys(expected)
    backbone = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix) and k not in heads}
    others = sorted(k for k in state if not k.startswith(prefix) or k in heads)
    unexpected = [k for k in others if k not in heads]
    missing = sorted(heads - set(state))
    made.backbone = backbone
    try:
        architecture = resnet_architecture(backbone)
    except ValueError:  # no ResNet under the prefix: the whole backbone is missing
        raise made.fail(_keys_line(missing + [f"{prefix}conv1.weight, {prefix}layer1... (the whole backbone)"],
                                   unexpected)) from None
    with torch.device("meta"):  # the key names only: no memory, no initialisation
        layout = _resnet_model(architecture, 1).state_dict()
    want = {torchvision_name(k): tuple(v.shape) for k, v in layout.items() if not k.startswith("classifier")}
    missing += sorted(prefix + k for k in set(want) - set(backbone) if not k.endswith("num_batches_tracked"))
    unexpected += sorted(prefix + k for k in set(backbone) - set(want))
    if missing or unexpected:
        raise made.fail(_keys_line(missing, unexpected))
    wrong = [f"{prefix}{k} {tuple(v.shape)} (expected {want[k]})" for k, v in sorted(backbone.items())
             if tuple(v.shape) != want[k]]
    if wrong:
        raise made.fail(f"shapes differ from the ResNet its other tensors describe: {', '.join(wrong[:4])}")
    made.heads = {module: {leaf: state[f"{module}.{leaf}"] for leaf in leaves}
                  for module, leaves in HEADS[expected].items()}
    _check_head_shapes(made)
    return made


def _check_head_shapes(made: ReleasedNetwork) -> None:
    """Every head reads the backbone's feature width; the closed-set heads agree on the class count."""
    dim = made.feature_dim
    for module, tensors in made.heads.items():
        weight = tensors.get("weight")
        if weight is not None and weight.dim() == 2 and module != "g.1" and weight.shape[1] != dim:
            raise made.fail(f"{module}.weight is {tuple(weight.shape)}: it must read the backbone's {dim} features")
    if made.network == "extended_net":
        closed, second = made.heads["fc"]["weight"].shape[0], made.heads["fc_extended"]["weight"].shape[0]
        if second <= closed:
            raise made.fail(f"fc_extended has {second} classes, fc {closed}: the second head holds the closed set and "
                            "1 (novel_branch) or A auxiliary classes (extended) more")


def check_class_count(made: ReleasedNetwork, expected: int, what: str) -> None:
    """One line naming the file and the tensor when its class count is not `expected` (`what` says whose it is)."""
    found = made.num_classes
    if found != expected:
        tensor = "fc.weight" if "fc" in made.heads else "h.h.weight" if "h.h" in made.heads else "points"
        raise made.fail(f"{found} classes ({tensor} has {found} rows) where {what} has {expected}")


# -- as a classifier ----------------------------------------------------------------------------------------------
def _resnet_model(architecture: Mapping[str, Any], num_labels: int) -> torch.nn.Module:
    """A transformers ResNet classifier of the architecture: microsoft/resnet-50's config with its size fields set."""
    from transformers import ResNetConfig, ResNetForImageClassification

    from pipelines.hub import real_config
    from pipelines.hub_ids import RESNET_ID

    config = {**real_config(RESNET_ID), **architecture, "num_labels": int(num_labels)}
    config.pop("id2label", None)
    config.pop("label2id", None)
    return ResNetForImageClassification(ResNetConfig(**config))


def reference_processor() -> Any:
    """microsoft/resnet-50's image processor at Open-Insect's evaluation pixels: Resize(128, bilinear) + CenterCrop(126)
    (`configs/datasets/c-america.yml`: pre_size 128, image_size 126; `test_preprocessor.py`), ImageNet mean and std
    (`normalization_type: imagenet`)."""
    from transformers import AutoImageProcessor

    from pipelines.hub import PACKAGED_CONFIGS
    from pipelines.hub_ids import RESNET_ID
    from pipelines.training.recipes import CLASSIFIER_PIXELS

    sizes = CLASSIFIER_PIXELS["open-insects"]
    processor = AutoImageProcessor.from_pretrained(str(PACKAGED_CONFIGS / RESNET_ID))
    processor.size = {"shortest_edge": sizes["image_size"]}
    processor.crop_pct = sizes["image_size"] / sizes["pre_size"]
    processor.resample = 2  # bilinear
    return processor


def load_classifier(model: str | os.PathLike, network: str | None = None) -> Any:
    """A run's classifier (`model:`): a released weight file through `released_classifier`, else a transformers
    classifier (hub id or folder, `ImageClassifier.from_pretrained`)."""
    from pipelines.classifier import ImageClassifier

    if is_released_file(model):
        return released_classifier(model, network)
    return ImageClassifier.from_pretrained(model)


def released_classifier(path: str | os.PathLike, network: str | None = None) -> Any:
    """An `ImageClassifier` of a released file (`model:`): its backbone and closed-set head `fc`, at Open-Insect's
    evaluation pixels. A network without a linear closed-set head (G-ODIN, ARPL's parts, OpenGAN's) is refused: its
    method's detector scores it (`load:`)."""
    made = read_released(path, network)
    if made.network not in HEADS or "fc" not in made.heads:
        raise made.fail("has no linear closed-set head (fc) to be a run's classifier (`model:`); evaluate it as its "
                        "method's detector (`detectors: [{name: ..., load: <file>}]`), with `model:` the region's "
                        "basics_<region>.pth")
    return as_classifier(made, made.heads["fc"]["weight"], made.heads["fc"]["bias"])


def as_classifier(made: ReleasedNetwork, weight: torch.Tensor, bias: torch.Tensor) -> Any:
    """The backbone of `made` with the head (`weight`, `bias`) as an `ImageClassifier` at Open-Insect's evaluation
    pixels (the reference Resize + CenterCrop record a train_classifier folder keeps)."""
    from pipelines.classifier import ImageClassifier
    from pipelines.pixels import record_pixels

    processor = reference_processor()
    classifier = ImageClassifier.from_model(load_backbone(made, weight, bias).eval(), processor, str(made.path))
    crop = processor.size["shortest_edge"]
    classifier.record = {"transform": "reference", "image_size": crop, "pre_size": round(crop / processor.crop_pct),
                         "resample": "bilinear", "orient": False}
    classifier.pixels = record_pixels(classifier.record)
    return classifier


def load_backbone(made: ReleasedNetwork, weight: torch.Tensor, bias: torch.Tensor,
                  model: torch.nn.Module | None = None) -> torch.nn.Module:
    """The file's backbone with the head (`weight`, `bias`) as a transformers ResNet classifier: loaded into `model`
    (a run's classifier copy; its architecture must be the file's) or a new one built from the file's tensors."""
    from pipelines.torchvision_resnet import convert_state_dict

    if model is not None and model.config.num_labels != weight.shape[0]:
        raise made.fail(f"{weight.shape[0]} classes where the run's classifier (model:) has {model.config.num_labels}")
    model = model if model is not None else _resnet_model(resnet_architecture(made.backbone), weight.shape[0])
    expected = model.state_dict()
    try:
        converted = convert_state_dict({**made.backbone, "fc.weight": weight, "fc.bias": bias}, expected)
    except ValueError as err:
        raise made.fail(str(err)) from None
    model.load_state_dict({k: v.to(expected[k].dtype) for k, v in converted.items()})
    return model
