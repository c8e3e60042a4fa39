"""torchvision ResNet checkpoints load into the transformers ResNet: random weights in torchvision's key layout,
converted, give the logits of an independent forward of that layout (by hand with torch.nn.functional, and by
Debian's torchvision itself in a separate process where it is installed)."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from pipelines.torchvision_resnet import convert_state_dict, load_torchvision_resnet

SYSTEM_PYTHON = "/usr/bin/python3"


def torchvision_layout(depths: list[int], widths: list[int], stem: int, classes: int,
                       seed: int) -> dict[str, torch.Tensor]:
    """Random weights named as torchvision's Bottleneck ResNet names them (expansion 4, stride on the 3x3)."""
    g = torch.Generator().manual_seed(seed)
    state: dict[str, torch.Tensor] = {}

    def conv(name: str, cout: int, cin: int, k: int) -> None:
        state[f"{name}.weight"] = torch.randn(cout, cin, k, k, generator=g) * (2 / (cin * k * k)) ** 0.5

    def bn(name: str, c: int) -> None:
        state[f"{name}.weight"] = 1 + 0.1 * torch.randn(c, generator=g)
        state[f"{name}.bias"] = 0.1 * torch.randn(c, generator=g)
        state[f"{name}.running_mean"] = 0.1 * torch.randn(c, generator=g)
        state[f"{name}.running_var"] = 1 + 0.2 * torch.rand(c, generator=g)
        state[f"{name}.num_batches_tracked"] = torch.tensor(7)

    conv("conv1", stem, 3, 7)
    bn("bn1", stem)
    cin = stem
    for s, (depth, out) in enumerate(zip(depths, widths), start=1):
        mid = out // 4
        for i in range(depth):
            p = f"layer{s}.{i}"
            conv(f"{p}.conv1", mid, cin, 1), bn(f"{p}.bn1", mid)
            conv(f"{p}.conv2", mid, mid, 3), bn(f"{p}.bn2", mid)
            conv(f"{p}.conv3", out, mid, 1), bn(f"{p}.bn3", out)
            if i == 0:
                conv(f"{p}.downsample.0", out, cin, 1), bn(f"{p}.downsample.1", out)
            cin = out
    state["fc.weight"] = torch.randn(classes, cin, generator=g) * 0.05
    state["fc.bias"] = torch.randn(classes, generator=g) * 0.05
    return state


def torchvision_forward(state: dict[str, torch.Tensor], x: torch.Tensor, depths: list[int]) -> torch.Tensor:
    """The torchvision ResNet forward (eval mode) written out with torch.nn.functional."""
    def bn(h: torch.Tensor, name: str) -> torch.Tensor:
        return F.batch_norm(h, state[f"{name}.running_mean"], state[f"{name}.running_var"], state[f"{name}.weight"],
                            state[f"{name}.bias"], False, 0.0, 1e-5)

    h = F.relu(bn(F.conv2d(x, state["conv1.weight"], stride=2, padding=3), "bn1"))
    h = F.max_pool2d(h, 3, 2, 1)
    for s, depth in enumerate(depths, start=1):
        for i in range(depth):
            p = f"layer{s}.{i}"
            stride = 2 if (i == 0 and s > 1) else 1
            out = F.relu(bn(F.conv2d(h, state[f"{p}.conv1.weight"]), f"{p}.bn1"))
            out = F.relu(bn(F.conv2d(out, state[f"{p}.conv2.weight"], stride=stride, padding=1), f"{p}.bn2"))
            out = bn(F.conv2d(out, state[f"{p}.conv3.weight"]), f"{p}.bn3")
            skip = bn(F.conv2d(h, state[f"{p}.downsample.0.weight"], stride=stride), f"{p}.downsample.1") \
                if f"{p}.downsample.0.weight" in state else h
            h = F.relu(out + skip)
    return F.linear(h.mean((2, 3)), state["fc.weight"], state["fc.bias"])


def _hf_resnet(depths: list[int], widths: list[int], stem: int, classes: int):
    from transformers import ResNetConfig, ResNetForImageClassification

    from pipelines.hub import real_config

    real = real_config("microsoft/resnet-50")
    config = ResNetConfig(**{**real, "depths": depths, "hidden_sizes": widths, "embedding_size": stem,
                             "num_labels": classes})
    return ResNetForImageClassification(config).eval()


def test_converted_weights_give_the_torchvision_layouts_logits(tmp_path):
    depths, widths, stem = [2, 1, 2, 1], [32, 64, 64, 128], 16
    state = torchvision_layout(depths, widths, stem, 5, seed=0)
    model = _hf_resnet(depths, widths, stem, 5)
    path = tmp_path / "resnet.pth"
    torch.save(state, path)
    load_torchvision_resnet(path, model)
    x = torch.randn(3, 3, 64, 48, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = model(pixel_values=x).logits
    theirs = torchvision_forward(state, x, depths)
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)
    assert theirs.abs().max() > 0.1 and (theirs[0] - theirs[1]).abs().max() > 1e-3  # not a degenerate comparison


def test_a_checkpoint_of_another_head_keeps_the_new_head_and_wrong_keys_are_refused(tmp_path):
    from pipelines.errors import ConfigError

    depths, widths, stem = [1, 1, 1, 1], [16, 32, 32, 64], 8
    state = torchvision_layout(depths, widths, stem, 1000, seed=2)  # an ImageNet head
    model = _hf_resnet(depths, widths, stem, 4)
    head = model.classifier[1].weight.detach().clone()
    torch.save(state, tmp_path / "imagenet.pth")
    load_torchvision_resnet(tmp_path / "imagenet.pth", model)
    assert torch.equal(model.classifier[1].weight, head)
    torch.testing.assert_close(model.resnet.embedder.embedder.convolution.weight, state["conv1.weight"])
    with pytest.raises(ValueError, match="not a torchvision ResNet key"):
        convert_state_dict({"layer9.0.conv1.weight": torch.zeros(1)}, model.state_dict())
    with pytest.raises(ValueError, match=r"fc.weight: shape \(1000, 64\) where the model has \(4, 64\)"):
        convert_state_dict(state, model.state_dict())
    torch.save({k: v for k, v in state.items() if k != "layer1.0.conv2.weight"}, tmp_path / "short.pth")
    with pytest.raises(ConfigError, match="model: .*lacks 1 tensor"):
        load_torchvision_resnet(tmp_path / "short.pth", model)


def _has_torchvision() -> bool:
    return Path(SYSTEM_PYTHON).is_file() and subprocess.run([SYSTEM_PYTHON, "-c", "import torchvision"],
                                                            capture_output=True).returncode == 0


ORACLE = r"""
import sys, torch, torchvision
state = torch.load(sys.argv[1])
model = torchvision.models.resnet50()
model.load_state_dict(state)
model.eval()
x = torch.load(sys.argv[2])
with torch.no_grad():
    torch.save(model(x), sys.argv[3])
"""


@pytest.mark.slow
@pytest.mark.skipif(not _has_torchvision(),
                    reason="the oracle is Debian's torchvision: apt-get install -y python3-torchvision")
def test_full_resnet50_matches_torchvision_itself(tmp_path):
    depths, widths = [3, 4, 6, 3], [256, 512, 1024, 2048]
    state = torchvision_layout(depths, widths, 64, 1000, seed=3)
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(4))
    torch.save(state, tmp_path / "resnet50.pth", _use_new_zipfile_serialization=True)
    torch.save(x, tmp_path / "x.pt")
    (tmp_path / "oracle.py").write_text(ORACLE)
    done = subprocess.run([SYSTEM_PYTHON, str(tmp_path / "oracle.py"), str(tmp_path / "resnet50.pth"),
                           str(tmp_path / "x.pt"),
                           str(tmp_path / "logits.pt")], capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    theirs = torch.load(tmp_path / "logits.pt", weights_only=True)
    model = _hf_resnet(depths, widths, 64, 1000)
    load_torchvision_resnet(tmp_path / "resnet50.pth", model)
    with torch.no_grad():
        ours = model(pixel_values=x).logits
    torch.testing.assert_close(ours, theirs, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(torchvision_forward(state, x, depths), theirs, rtol=1e-3, atol=1e-3)
