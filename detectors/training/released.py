"""Training-time detectors from the Open-Insect model zoo's released files (`pipelines.zoo`): evaluation only.

`load: <zoo>/<method>_<region>.pth` on a training-time method's entry builds the detector as its fine-tune would have
left it, with no training: the file's backbone is loaded into the method's copy of the run's classifier (or a
classifier built from the file when the run has none), its closed-set head becomes the detector's head, and the
method's own tensors its extra arrays (`released_arrays`: ConfBranch's `confidence`, G-ODIN's `h` and `g`, RotPred's
`rot_fc`, NovelBranch / Extended's `fc_extended`, ARPL's reciprocal points), so it scores by its own rule and its
`rules` re-score it. ARPL is two files (`arpl_netF_<region>.pth`, `arpl_criterion_<region>.pth`): either name loads
both.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

from detectors.base import LinearHead, as_numpy
from pipelines.zoo import ReleasedNetwork, as_classifier, files_read, load_backbone, parse_name, read_released

Parts = dict[str, ReleasedNetwork]


def read_parts(cls: Any, path: str | os.PathLike) -> Parts:
    """The released file(s) of `cls`'s network, read and checked: {"network": ...}, ARPL also {"criterion": ...}."""
    network = cls.released_network
    if network is None:
        raise ValueError(f"{cls.name}: the Open-Insect model zoo releases no network of this method")
    name = parse_name(path)
    if network == "arpl_net":
        if name is None or name.method != "arpl":
            raise ValueError(f"{cls.name}: {os.fspath(path)}: ARPL is released as two files, arpl_netF_<region>.pth "
                             "and arpl_criterion_<region>.pth (test_arpl.yml); name either")
        net, criterion = files_read(path)
        parts = {"network": read_released(net, "resnet50_features"),
                 "criterion": read_released(criterion, "arpl_criterion")}
        points = parts["criterion"].state["points"]
        if points.shape[1] != parts["network"].feature_dim:
            raise parts["criterion"].fail(f"points are {tuple(points.shape)}: they must have the backbone's "
                                          f"{parts['network'].feature_dim} features")
        return parts
    if name is not None and name.network != network:
        raise ValueError(f"{cls.name}: {os.fspath(path)} is named for {name.method} ({name.network}); {cls.name} reads "
                         f"{network} files")
    return {"network": read_released(path, network)}


def load_released(cls: Any, path: str | os.PathLike, **overrides: Any) -> Any:
    """`cls` fitted from its released file(s): backbone into its classifier, head and extra arrays from the file."""
    parts = read_parts(cls, path)
    det = cls(**overrides)
    if det.params["mode"] != "full":
        raise ValueError(f"{cls.name}: a released network scores with its own backbone (mode full); mode "
                         f"{det.params['mode']!r} would read the run classifier's features")
    det.extra = det.released_arrays(parts)
    weight, bias = det.released_head(parts)
    made = parts["network"]
    if det.classifier is None:
        det.classifier = as_classifier(made, weight, bias)
    else:
        if getattr(det.classifier, "kind", None) != "hf" or getattr(det.classifier.model.config, "model_type",
                                                                         None) != "resnet":
            raise made.fail("its backbone is a ResNet; the run's classifier (model:) is not one")
        load_backbone(made, weight, bias, det.classifier.model)
        det.classifier.eval()
    det.head = LinearHead(as_numpy(weight, np.float64), as_numpy(bias, np.float64))
    det.history = []
    det.fitted = True
    det._forget_features()
    return det


def linear(made: ReleasedNetwork, module: str, prefix: str) -> dict[str, np.ndarray]:
    """A released linear layer's weight and bias as float64 arrays `<prefix>.weight` / `<prefix>.bias`."""
    return {f"{prefix}.{leaf}": as_numpy(made.head(module)[leaf], np.float64) for leaf in ("weight", "bias")}


def fc_head(parts: Parts) -> tuple[torch.Tensor, torch.Tensor]:
    """The closed-set head of a released network: its `fc`."""
    fc = parts["network"].head("fc")
    return fc["weight"], fc["bias"]
