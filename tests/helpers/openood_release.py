"""Stand-ins of OpenOOD v1.5's released benchmark: its data folder (image lists under `benchmark_imglist/<benchmark>/`
with the file names its evaluation API reads, images under `images_classic/` / `images_largescale/`) and its
checkpoints (`best.ckpt`: `net.state_dict()` with the reference networks' key names), sizes shrunk.

The names and folders are written out here from OpenOOD's `openood/evaluation_api/datasets.py` (DATA_INFO), not read
from the code under test; the state dicts are built key by key from `openood/networks/resnet18_32x32.py` and
torchvision's ResNet, so a strict load proves the loader's network has the reference's names; `forward_32x32` and
`forward_torchvision` are those networks' forward passes written out in plain torch (the logits oracle).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

# benchmark -> (list folder, ID image folder, OOD val list, near sets, far sets); set -> (list file, image folder)
RELEASE = {
    "cifar10": ("cifar10", "images_classic", ("val_tin.txt", "images_classic"),
                {"cifar100": ("test_cifar100.txt", "images_classic"), "tin": ("test_tin.txt", "images_classic")},
                {"mnist": ("test_mnist.txt", "images_classic"), "svhn": ("test_svhn.txt", "images_classic"),
                 "texture": ("test_texture.txt", "images_classic"),
                 "places365": ("test_places365.txt", "images_classic")}),
    "cifar100": ("cifar100", "images_classic", ("val_tin.txt", "images_classic"),
                 {"cifar10": ("test_cifar10.txt", "images_classic"), "tin": ("test_tin.txt", "images_classic")},
                 {"mnist": ("test_mnist.txt", "images_classic"), "svhn": ("test_svhn.txt", "images_classic"),
                  "texture": ("test_texture.txt", "images_classic"),
                  "places365": ("test_places365.txt", "images_classic")}),
    "imagenet200": ("imagenet200", "images_largescale", ("val_openimage_o.txt", "images_largescale"),
                    {"ssb_hard": ("test_ssb_hard.txt", "images_largescale"),
                     "ninco": ("test_ninco.txt", "images_largescale")},
                    {"inaturalist": ("test_inaturalist.txt", "images_largescale"),
                     "textures": ("test_textures.txt", "images_classic"),
                     "openimage_o": ("test_openimage_o.txt", "images_largescale")}),
    "imagenet": ("imagenet", "images_largescale", ("val_openimage_o.txt", "images_largescale"),
                 {"ssb_hard": ("test_ssb_hard.txt", "images_largescale"),
                  "ninco": ("test_ninco.txt", "images_largescale")},
                 {"inaturalist": ("test_inaturalist.txt", "images_largescale"),
                  "textures": ("test_textures.txt", "images_classic"),
                  "openimage_o": ("test_openimage_o.txt", "images_largescale")}),
}
NUM_CLASSES = {"cifar10": 10, "cifar100": 100, "imagenet200": 200, "imagenet": 1000}


def _image(path: Path, rng: np.random.Generator, size: tuple[int, int], shift: int = 0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = rng.integers(0, 200, (size[1], size[0], 3)) + shift
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(path)


def fake_benchmark(root: Path, name: str, *, id_counts: tuple[int, int, int] = (12, 4, 6), ood_count: int = 3,
                   size: tuple[int, int] = (32, 32), seed: int = 0,
                   classes: int = 3) -> dict[str, list[tuple[str, str]]]:
    """OpenOOD's data folder for benchmark `name` under `root`: per list file, its (path, label) lines (also
    returned, by list file name). ID labels cycle through 0..classes-1; OOD images are brighter (shift 55) so a model
    can tell them apart; OOD lines carry label -1, as OpenOOD's do."""
    folder, id_data, val, near, far = RELEASE[name]
    rng = np.random.default_rng(seed)
    lists: dict[str, list[tuple[str, str]]] = {}
    for split, count in zip(("train", "val", "test"), id_counts):
        lines = [(f"{name}/{split}/class{i % classes}/{i:04d}.png", str(i % classes)) for i in range(count)]
        lists[f"{split}_{name}.txt"] = lines
        for path, _ in lines:
            _image(root / id_data / path, rng, size)
    for file, data in [*near.values(), *far.values(), val]:
        kind, _, stem = file[:-len(".txt")].partition("_")  # test_<set> or val_<set>
        lines = [(f"{stem}/{kind}/{i:03d}.png", "-1") for i in range(ood_count)]
        lists[file] = lines
        for path, _ in lines:
            _image(root / data / path, rng, size, shift=55)
    target = root / "benchmark_imglist" / folder
    target.mkdir(parents=True, exist_ok=True)
    for file, lines in lists.items():
        (target / file).write_text("".join(f"{p} {label}\n" for p, label in lines))
    return lists


def _conv(out: int, inp: int, k: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(out, inp, k, k, generator=gen) * (2.0 / (inp * k * k)) ** 0.5


def _bn(prefix: str, n: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    return {f"{prefix}.weight": 1 + 0.2 * torch.randn(n, generator=gen),
            f"{prefix}.bias": 0.1 * torch.randn(n, generator=gen),
            f"{prefix}.running_mean": 0.1 * torch.randn(n, generator=gen),
            f"{prefix}.running_var": 0.5 + torch.rand(n, generator=gen),
            f"{prefix}.num_batches_tracked": torch.tensor(100, dtype=torch.long)}


def resnet18_32x32_state(num_classes: int = 10, width: int = 4, seed: int = 0) -> dict[str, torch.Tensor]:
    """`ResNet18_32x32(num_classes).state_dict()` as OpenOOD names it (`width` 64 in the release), random weights and
    batch-norm statistics."""
    gen = torch.Generator().manual_seed(seed)
    state = {"conv1.weight": _conv(width, 3, 3, gen), **_bn("bn1", width, gen)}
    inp = width
    for stage in range(1, 5):
        planes = width * 2 ** (stage - 1)
        for i in range(2):
            p = f"layer{stage}.{i}"
            state[f"{p}.conv1.weight"] = _conv(planes, inp, 3, gen)
            state.update(_bn(f"{p}.bn1", planes, gen))
            state[f"{p}.conv2.weight"] = _conv(planes, planes, 3, gen)
            state.update(_bn(f"{p}.bn2", planes, gen))
            if i == 0 and stage > 1:
                state[f"{p}.shortcut.0.weight"] = _conv(planes, inp, 1, gen)
                state.update(_bn(f"{p}.shortcut.1", planes, gen))
            inp = planes
    state["fc.weight"] = torch.randn(num_classes, inp, generator=gen) * 0.5
    state["fc.bias"] = 0.1 * torch.randn(num_classes, generator=gen)
    return state


def torchvision_resnet_state(num_classes: int, width: int = 4, bottleneck: bool = False,
                             seed: int = 0) -> dict[str, torch.Tensor]:
    """torchvision's ResNet-18 (basic) or ResNet-50 (bottleneck) state dict, the keys of OpenOOD's ResNet18_224x224 /
    ResNet50 (`width` 64 in the release)."""
    gen = torch.Generator().manual_seed(seed)
    blocks, expansion = ((3, 4, 6, 3), 4) if bottleneck else ((2, 2, 2, 2), 1)
    state = {"conv1.weight": _conv(width, 3, 7, gen), **_bn("bn1", width, gen)}
    inp = width
    for stage, count in enumerate(blocks, start=1):
        planes = width * 2 ** (stage - 1)
        for i in range(count):
            p = f"layer{stage}.{i}"
            if bottleneck:
                shapes = [(planes, inp, 1), (planes, planes, 3), (planes * expansion, planes, 1)]
            else:
                shapes = [(planes, inp, 3), (planes, planes, 3)]
            for k, (o, n, size) in enumerate(shapes, start=1):
                state[f"{p}.conv{k}.weight"] = _conv(o, n, size, gen)
                state.update(_bn(f"{p}.bn{k}", o, gen))
            if i == 0 and (stage > 1 or inp != planes * expansion):
                state[f"{p}.downsample.0.weight"] = _conv(planes * expansion, inp, 1, gen)
                state.update(_bn(f"{p}.downsample.1", planes * expansion, gen))
            inp = planes * expansion
    state["fc.weight"] = torch.randn(num_classes, inp, generator=gen) * 0.5
    state["fc.bias"] = 0.1 * torch.randn(num_classes, generator=gen)
    return state


# -- the reference networks' forward, written out in plain torch --------------------------------------------------
def _norm(x: torch.Tensor, s: dict[str, torch.Tensor], p: str) -> torch.Tensor:
    return F.batch_norm(x, s[f"{p}.running_mean"], s[f"{p}.running_var"], s[f"{p}.weight"], s[f"{p}.bias"],
                        training=False, eps=1e-5)


def stages_32x32(s: dict[str, torch.Tensor], x: torch.Tensor, start: int = 1, out: torch.Tensor | None = None
                 ) -> list[torch.Tensor]:
    """ResNet18_32x32's maps: relu(bn1(conv1 3x3/1)) then the outputs of layer1..4 (BasicBlocks); from `start` with
    `out` the input of that stage."""
    maps = [F.relu(_norm(F.conv2d(x, s["conv1.weight"], padding=1), s, "bn1"))] if out is None else [out]
    for stage in range(start, 5):
        out = maps[-1]
        for i in range(2):
            p, stride = f"layer{stage}.{i}", 2 if stage > 1 and i == 0 else 1
            y = F.relu(_norm(F.conv2d(out, s[f"{p}.conv1.weight"], stride=stride, padding=1), s, f"{p}.bn1"))
            y = _norm(F.conv2d(y, s[f"{p}.conv2.weight"], padding=1), s, f"{p}.bn2")
            short = out
            if f"{p}.shortcut.0.weight" in s:
                short = _norm(F.conv2d(out, s[f"{p}.shortcut.0.weight"], stride=stride), s, f"{p}.shortcut.1")
            out = F.relu(y + short)
        maps.append(out)
    return maps


def head_32x32(s: dict[str, torch.Tensor], last_map: torch.Tensor) -> torch.Tensor:
    """Global mean of the last map, then fc."""
    return F.linear(last_map.mean(dim=(2, 3)), s["fc.weight"], s["fc.bias"])


def forward_32x32(s: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """ResNet18_32x32.forward: the stem, layer1..4, global mean, fc."""
    return head_32x32(s, stages_32x32(s, x)[-1])


def forward_torchvision(s: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """torchvision ResNet.forward: 7x7/2 stem, BN, ReLU, 3x3/2 max-pool, basic or bottleneck blocks (the stride on
    the 3x3 convolution), global mean, fc."""
    out = F.relu(_norm(F.conv2d(x, s["conv1.weight"], stride=2, padding=3), s, "bn1"))
    out = F.max_pool2d(out, 3, stride=2, padding=1)
    bottleneck = "layer1.0.conv3.weight" in s
    for stage in range(1, 5):
        i = 0
        while f"layer{stage}.{i}.conv1.weight" in s:
            p, stride = f"layer{stage}.{i}", 2 if stage > 1 and i == 0 else 1
            if bottleneck:
                y = F.relu(_norm(F.conv2d(out, s[f"{p}.conv1.weight"]), s, f"{p}.bn1"))
                y = F.relu(_norm(F.conv2d(y, s[f"{p}.conv2.weight"], stride=stride, padding=1), s, f"{p}.bn2"))
                y = _norm(F.conv2d(y, s[f"{p}.conv3.weight"]), s, f"{p}.bn3")
            else:
                y = F.relu(_norm(F.conv2d(out, s[f"{p}.conv1.weight"], stride=stride, padding=1), s, f"{p}.bn1"))
                y = _norm(F.conv2d(y, s[f"{p}.conv2.weight"], padding=1), s, f"{p}.bn2")
            short = out
            if f"{p}.downsample.0.weight" in s:
                short = _norm(F.conv2d(out, s[f"{p}.downsample.0.weight"], stride=stride), s, f"{p}.downsample.1")
            out = F.relu(y + short)
            i += 1
    return F.linear(out.mean(dim=(2, 3)), s["fc.weight"], s["fc.bias"])
