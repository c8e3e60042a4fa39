"""OpenOOD v1.5's `best.ckpt` as `model:`: a state dict with the reference networks' key names (built key by key in
tests/helpers/openood_release.py) loads strictly, and its logits equal the forward written there in plain torch from
the reference code (openood/networks/resnet18_32x32.py; torchvision's ResNet for ResNet18_224x224 / ResNet50)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from pipelines.errors import ConfigError, UserInputError
from pipelines.openood_checkpoints import is_openood_checkpoint, load_openood_classifier
from pipelines.pixels import reference_record
from tests.helpers.openood_release import (
    forward_32x32,
    forward_torchvision,
    head_32x32,
    resnet18_32x32_state,
    stages_32x32,
    torchvision_resnet_state,
)


def _save(tmp_path, state) -> str:
    path = tmp_path / "s0" / "best.ckpt"
    path.parent.mkdir(parents=True)
    torch.save(state, path)  # OpenOOD: torch.save(net.state_dict(), 'best.ckpt')
    return str(path)


@pytest.mark.slow
def test_resnet18_32x32_best_ckpt_logits_and_pixels(tmp_path):
    state = resnet18_32x32_state(num_classes=10, width=4)
    path = _save(tmp_path, state)
    assert is_openood_checkpoint(path) and not is_openood_checkpoint(tmp_path / "missing.ckpt")
    clf = load_openood_classifier(path)
    assert clf.num_classes == 10 and clf.image_size == (32, 32)
    assert clf.record == {"transform": "reference", "image_size": 32, "pre_size": 32, "resample": "bilinear",
                          "orient": False}
    x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits, features = clf(x)
    torch.testing.assert_close(logits, forward_32x32(state, x), rtol=1e-4, atol=1e-5)
    assert features.shape == (3, 32)  # the pooled input of fc: 8 * width
    # the pixels: a 32x32 image unchanged by Resize(32) + CenterCrop(32), then CIFAR-10's mean / std
    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8))
    mean, std = torch.tensor([0.4914, 0.4822, 0.4465]), torch.tensor([0.2470, 0.2435, 0.2616])
    expected = (torch.from_numpy(np.array(image)).permute(2, 0, 1) / 255.0 - mean[:, None, None]) / std[:, None, None]
    torch.testing.assert_close(clf.preprocess([image])[0], expected, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_resnet18_32x32_feeds_the_feature_map_detectors(tmp_path):
    """Gram, MDSEns and RankFeat read `hidden_maps` (stem, stages 1-4) and RankFeat re-runs layer4 + pooling + fc:
    the maps equal the plain-torch stages and RankFeat's logits its rank-1 removal done here by SVD."""
    import detectors

    state = resnet18_32x32_state(num_classes=10, width=4, seed=5)
    clf = load_openood_classifier(_save(tmp_path, state))
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        logits, maps = clf.hidden_maps(x)
    expected = stages_32x32(state, x)
    assert [m.shape[1:] for m in maps] == [(4, 32, 32), (4, 32, 32), (8, 16, 16), (16, 8, 8), (32, 4, 4)]
    for got, want in zip(maps, expected):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(logits, head_32x32(state, expected[-1]), rtol=1e-4, atol=1e-5)

    def minus_rank1(m: torch.Tensor) -> torch.Tensor:
        flat = m.double().flatten(2)
        u, s, vh = torch.linalg.svd(flat, full_matrices=False)
        return (flat - s[:, :1, None] * u[:, :, :1] @ vh[:, :1, :]).reshape(m.shape).float()

    block4 = head_32x32(state, minus_rank1(expected[4]))
    block3 = head_32x32(state, stages_32x32(state, x, start=4, out=minus_rank1(expected[3]))[-1])
    rankfeat = detectors.build("rankfeat", classifier=clf)
    np.testing.assert_allclose(rankfeat.block_logits(x), ((block4 + block3) / 2).numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("classes,bottleneck", [(200, False), (1000, True)])
def test_torchvision_resnets_best_ckpt_logits(tmp_path, classes, bottleneck):
    """ImageNet-200's ResNet18_224x224 and ImageNet-1K's ResNet50: torchvision's keys, ImageNet's 256 / 224."""
    state = torchvision_resnet_state(classes, width=4, bottleneck=bottleneck)
    clf = load_openood_classifier(_save(tmp_path, state))
    assert clf.num_classes == classes and clf.image_size == (224, 224)
    # OpenOOD's TestStandardPreProcessor for ImageNet: Resize(256, bilinear) + CenterCrop(224), ImageNet's statistics
    assert reference_record(clf.pixels) == {"transform": "reference", "image_size": 224, "pre_size": 256,
                                            "resample": "bilinear", "orient": False}
    torch.testing.assert_close(clf.mean.flatten(), torch.tensor([0.485, 0.456, 0.406]))
    torch.testing.assert_close(clf.std.flatten(), torch.tensor([0.229, 0.224, 0.225]))
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        logits, features = clf(x)
    torch.testing.assert_close(logits, forward_torchvision(state, x), rtol=1e-4, atol=1e-5)
    assert features.shape == (2, 32 * (4 if bottleneck else 1))


def test_bad_checkpoints_are_one_line(tmp_path):
    state = resnet18_32x32_state(num_classes=10, width=4)
    extra = {**state, "layer1.0.extra.weight": torch.zeros(1)}
    with pytest.raises(ConfigError, match=r"model: .*best\.ckpt: not this network's state dict: 0 missing key\(s\) "
                                          r"\[\], 1 unexpected key\(s\) \['layer1\.0\.extra\.weight'\]"):
        load_openood_classifier(_save(tmp_path / "a", extra))
    shrunk = {**state, "layer2.0.conv2.weight": state["layer2.0.conv2.weight"][:, :4]}
    with pytest.raises(ConfigError, match=r"layer2\.0\.conv2\.weight has shape \(8, 4, 3, 3\) where the network has "
                                          r"\(8, 8, 3, 3\)"):
        load_openood_classifier(_save(tmp_path / "b", shrunk))
    with pytest.raises(ConfigError, match=r"its head has 7 classes, which names no OpenOOD v1\.5 benchmark"):
        load_openood_classifier(_save(tmp_path / "c", resnet18_32x32_state(num_classes=7, width=4)))
    with pytest.raises(ConfigError, match=r"no 'fc\.weight': not an OpenOOD ResNet checkpoint"):
        load_openood_classifier(_save(tmp_path / "d", {"conv1.weight": state["conv1.weight"]}))
    with pytest.raises(UserInputError, match=r"^model: OpenOOD checkpoint .* holds pickled objects other than tensors "
                                             r"and is refused"):
        load_openood_classifier(_save(tmp_path / "e", {"net": torch.nn.Linear(2, 2)}))
    whole = Path(_save(tmp_path / "g", state)).read_bytes()
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(whole[:len(whole) // 2])
    with pytest.raises(ConfigError, match=r"^model: .*truncated\.ckpt: not a readable torch checkpoint"):
        load_openood_classifier(truncated)
    broken = tmp_path / "f.ckpt"
    broken.write_bytes(b"not a torch file")
    with pytest.raises(UserInputError, match=r"f\.ckpt' holds pickled objects other than tensors"):  # not a torch zip
        load_openood_classifier(broken)
