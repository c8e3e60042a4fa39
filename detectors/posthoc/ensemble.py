"""Deep Ensemble (Lakshminarayanan et al., NeurIPS 2017) as OpenOOD v1.5 scores it: the max softmax of the mean logits
of several separately trained networks of one architecture.

OpenOOD (`openood/postprocessors/ensemble_postprocessor.py`) loads `num_networks` checkpoints,
`checkpoint_root/<checkpoints[i]>/best.ckpt` for the first `num_networks` names (`:28-31`, `:33-39`: copies of the
evaluated network, each `load_state_dict(strict=False)` and in eval mode), sums their logits in float32 and divides by
their number (`:42-48`), and scores max softmax of that mean (`:50-52`); the network the evaluator hands it only
supplies the architecture. `configs/postprocessors/ensemble.yml:4-7` lists five (net1 ... net5, num_networks 5), no
sweep; `scripts/uncertainty/ensemble/cifar10_test_ood_ensemble.sh` points `checkpoint_root` at five trainings.

Here the members are named directly (`members`: each a classifier the run can load as its `model:`: an OpenOOD
`.ckpt`, a model folder or hub id, a released Open-Insect file), so `num_networks` is their number. They read the
run classifier's evaluation pixels, normalised by its mean and std, as OpenOOD feeds every copy one batch; a member
whose input size or normalisation differs is refused (OpenOOD asserts the network name instead, `:17-19`). Library
use may pass the loaded classifiers (`models=`) instead of paths.
"""
from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from detectors.base import Detector, as_numpy
from detectors.posthoc.common import softmax
from detectors.posthoc.pixels import eval_mode, pixel_batches
from detectors.registry import register_detector
from pipelines.params import Params, param
from pipelines.progress import progress

FILE_SUFFIXES = (".ckpt", ".pth", ".pt", ".safetensors", ".bin")
"""A member ending so names a weight file: one that does not exist is refused in the plan."""


def load_member(source: str) -> Any:
    """The classifier `source` names, loaded as a run's `model:` is: an OpenOOD checkpoint (`*.ckpt`), a released
    Open-Insect file, else a transformers classifier (folder or hub id)."""
    from pipelines.openood_checkpoints import is_openood_checkpoint, load_openood_classifier
    from pipelines.zoo import load_classifier

    return load_openood_classifier(source, "members") if is_openood_checkpoint(source) else load_classifier(source)


def same_input(reference: Any, member: Any) -> bool:
    """Whether `member` reads the inputs `reference` is fed: the same image size, normalisation mean and std."""
    return (tuple(reference.image_size) == tuple(member.image_size)
            and torch.equal(reference.mean.detach().cpu().float(), member.mean.detach().cpu().float())
            and torch.equal(reference.std.detach().cpu().float(), member.std.detach().cpu().float()))


@torch.no_grad()
def mean_logits(members: Sequence[Any], x: torch.Tensor) -> torch.Tensor:
    """float32 [B, C]: the members' logits summed in order, divided by their number (ensemble_postprocessor.py:
    42-48)."""
    logits = [member(x)[0].float() for member in members]
    total = torch.zeros_like(logits[0])
    for z in logits:
        total += z
    return total / len(members)


@register_detector("ensemble")
class Ensemble(Detector):
    """s(x) = max_k softmax(mean over the members of their logits)_k. Needs images, the run classifier (its pixels) and
    the members."""

    label = "Deep Ensemble"
    reference_code = "OpenOOD openood/postprocessors/ensemble_postprocessor.py"
    family = "posthoc"
    inputs = frozenset({"images"})
    keeps_batches = True  # a killed rerun resumes within a set (Detector.score)
    runs_by_name = False  # its members are the user's trained classifiers: `detectors: all` leaves it out
    paper = ("Lakshminarayanan, Pritzel and Blundell, Simple and Scalable Predictive Uncertainty Estimation using Deep "
             "Ensembles, NeurIPS 2017")

    @dataclass(frozen=True)
    class Params(Params):
        members: list[str] = param([], "the ensemble's classifiers, one per separately trained network "
                                   "(ensemble.yml:5-7: five best.ckpt): OpenOOD .ckpt files, model folders or hub ids, "
                                   "released files")

    needs = frozenset({"classifier"})

    def __init__(self, classifier: Any = None, batch_size: int = 32, models: Sequence[Any] | None = None,
                 **params: Any) -> None:
        """`classifier`: the run's ImageClassifier, whose evaluation pixels, normalisation, device and dtype the members
        read with; `models`: loaded member classifiers instead of `members` paths (library use; a saved detector
        records `members` only, so one built from `models` loads back without members)."""
        super().__init__(**params)
        if models is not None and self.params["members"]:
            raise ValueError("ensemble: give the members as `members` (paths) or `models` (loaded), not both")
        self.classifier, self.batch_size = classifier, int(batch_size)
        self._models: list[Any] | None = list(models) if models is not None else None

    @classmethod
    def check_files(cls, params: dict[str, Any]) -> None:
        """The plan's check: members are given, and a member naming a weight file (or a local path) exists."""
        members = params.get("members") or []
        if not members:
            raise ValueError("members: none given; the ensemble scores with several separately trained classifiers "
                             "(OpenOOD's ensemble.yml lists five best.ckpt)")
        for source in members:
            local = str(source).endswith(FILE_SUFFIXES) or str(source).startswith(("/", "./", "../", "~"))
            if local and not Path(str(source)).expanduser().exists():
                raise ValueError(f"members: {source} does not exist")

    def members_loaded(self) -> list[Any]:
        """The member classifiers (loaded once), on the run classifier's device and dtype, each checked to read its
        inputs."""
        if self._models is None:
            if not self.params["members"]:
                raise ValueError("ensemble: no members (give `members`: the classifiers' paths, or `models=`)")
            self._models = [load_member(source) for source in self.params["members"]]
        if not self._models:
            raise ValueError("ensemble: no members (give `members`: the classifiers' paths, or `models=`)")
        reference = self._input_classifier()
        first = next(reference.parameters())
        for i, member in enumerate(self._models):
            if not same_input(reference, member):
                raise ValueError(f"ensemble: member {i} ({getattr(member, 'model_id', '?')}) reads {member.image_size} "
                                 f"pixels normalised by mean {member.mean.flatten().tolist()} and std "
                                 f"{member.std.flatten().tolist()}, the run classifier {reference.image_size}, "
                                 f"{reference.mean.flatten().tolist()}, {reference.std.flatten().tolist()}")
            member.to(device=first.device, dtype=first.dtype)
        return self._models

    def _input_classifier(self) -> Any:
        """The classifier whose pixels the members read: the run's, else the first member (library use)."""
        if self.classifier is not None:
            return self.classifier
        if self._models:
            return self._models[0]
        raise ValueError("ensemble needs the run classifier for its pixels: build('ensemble', classifier=...)")

    def batch_identity(self) -> dict[str, Any]:
        from pipelines.fingerprint import weights_fingerprint

        return {**super().batch_identity(), "members": [weights_fingerprint(m) for m in self.members_loaded()]}

    def _score(self, batch: Any) -> np.ndarray:
        members = self.members_loaded()
        reference = self._input_classifier()
        chunks, total = pixel_batches(reference, batch, self.batch_size, self.name)
        parts = []
        with ExitStack() as modes:  # each member in eval mode (OpenOOD's `.eval()`), its own flags restored after
            for member in members:
                modes.enter_context(eval_mode(member))
            for x in progress(chunks, total=total, desc=self.name, leave=False, disable=total < 2):
                parts.append(softmax(as_numpy(mean_logits(members, x), np.float64)).max(axis=1))
        return np.concatenate(parts) if parts else np.zeros(0)
