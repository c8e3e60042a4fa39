"""Grad-CAM against the closed form of a convnet whose head is global average pooling + linear."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from detectors.generative.gradcam import grad_cam, last_spatial_block


def test_grad_cam_matches_hand_computation(tiny_classifier):
    net = tiny_classifier.model
    x = torch.rand(3, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    targets = torch.tensor([0, 2, 3])
    layer_name = last_spatial_block(tiny_classifier, lambda: tiny_classifier.forward_images(x[:1]))
    assert layer_name == "model.body"  # the conv stack, whose output is its last ReLU's, before pooling
    cam = grad_cam(lambda v: tiny_classifier.forward_images(v)[0], tiny_classifier.get_submodule(layer_name), x,
                   targets, size=(16, 16))
    # logits = W @ mean_hw(A) + b, so d logit_c / d A_k = W[c, k] / (h w) everywhere and the CAM weight is the same
    with torch.no_grad():
        activation = net.body(tiny_classifier.normalize(x)).double().numpy()  # [B,16,16,16]
    weight = net.fc.weight.detach().double().numpy()
    for i, c in enumerate(targets.tolist()):
        raw = np.maximum(np.tensordot(weight[c] / (16 * 16), activation[i], axes=(0, 0)), 0)
        expected = (raw - raw.min()) / (raw.max() - raw.min() + 1e-7)
        np.testing.assert_allclose(cam[i].numpy(), expected, atol=1e-5)


def test_grad_cam_resizes_bilinearly_to_the_image(tiny_classifier):
    x = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    layer = tiny_classifier.get_submodule("model.body")
    small = grad_cam(lambda v: tiny_classifier.forward_images(v)[0], layer, x, torch.tensor([1, 1]), size=(16, 16))
    full = grad_cam(lambda v: tiny_classifier.forward_images(v)[0], layer, x, torch.tensor([1, 1]))
    assert full.shape == (2, 32, 32) and float(full.min()) >= 0 and float(full.max()) <= 1
    up = F.interpolate(small.unsqueeze(1), size=(32, 32), mode="bilinear", align_corners=False)[:, 0]
    lo, hi = up.flatten(1).min(1).values.view(-1, 1, 1), up.flatten(1).max(1).values.view(-1, 1, 1)
    # equal up to the 1e-7 guard of the normalisation (the raw CAM of a random net is ~1e-3 in magnitude)
    np.testing.assert_allclose(full.numpy(), ((up - lo) / (hi - lo)).numpy(), atol=1e-3)
