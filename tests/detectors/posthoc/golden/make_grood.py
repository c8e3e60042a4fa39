"""Golden scores of OpenOOD's GROOD postprocessor (openood/postprocessors/grood.py at openood_ref.COMMIT, the config
of configs/postprocessors/grood.yaml), run on fixed features through a stand-in net: its "images" are [B, 3, S, S]
arrays whose flattening is the penultimate feature h (D = 3 S^2), `net(x, return_feature_list=True)` =
(W h + b, [h, h, h, h, h]) (the list long enough for `pre_layer_indx` 3, which only the synthetic-OOD path reads).

Two things the reference needs that it does not set: `self.dataset_name` (read after the index is built,
grood.py:644, never assigned: an AttributeError otherwise) is set to "cifar10", and torchvision (imported, used only by
the uniform-noise path) is a stub. Loaders are lists of batches in order (the reference's train loader shuffles).
Writes grood.json beside this file."""
from __future__ import annotations

import sys
import types
from types import SimpleNamespace

import numpy as np
import openood_ref
import torch

S, C = 2, 4
D = 3 * S * S
TRAIN_BATCH, OOD_BATCH = 8, 6


def stub_torchvision() -> None:
    """A torchvision with the names grood.py and preprocessors/transform.py touch at import."""
    vision = types.ModuleType("torchvision")
    vision.transforms = types.ModuleType("torchvision.transforms")
    vision.transforms.InterpolationMode = SimpleNamespace(NEAREST="nearest", BILINEAR="bilinear")
    vision.transforms.GaussianBlur = None
    sys.modules["torchvision"], sys.modules["torchvision.transforms"] = vision, vision.transforms


class StandIn(torch.nn.Module):
    """The flattened input is the penultimate feature; the head is a linear layer."""

    def __init__(self, weight: np.ndarray, bias: np.ndarray):
        super().__init__()
        self.fc = torch.nn.Linear(weight.shape[1], weight.shape[0])
        with torch.no_grad():
            self.fc.weight.copy_(torch.from_numpy(weight))
            self.fc.bias.copy_(torch.from_numpy(bias))

    def forward(self, x, return_feature_list=False):
        h = x.reshape(x.shape[0], -1)
        logits = self.fc(h)
        return (logits, [h, h, h, h, h]) if return_feature_list else logits


def images(h: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(h.reshape(len(h), 3, S, S).copy())


def loader(h: np.ndarray, labels: np.ndarray, batch: int) -> list[dict]:
    return [{"data": images(h[i:i + batch]), "label": torch.from_numpy(labels[i:i + batch].copy())}
            for i in range(0, len(h), batch)]


def run(module, train, labels, ood_val, test, weight, bias, **args) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    defaults = dict(pre_layer_indx=3, lam=0.8, k=1, n_noise_samples=100, sampling_ratio=1.0, use_val=False,
                    use_mixup_loss=True, use_cosine=False, distance_loss=False, use_nearest_proto=False,
                    use_pseudo_prototype=False, no_gradients=False, use_grad_norm=False, use_gaussian_noise=False,
                    use_val_ood=True, use_synthetic=False, synthetic_name=None, filter_ood=False,
                    use_proto_mean=False, use_direct_grad=False)  # grood.yaml:5-24
    config = openood_ref.config(**{**defaults, **args})
    config.dataset = SimpleNamespace(name="cifar10", num_classes=C, image_size=S)
    post = module.GrOODPostprocessor(config)
    post.dataset_name = "cifar10"  # grood.py:644 reads it; nothing assigns it
    net = StandIn(weight, bias)
    post.setup(net, {"train": loader(train, labels, TRAIN_BATCH)},
               {"val": loader(ood_val, np.zeros(len(ood_val), np.int64), OOD_BATCH)})
    _, score = post.postprocess(net, images(test))
    return (score.numpy().astype(np.float64), post.prototypes.numpy().astype(np.float64),
            post.noise_proto.numpy().astype(np.float64))


def main() -> None:
    stub_torchvision()
    module = openood_ref.load("grood", extra=("openood/preprocessors/transform.py",))
    rng = np.random.default_rng(39)
    centres = openood_ref.rounded(rng, (C, D), 2.0)
    weight = np.round(centres * 0.3 + openood_ref.rounded(rng, (C, D), 0.2), 4).astype(np.float32)
    bias = openood_ref.rounded(rng, (C,), 0.2)
    labels = np.repeat(np.arange(C), 20)
    rng.shuffle(labels)
    train = np.round(centres[labels] + openood_ref.rounded(rng, (len(labels), D)), 4).astype(np.float32)
    ood_val = openood_ref.rounded(rng, (20, D), 2.5)
    test = np.concatenate([np.round(centres[rng.integers(0, C, 16)] + openood_ref.rounded(rng, (16, D)), 4),
                           openood_ref.rounded(rng, (12, D), 2.5)]).astype(np.float32)
    cases = []
    for n_noise in (100, 10, 3):  # every OOD-val row; two whole batches; one batch
        scores, prototypes, noise = run(module, train, labels, ood_val, test, weight, bias, n_noise_samples=n_noise)
        cases.append({"n_noise_samples": n_noise, "scores": openood_ref.as_list(scores),
                      "prototypes": openood_ref.as_list(prototypes), "noise": openood_ref.as_list(noise)})
    payload = {"inputs": {"weight": openood_ref.as_list(weight), "bias": openood_ref.as_list(bias),
                          "train": openood_ref.as_list(train), "labels": labels.tolist(),
                          "ood_val": openood_ref.as_list(ood_val), "test": openood_ref.as_list(test),
                          "train_batch_rows": TRAIN_BATCH, "ood_batch_rows": OOD_BATCH},
               "cases": cases}
    print(openood_ref.write("grood", "make_grood.py", payload))


if __name__ == "__main__":
    main()
