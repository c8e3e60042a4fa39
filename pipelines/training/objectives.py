"""What a training run optimises: `Objective` (a loss over model outputs, optional extra heads, aux stream, label
levels), the step's `TrainBatch`, the whole-set `Pass`, plain `CrossEntropy` and `MultiGranularity` (one head per
label level, the weighted sum of per-level cross-entropies)."""
from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

PRIMARY = "label"

# -- batches and objectives ----------------------------------------------------------------------------------
@dataclass
class TrainBatch:
    """One step's data: ID inputs `x` [B,...] with class indices `y` [B] and extra level targets; the aux stream.

    `aux_y` holds the auxiliary class index of each aux sample (e.g. its species among the auxiliary species),
    -1 when unknown. `generator` is the step's seeded CPU generator (for objectives that sample, e.g. mixing).
    `index` / `aux_index` are the rows' positions in the ID-train / aux set (for objectives with per-row state).
    `epoch` is the step's epoch, from 0 (for objectives with a per-epoch schedule of their own, e.g. ASCOOD's alpha).
    """

    x: torch.Tensor
    y: torch.Tensor
    targets: dict[str, torch.Tensor] = field(default_factory=dict)
    aux_x: torch.Tensor | None = None
    aux_y: torch.Tensor | None = None
    generator: torch.Generator | None = None
    index: torch.Tensor | None = None
    aux_index: torch.Tensor | None = None
    epoch: int = 0

    @property
    def n_id(self) -> int:
        return len(self.y)


class Objective(nn.Module):
    """A training loss. Subclasses override `loss` and, where needed, the hooks below.

    - `uses_aux` / `aux_batch_ratio`: the loop draws an auxiliary batch of `round(ratio * batch_size)` each step;
      `None` sizes it in proportion to the set sizes (as if ID and aux rows were shuffled into one pool).
    - `pooled`: instead, ID and aux rows are shuffled into ONE pool cut into batches of `batch_size` (an epoch covers
      both sets; a batch holds a random mix, possibly no ID row). Open-Insects' NovelBranch / Extended do this.
    - `needs_calibration` / `calibrate(id_logits, aux_logits)`: statistics of the model's outputs on all ID-train and
      aux rows, computed once before the first step (e.g. data-driven energy margins); `calibrate_pass(id_pass,
      aux_pass)` is the hook the loop calls, with the features too (CIDER's prototypes), by default `calibrate`.
    - `needs_epoch_pass` / `epoch_start(epoch, id_pass, aux_pass)`: the same pass (logits, features, row index, in
      row order) before every epoch (e.g. UDG's clustering).
    - `setup(feature_dim, num_classes, num_aux_classes)`: build extra heads (nn.Modules on `self`; they are trained).
    - `bind_head(head)`: the model's own closed-set head, handed over before `setup`, for objectives that apply it
      to their own transform of the features (T2FNorm: normalised features over tau), change its gradient (ISH) or
      run it on points of their own (VOS' virtual outliers).
    - `inputs(batch)`: the tensor run through the model (default: ID inputs then aux inputs, concatenated), or a tuple
      of tensors run as separate forward passes (outputs concatenated in order; matters with batch norm).
    - `model_inputs(model, batch)`: what the loop calls: `inputs(batch)` by default; objectives that make their inputs
      with the model itself (ASCOOD's outliers from input gradients) override it.
    - `replaces_head`: the objective computes its own closed-set logits from the features (ARPL, G-ODIN), so the
      classifier's head gets no gradient (DDP is told to expect unused parameters).
    - `epoch_begin(epoch)`: called before every epoch (from 0) without a pass (NPOS' `start_epoch_KNN`).
    - `no_decay_parameters()`: parameters trained without weight decay (G-ODIN's h).
    - `twice_stepped_parameters()`: parameters that also sit in a second, weight-decay-0 AdamW at the base lr, as
      G-ODIN's reference trainer has them (`loop.second_adam_step`).
    - `advances_schedule`: false for objectives whose reference trainer never advances its step counter (LogitNorm,
      ARPL: `pipelines.training.schedule`); only the "reference" schedule reads it.
    - `aux_active(epoch)`: whether the loop draws auxiliary batches in epoch `epoch` (from 0; MCD's `start_epoch_ft`).
    - `max_grad_norm`: when set, the gradients of every trained parameter are clipped to this total L2 norm before
      each step (RTS' trainer: 2.5).
    - `label_fields()`: extra label levels {level: manifest field}; `encode_targets` maps raw values to indices.
    - `heads(logits, features)`: logits per label level, used for validation accuracy.
    """

    uses_aux: bool = False
    aux_batch_ratio: float | None = 1.0
    pooled: bool = False
    needs_calibration: bool = False
    needs_epoch_pass: bool = False
    replaces_head: bool = False
    advances_schedule: bool = True
    max_grad_norm: float | None = None

    def setup(self, feature_dim: int, num_classes: int, num_aux_classes: int = 0) -> None:
        """Build extra heads; the default has none."""

    def bind_head(self, head: nn.Linear) -> None:
        """The model's closed-set head (trained with the model); the default objective does not keep it."""

    def calibrate(self, id_logits: torch.Tensor, aux_logits: torch.Tensor | None) -> None:
        """Use the untrained model's logits on the whole ID-train (and aux) set; called when `needs_calibration`."""

    def calibrate_pass(self, id_pass: Pass, aux_pass: Pass | None) -> None:
        """The whole passes (logits, features) before the first step, when `needs_calibration`; default: `calibrate`."""
        self.calibrate(id_pass.logits, aux_pass and aux_pass.logits)

    def epoch_start(self, epoch: int, id_pass: Pass, aux_pass: Pass | None) -> None:
        """Called before every epoch with the model's outputs on every ID-train / aux row; when `needs_epoch_pass`."""

    def epoch_begin(self, epoch: int) -> None:
        """Called before every epoch (from 0), resumed ones included; the default does nothing."""

    def no_decay_parameters(self) -> list[nn.Parameter]:
        return []

    def twice_stepped_parameters(self) -> list[nn.Parameter]:
        return []

    def aux_active(self, epoch: int) -> bool:
        """Whether epoch `epoch` (from 0) draws auxiliary batches (default: always, for objectives with aux)."""
        return True

    def inputs(self, batch: TrainBatch) -> torch.Tensor | tuple[torch.Tensor, ...]:
        if batch.aux_x is None:
            return batch.x
        return torch.cat([batch.x, batch.aux_x.to(batch.x.dtype)])

    def model_inputs(self, model: nn.Module, batch: TrainBatch) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """The step's model inputs, given the model ((logits, features) of an input); default `inputs(batch)`."""
        return self.inputs(batch)

    def loss(self, logits: torch.Tensor, features: torch.Tensor, batch: TrainBatch) -> torch.Tensor:
        raise NotImplementedError

    def label_fields(self) -> dict[str, str]:
        return {}

    def fit_targets(self, values: dict[str, Sequence[Any]]) -> None:
        """Learn label vocabularies from the training rows' raw level values (default: nothing to learn)."""

    def encode_targets(self, values: dict[str, Sequence[Any]]) -> dict[str, np.ndarray]:
        return {}

    def heads(self, logits: torch.Tensor, features: torch.Tensor) -> dict[str, torch.Tensor]:
        return {PRIMARY: logits}


@dataclass
class Pass:
    """The model's outputs on every row of a set, in row order: logits [N,C], features [N,D], row index [N] and the
    rows' labels [N] (ID class, or aux class index / -1)."""

    logits: torch.Tensor
    features: torch.Tensor
    index: torch.Tensor
    labels: torch.Tensor


class CrossEntropy(Objective):
    """Plain cross-entropy on the ID samples (the default objective)."""

    def loss(self, logits: torch.Tensor, features: torch.Tensor, batch: TrainBatch) -> torch.Tensor:
        return F.cross_entropy(logits[: batch.n_id].float(), batch.y)


class MultiGranularity(Objective):
    """Several label heads on one backbone: the classifier's head predicts `label`; one extra linear head per level.

    `levels` maps a level name to the manifest field holding its value (e.g. {"genus": "genus", "family": "family"});
    values may be strings or ints and are indexed in sorted order of the training values (`vocab`). The loss is
    `weights[label] * CE(label) + sum_l weights[l] * CE(level l)` (weights default to 1); validation reports each
    level's accuracy and `overall` (all levels right). A value unseen in training gets index -1: ignored by the loss,
    counted wrong by the accuracy.
    """

    def __init__(self, levels: dict[str, str], weights: dict[str, float] | None = None):
        super().__init__()
        if not levels or PRIMARY in levels:
            raise ValueError(f"levels must name at least one extra level other than {PRIMARY!r}, got {levels}")
        self.levels = dict(levels)
        self.weights = {PRIMARY: 1.0, **{name: 1.0 for name in levels}, **(weights or {})}
        unknown = set(self.weights) - set(self.levels) - {PRIMARY}
        if unknown:
            raise ValueError(f"weights name unknown level(s) {sorted(unknown)}; levels: {[PRIMARY, *self.levels]}")
        self.vocab: dict[str, list[Any]] = {}
        self.level_heads = nn.ModuleDict()

    def label_fields(self) -> dict[str, str]:
        return dict(self.levels)

    def fit_targets(self, values: dict[str, Sequence[Any]]) -> None:
        for name in self.levels:
            known = [v for v in values[name] if v is not None]
            if not known:
                raise ValueError(f"level {name!r} (field {self.levels[name]!r}) has no values in the training rows")
            self.vocab[name] = sorted(set(known), key=lambda v: (str(type(v)), v))

    def encode_targets(self, values: dict[str, Sequence[Any]]) -> dict[str, np.ndarray]:
        out = {}
        for name in self.levels:
            index = {v: i for i, v in enumerate(self.vocab[name])}
            out[name] = np.array([index.get(v, -1) for v in values[name]], dtype=np.int64)
        return out

    def setup(self, feature_dim: int, num_classes: int, num_aux_classes: int = 0) -> None:
        if not self.vocab:
            raise RuntimeError("MultiGranularity.setup before fit_targets: the level vocabularies are unknown")
        self.level_heads = nn.ModuleDict({name: nn.Linear(feature_dim, len(self.vocab[name])) for name in self.levels})

    def heads(self, logits: torch.Tensor, features: torch.Tensor) -> dict[str, torch.Tensor]:
        return {PRIMARY: logits, **{name: head(features) for name, head in self.level_heads.items()}}

    def level_head(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(weight [K,D], bias [K]) float64 of level `name`: logits of that level = features @ weight.T + bias
        (wrap as `detectors.LinearHead(*...)` so post-hoc detectors read this head on a feature cache)."""
        if name not in self.level_heads:
            raise KeyError(f"no level {name!r}; levels: {list(self.level_heads)}")
        head = self.level_heads[name]
        return head.weight.detach().double().cpu().numpy(), head.bias.detach().double().cpu().numpy()

    def save_pretrained(self, folder: str | os.PathLike) -> Path:
        """`levels.json` (levels, weights, vocabularies) + `levels.safetensors` (the extra heads)."""
        from safetensors.torch import save_file

        from pipelines.io import atomic_path, atomic_write_json

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_json(folder / "levels.json", {"levels": self.levels, "weights": self.weights, "vocab": self.vocab})
        with atomic_path(folder / "levels.safetensors") as tmp:
            save_file({k: v.detach().cpu().contiguous() for k, v in self.level_heads.state_dict().items()}, str(tmp))
        return folder

    @classmethod
    def from_pretrained(cls, folder: str | os.PathLike) -> MultiGranularity:
        from safetensors.torch import load_file

        from pipelines.checkpoints import check_safetensors

        folder = Path(folder)
        config = json.loads((folder / "levels.json").read_text())
        objective = cls(config["levels"], config["weights"])
        objective.vocab = config["vocab"]
        check_safetensors(folder / "levels.safetensors")
        state = load_file(str(folder / "levels.safetensors"))
        objective.setup(state[f"{next(iter(objective.levels))}.weight"].shape[1], 0)
        objective.level_heads.load_state_dict(state)
        return objective

    def loss(self, logits: torch.Tensor, features: torch.Tensor, batch: TrainBatch) -> torch.Tensor:
        total = self.weights[PRIMARY] * F.cross_entropy(logits.float(), batch.y)
        for name, head in self.level_heads.items():
            target = batch.targets[name]
            if (target >= 0).any():
                total = total + self.weights[name] * F.cross_entropy(head(features).float(), target, ignore_index=-1)
        return total


