"""RankFeat against a float64 numpy computation (SVD, pooling, head, energy) on the tiny ResNet-50 stand-in."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from detectors import build
from detectors.posthoc.rankfeat import remove_rank1, remove_rank1_power


def _lse(z):
    m = z.max(1)
    return m + np.log(np.exp(z - m[:, None]).sum(1))


def _minus_rank1(x):
    """numpy float64: each [C, HW] map minus its top singular triple."""
    b, c, h, w = x.shape
    flat = x.reshape(b, c, h * w).astype(np.float64)
    out = np.empty_like(flat)
    for i, m in enumerate(flat):
        u, s, vt = np.linalg.svd(m, full_matrices=False)
        out[i] = m - s[0] * np.outer(u[:, 0], vt[0])
    return out.reshape(b, c, h, w)


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    from pipelines.classifier import ImageClassifier
    from pipelines.tiny import RESNET_ID, save_tiny_model

    clf = ImageClassifier.from_pretrained(save_tiny_model(tmp_path_factory.mktemp("rankfeat"), RESNET_ID))
    return clf.eval()


@pytest.mark.parametrize("blocks", ["3+4", "4"])
def test_rankfeat_by_hand(classifier, blocks):
    x = torch.randn(3, 3, 128, 128, generator=torch.Generator().manual_seed(0))  # block 4: 4x4 maps, block 3: 8x8
    scores = build("rankfeat", classifier=classifier, blocks=blocks).score(x)
    with torch.no_grad():
        _, hidden = classifier.hidden_maps(x)
        w, b = classifier.head.weight.double().numpy(), classifier.head.bias.double().numpy()
        logits = [_minus_rank1(hidden[-1].numpy()).mean((2, 3)) @ w.T + b]
        if blocks == "3+4":
            block3 = torch.as_tensor(_minus_rank1(hidden[-2].numpy()), dtype=torch.float32)
            stage4 = classifier.model.base_model.encoder.stages[-1]
            logits.append(stage4(block3).double().numpy().mean((2, 3)) @ w.T + b)
    want = _lse(sum(logits) / len(logits))
    np.testing.assert_allclose(scores, want, rtol=1e-4, atol=1e-4)


def test_rank1_removal_leaves_the_second_singular_value_and_power_iteration_agrees():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 6, 3, 3, generator=gen, dtype=torch.float64)
    x += 5 * torch.einsum("bc,bp->bcp", torch.randn(2, 6, generator=gen, dtype=torch.float64),
                          torch.randn(2, 9, generator=gen, dtype=torch.float64)).reshape(2, 6, 3, 3)
    removed = remove_rank1(x).numpy().reshape(2, 6, 9)
    for m, r in zip(x.numpy().reshape(2, 6, 9), removed):
        s = np.linalg.svd(m, compute_uv=False)
        assert np.linalg.norm(m - r, 2) == pytest.approx(s[0], rel=1e-10)
        assert np.linalg.svd(r, compute_uv=False)[0] == pytest.approx(s[1], rel=1e-10)
    np.testing.assert_allclose(remove_rank1_power(x, 50).numpy().reshape(2, 6, 9), removed, atol=1e-6)
    with pytest.raises(ValueError, match="blocks"):
        build("rankfeat", blocks="2")
