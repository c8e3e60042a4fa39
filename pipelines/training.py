"""The shared training loop: fine-tune a classifier (or only its heads, on cached features) with accelerate.

`finetune(classifier, train_manifest, ...)` trains the whole `ImageClassifier` on images; `train_heads(head, features,
...)` trains only linear heads on cached penultimate features (fast studies). Both run the same loop: AdamW, cosine
schedule with linear warm-up (per step), mixed precision on GPU (fp32 on CPU), tqdm, per-epoch validation accuracy.

What is optimised is an `Objective`: a loss over the model outputs, optional extra heads (trained with the model), an
optional auxiliary (outlier) stream mixed into each step, and optional extra label levels (multi-granularity).
Training-time OOD methods (detectors/training) are Objectives. Images are read with `pipelines.data.load_image`; an
unreadable image is recorded in `TrainResult.failures` and skipped.
"""
from __future__ import annotations

import json
import math
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm

from pipelines.checkpoints import load_checkpoint, loader_generators, save_checkpoint
from pipelines.data import ImageLoadError, LoadFailure, Manifest, load_image
from pipelines.runtime import resolve_device, resolve_dtype, seed_everything

PRIMARY = "label"


# -- batches and objectives ----------------------------------------------------------------------------------
@dataclass
class TrainBatch:
    """One step's data: ID inputs `x` [B,...] with class indices `y` [B] and extra level targets; the aux stream.

    `aux_y` holds the auxiliary class index of each aux sample (e.g. its species among the auxiliary species),
    -1 when unknown. `generator` is the step's seeded CPU generator (for objectives that sample, e.g. mixing).
    `index` / `aux_index` are the rows' positions in the ID-train / aux set (for objectives with per-row state).
    """

    x: torch.Tensor
    y: torch.Tensor
    targets: dict[str, torch.Tensor] = field(default_factory=dict)
    aux_x: torch.Tensor | None = None
    aux_y: torch.Tensor | None = None
    generator: torch.Generator | None = None
    index: torch.Tensor | None = None
    aux_index: torch.Tensor | None = None

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
      aux rows, computed once before the first step (e.g. data-driven energy margins).
    - `needs_epoch_pass` / `epoch_start(epoch, id_pass, aux_pass)`: the same pass (logits, features, row index, in
      row order) before every epoch (e.g. UDG's clustering).
    - `setup(feature_dim, num_classes, num_aux_classes)`: build extra heads (nn.Modules on `self`; they are trained).
    - `inputs(batch)`: the tensor run through the model (default: ID inputs then aux inputs, concatenated), or a tuple
      of tensors run as separate forward passes (outputs concatenated in order; matters with batch norm).
    - `replaces_head`: the objective computes its own closed-set logits from the features (ARPL, G-ODIN), so the
      classifier's head gets no gradient (DDP is told to expect unused parameters).
    - `no_decay_parameters()`: parameters trained without weight decay (G-ODIN's h).
    - `label_fields()`: extra label levels {level: manifest field}; `encode_targets` maps raw values to indices.
    - `heads(logits, features)`: logits per label level, used for validation accuracy.
    """

    uses_aux: bool = False
    aux_batch_ratio: float | None = 1.0
    pooled: bool = False
    needs_calibration: bool = False
    needs_epoch_pass: bool = False
    replaces_head: bool = False

    def setup(self, feature_dim: int, num_classes: int, num_aux_classes: int = 0) -> None:
        """Build extra heads; the default has none."""

    def calibrate(self, id_logits: torch.Tensor, aux_logits: torch.Tensor | None) -> None:
        """Use the untrained model's logits on the whole ID-train (and aux) set; called when `needs_calibration`."""

    def epoch_start(self, epoch: int, id_pass: "Pass", aux_pass: "Pass | None") -> None:
        """Called before every epoch with the model's outputs on every ID-train / aux row; when `needs_epoch_pass`."""

    def no_decay_parameters(self) -> list[nn.Parameter]:
        return []

    def inputs(self, batch: TrainBatch) -> torch.Tensor | tuple[torch.Tensor, ...]:
        if batch.aux_x is None:
            return batch.x
        return torch.cat([batch.x, batch.aux_x.to(batch.x.dtype)])

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
    def from_pretrained(cls, folder: str | os.PathLike) -> "MultiGranularity":
        from safetensors.torch import load_file

        folder = Path(folder)
        config = json.loads((folder / "levels.json").read_text())
        objective = cls(config["levels"], config["weights"])
        objective.vocab = config["vocab"]
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


# -- data ----------------------------------------------------------------------------------------------------
class _ImageRows(Dataset):
    """Manifest rows -> (pixel tensor or None, class index, row position, failure reason)."""

    def __init__(self, manifest: Manifest, labels: np.ndarray, preprocess: Callable[[list[Any]], torch.Tensor],
                 augment: Callable[[Any], Any] | None):
        self.manifest, self.labels, self.preprocess, self.augment = manifest, labels, preprocess, augment

    def __len__(self) -> int:
        return len(self.manifest.rows)

    def __getitem__(self, i: int) -> tuple[torch.Tensor | None, int, int, str]:
        try:
            image = load_image(self.manifest.path(self.manifest.rows[i]))
        except ImageLoadError as err:
            return None, int(self.labels[i]), i, err.reason
        if self.augment is not None:
            image = self.augment(image)
        return self.preprocess([image])[0], int(self.labels[i]), i, ""


class _TensorBatches:
    """Cached features in (optionally shuffled) batches, sliced whole (no per-row Python work); the loader interface
    of `_run` (len + iteration yielding the collated dict)."""

    def __init__(self, features: np.ndarray, labels: np.ndarray, batch_size: int, shuffle: bool, seed: int, drop_last: bool):
        self.features = torch.as_tensor(np.ascontiguousarray(features), dtype=torch.float32)
        self.labels = torch.as_tensor(np.asarray(labels, dtype=np.int64))
        self.batch_size, self.shuffle, self.drop_last = batch_size, shuffle, drop_last
        self.generator = torch.Generator().manual_seed(seed)

    def __len__(self) -> int:
        n = len(self.features)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        n = len(self.features)
        order = torch.randperm(n, generator=self.generator) if self.shuffle else torch.arange(n)
        for start in range(0, len(self) * self.batch_size, self.batch_size):
            index = order[start: start + self.batch_size]
            yield {"x": self.features[index], "y": self.labels[index], "index": index, "failed": []}


class _PooledTensorBatches:
    """ID and aux feature rows shuffled into one pool, cut into batches of `batch_size`; each batch is split back into
    its ID part (`x`, `y`, `index`) and its aux part (`aux`: the same keys)."""

    def __init__(self, features: np.ndarray, labels: np.ndarray, aux_features: np.ndarray, aux_labels: np.ndarray,
                 batch_size: int, seed: int, drop_last: bool):
        self.n_id = len(labels)
        self.pool = _TensorBatches(np.concatenate([np.asarray(features, np.float32), np.asarray(aux_features, np.float32)]),
                                   np.concatenate([labels, aux_labels]), batch_size, True, seed, drop_last)

    def __len__(self) -> int:
        return len(self.pool)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for batch in self.pool:
            is_id = batch["index"] < self.n_id
            aux = {"x": batch["x"][~is_id], "y": batch["y"][~is_id], "index": batch["index"][~is_id] - self.n_id, "failed": []}
            yield {"x": batch["x"][is_id], "y": batch["y"][is_id], "index": batch["index"][is_id], "failed": [], "aux": aux}


class _PooledRows(Dataset):
    """ID rows then aux rows as one dataset (for a pooled image loader); items carry their source."""

    def __init__(self, train: Dataset, aux: Dataset):
        self.train, self.aux = train, aux

    def __len__(self) -> int:
        return len(self.train) + len(self.aux)

    def __getitem__(self, i: int) -> tuple[Any, ...]:
        n = len(self.train)
        return (*self.train[i], "id") if i < n else (*self.aux[i - n], "aux")


def _collate_pooled(items: list[tuple[Any, ...]]) -> dict[str, Any]:
    out = _collate([it[:4] for it in items if it[4] == "id"])
    aux = _collate([it[:4] for it in items if it[4] == "aux"])
    if out["x"] is None and aux["x"] is not None:  # a batch of aux rows only: an empty ID part of the right shape
        out["x"] = aux["x"][:0]
    out["aux"] = aux
    return out


def _collate(items: list[tuple[Any, int, int, str]]) -> dict[str, Any]:
    ok = [it for it in items if it[0] is not None]
    return {
        "x": torch.stack([it[0] for it in ok]) if ok else None,
        "y": torch.tensor([it[1] for it in ok], dtype=torch.long),
        "index": torch.tensor([it[2] for it in ok], dtype=torch.long),
        "failed": [(it[2], it[3]) for it in items if it[0] is None],
    }


def _loader(dataset: Dataset, batch_size: int, shuffle: bool, seed: int, num_workers: int, drop_last: bool = False,
            collate: Callable[[list[Any]], dict[str, Any]] = _collate) -> DataLoader:
    generator = torch.Generator().manual_seed(seed)
    return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, num_workers=num_workers, collate_fn=collate,
                      generator=generator, drop_last=drop_last, persistent_workers=False,
                      worker_init_fn=_seed_worker if num_workers else None)


def _seed_worker(worker_id: int) -> None:
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)


def _cycle(loader: Any) -> Iterator[dict[str, Any]]:
    """Endless iteration over a loader (reshuffled every pass by its seeded generator)."""
    while True:
        yielded = False
        for batch in loader:
            yielded = True
            yield batch
        if not yielded:
            raise ValueError("the auxiliary set is empty")


def _manifest_labels(manifest: Manifest, what: str) -> np.ndarray:
    labels = manifest.labels()
    if what == "train" and (labels < 0).any():
        bad = manifest.rows[int(np.flatnonzero(labels < 0)[0])]["file_name"]
        raise ValueError(f"train manifest holds rows without an ID class label (label -1), e.g. {bad!r}: pass ID rows only")
    return labels


def _aux_labels(rows: list[dict[str, Any]], field_name: str | None) -> tuple[np.ndarray, list[Any]]:
    """Aux class indices from `field_name` (sorted vocabulary), or all -1 without a field."""
    if field_name is None:
        return np.full(len(rows), -1, dtype=np.int64), []
    values = [r.get(field_name) for r in rows]
    vocab = sorted({v for v in values if v is not None}, key=lambda v: (str(type(v)), v))
    index = {v: i for i, v in enumerate(vocab)}
    return np.array([index.get(v, -1) for v in values], dtype=np.int64), vocab


def aux_batch_size(objective: Objective, batch_size: int, n_train: int, n_aux: int) -> int:
    """Aux rows drawn per step: `aux_batch_ratio * batch_size`, or proportional to the set sizes when the ratio is None."""
    ratio = objective.aux_batch_ratio if objective.aux_batch_ratio is not None else n_aux / max(n_train, 1)
    return max(1, int(round(ratio * batch_size)))


# -- results -------------------------------------------------------------------------------------------------
@dataclass
class TrainResult:
    """What a training run produced: per-epoch history (mean loss, validation accuracy per level and `overall`),
    images that failed to load (each once), the learning rate of every optimiser step (`lrs`), the number of steps,
    seconds, and the aux class vocabulary."""

    history: list[dict[str, float]] = field(default_factory=list)
    failures: list[LoadFailure] = field(default_factory=list)
    lrs: list[float] = field(default_factory=list)
    steps: int = 0
    seconds: float = 0.0
    aux_vocab: list[Any] = field(default_factory=list)

    @property
    def final(self) -> dict[str, float]:
        return self.history[-1] if self.history else {}


class _Step(nn.Module):
    """Model + objective as one module whose forward returns the loss (so distributed wrappers see every parameter)."""

    def __init__(self, model: nn.Module, objective: Objective):
        super().__init__()
        self.model, self.objective = model, objective

    def forward(self, batch: TrainBatch) -> torch.Tensor:
        inputs = self.objective.inputs(batch)
        if isinstance(inputs, (tuple, list)):  # separate forward passes (batch-norm statistics per pass)
            outputs = [self.model(x) for x in inputs]
            logits, features = torch.cat([o[0] for o in outputs]), torch.cat([o[1] for o in outputs])
        else:
            logits, features = self.model(inputs)
        return self.objective.loss(logits, features, batch)


class _HeadsOnly(nn.Module):
    """Cached features -> (head(features), features): lets the loop train heads exactly like a full classifier."""

    def __init__(self, head: nn.Linear):
        super().__init__()
        self.head = head

    def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.head(features), features


def as_linear(head: Any) -> nn.Linear:
    """An nn.Linear (float32) from an nn.Linear, a LinearHead-like object (`weight` [C,D], `bias` [C]) or a pair."""
    if isinstance(head, nn.Linear):
        return head
    weight, bias = (head.weight, head.bias) if hasattr(head, "weight") else head
    weight = torch.as_tensor(np.asarray(weight), dtype=torch.float32)
    layer = nn.Linear(weight.shape[1], weight.shape[0])
    with torch.no_grad():
        layer.weight.copy_(weight)
        layer.bias.copy_(torch.as_tensor(np.asarray(bias), dtype=torch.float32))
    return layer


# -- the loop ------------------------------------------------------------------------------------------------
def _mixed_precision(precision: str) -> str:
    dtype = resolve_dtype(precision, resolve_device())
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, "no")


def _target_values(rows: list[dict[str, Any]], fields: dict[str, str], what: str) -> dict[str, list[Any]]:
    values = {}
    for name, field_name in fields.items():
        if rows and not any(field_name in r for r in rows):
            raise ValueError(f"{what} manifest rows have no field {field_name!r} (label level {name!r})")
        values[name] = [r.get(field_name) for r in rows]
    return values


def _run(model: nn.Module, objective: Objective, train_loader: Any, aux_loader: Any, val_loader: Any, train_targets: dict[str, np.ndarray], val_targets: dict[str, np.ndarray], *,
         epochs: int, lr: float, weight_decay: float, warmup_epochs: float, seed: int, precision: str,
         result: TrainResult, failed_files: Callable[[str, int], str], desc: str,
         checkpoint: str | os.PathLike | None = None, checkpoint_key: str = "") -> TrainResult:
    from accelerate import Accelerator, DistributedDataParallelKwargs
    from transformers import get_cosine_schedule_with_warmup

    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    handlers = [DistributedDataParallelKwargs(find_unused_parameters=True)] if objective.replaces_head else []
    accelerator = Accelerator(mixed_precision=_mixed_precision(precision), cpu=resolve_device().type == "cpu",
                              kwargs_handlers=handlers)
    step_module = _Step(model, objective)
    no_decay = {id(p) for p in objective.no_decay_parameters()}
    trainable = [p for p in step_module.parameters() if p.requires_grad]
    groups = [{"params": [p for p in trainable if id(p) not in no_decay]},
              {"params": [p for p in trainable if id(p) in no_decay], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW([g for g in groups if g["params"]], lr=lr, weight_decay=weight_decay)
    step_module, optimizer = accelerator.prepare(step_module, optimizer)
    # image loaders are sharded across processes by accelerate; cached-feature batches are small and stay whole
    train_loader, aux_loader, val_loader = (accelerator.prepare(x) if isinstance(x, DataLoader) else x
                                            for x in (train_loader, aux_loader, val_loader))
    # The schedule counts this process's optimiser steps (the prepared loader's length), and is stepped once per step
    # (not through accelerate, whose scheduler wrapper steps once per process and per step: right for sharded image
    # batches counted before sharding, wrong for whole cached-feature batches, where it ended the cosine early).
    steps_per_epoch = max(1, len(train_loader))
    scheduler = get_cosine_schedule_with_warmup(optimizer, int(round(warmup_epochs * steps_per_epoch)), epochs * steps_per_epoch)
    device = accelerator.device
    aux_stream = _cycle(aux_loader) if aux_loader is not None else None
    seen_failures: set[tuple[str, int]] = set()
    start = time.perf_counter()

    def record(failed: list[tuple[int, str]], split: str) -> None:
        for index, reason in failed:
            key = (split, index)
            if key not in seen_failures:
                seen_failures.add(key)
                result.failures.append(LoadFailure(index, failed_files(split, index), reason))

    pass_loaders = _pass_loaders(train_loader, aux_loader, objective.pooled)
    # per-epoch checkpoints (pipelines.checkpoints): a killed run continues after its last finished epoch
    saved = (checkpoint, checkpoint_key, accelerator.unwrap_model(step_module), objective, optimizer, scheduler, result,
             loader_generators([train_loader, aux_loader]))
    done = load_checkpoint(*saved) if checkpoint is not None else 0
    if objective.needs_calibration and not done:
        inner = accelerator.unwrap_model(step_module)
        inner.eval()
        id_pass = _all_outputs(inner.model, pass_loaders[0], device, accelerator)
        aux_pass = _all_outputs(inner.model, pass_loaders[1], device, accelerator) if pass_loaders[1] is not None else None
        inner.objective.calibrate(id_pass.logits, None if aux_pass is None else aux_pass.logits)

    for epoch in range(done, epochs):
        if objective.needs_epoch_pass:
            inner = accelerator.unwrap_model(step_module)
            inner.eval()
            id_pass = _all_outputs(inner.model, pass_loaders[0], device, accelerator)
            aux_pass = _all_outputs(inner.model, pass_loaders[1], device, accelerator) if pass_loaders[1] is not None else None
            inner.objective.epoch_start(epoch, id_pass, aux_pass)
        step_module.train()
        total, count = 0.0, 0
        bar = tqdm(train_loader, desc=f"{desc} epoch {epoch + 1}/{epochs}", leave=False, disable=not accelerator.is_local_main_process)
        for step, raw in enumerate(bar):
            record(raw["failed"], "train")
            aux = raw["aux"] if "aux" in raw else next(aux_stream) if aux_stream is not None else None
            if aux is not None:
                record(aux["failed"], "aux")
            if raw["x"] is None:
                if accelerator.num_processes > 1:  # the other processes would wait forever in the gradient all-reduce
                    raise RuntimeError(f"every image of a training batch failed to load on process {accelerator.process_index}: "
                                       f"{raw['failed'][:3]}; drop unreadable images from the manifest")
                continue
            index = raw["index"]
            batch = TrainBatch(
                x=raw["x"].to(device), y=raw["y"].to(device),
                targets={k: torch.as_tensor(v[index.cpu().numpy()]).to(device) for k, v in train_targets.items()},
                aux_x=aux["x"].to(device) if aux is not None and aux["x"] is not None else None,
                aux_y=aux["y"].to(device) if aux is not None and aux["x"] is not None else None,
                generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch * 10_007 + step),
                index=index.to(device),
                aux_index=aux["index"].to(device) if aux is not None and aux["x"] is not None else None,
            )
            with accelerator.autocast():
                loss = step_module(batch)
            optimizer.zero_grad(set_to_none=True)
            accelerator.backward(loss)
            optimizer.step()
            result.lrs.append(float(optimizer.param_groups[0]["lr"]))
            if not accelerator.optimizer_step_was_skipped:  # fp16 overflow: no step taken, the schedule waits
                scheduler.step()
            result.steps += 1
            total += float(loss.detach()) * batch.n_id
            count += batch.n_id
            bar.set_postfix(loss=f"{total / max(count, 1):.4f}")
        total, count = accelerator.reduce(torch.tensor([total, count], dtype=torch.float64, device=device), "sum").tolist()
        entry: dict[str, float] = {"epoch": epoch + 1, "loss": total / count if count else math.nan, "lr": scheduler.get_last_lr()[0]}
        if val_loader is not None:
            entry.update(_evaluate(accelerator.unwrap_model(step_module), val_loader, val_targets, device, accelerator, record))
        result.history.append(entry)
        if checkpoint is not None and accelerator.is_main_process:
            save_checkpoint(saved[0], checkpoint_key, epoch + 1, *saved[2:])
        accelerator.wait_for_everyone()
    result.seconds += time.perf_counter() - start
    return result


class _SplitPool:
    """One side ("id" or "aux") of a pooled loader, as a loader of its own (for the calibration / epoch passes)."""

    def __init__(self, pooled: Any, side: str):
        self.pooled, self.side = pooled, side

    def __len__(self) -> int:
        return len(self.pooled)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for raw in self.pooled:
            part = raw["aux"] if self.side == "aux" else raw
            if part["x"] is not None and len(part["x"]):
                yield part


def _pass_loaders(train_loader: Any, aux_loader: Any, pooled: bool) -> tuple[Any, Any]:
    """Loaders over every ID-train / aux row for the calibration and epoch passes: cached features in order and
    without dropping the last batch; image loaders as they are (a dropped last batch stays unseen)."""
    if isinstance(train_loader, _PooledTensorBatches):
        pool = train_loader.pool
        n = train_loader.n_id
        return (_TensorBatches(pool.features[:n].numpy(), pool.labels[:n].numpy(), pool.batch_size, False, 0, False),
                _TensorBatches(pool.features[n:].numpy(), pool.labels[n:].numpy(), pool.batch_size, False, 0, False))
    if pooled:
        return _SplitPool(train_loader, "id"), _SplitPool(train_loader, "aux")

    def ordered(loader: Any) -> Any:
        if isinstance(loader, _TensorBatches):
            return _TensorBatches(loader.features.numpy(), loader.labels.numpy(), loader.batch_size, False, 0, False)
        return loader

    return ordered(train_loader), None if aux_loader is None else ordered(aux_loader)


@torch.no_grad()
def _all_outputs(model: nn.Module, loader: Any, device: torch.device, accelerator: Any) -> Pass:
    """float32 logits and features of every loadable row of `loader` (one pass, no gradient), gathered from every
    process, sorted by row index with duplicates (whole batches seen by several processes) removed."""
    logits, features, index, labels = [], [], [], []
    for raw in tqdm(loader, desc="pass over the training rows", leave=False, disable=not accelerator.is_local_main_process):
        if raw["x"] is not None:
            with accelerator.autocast():
                z, h = model(raw["x"].to(device))
            logits.append(accelerator.gather_for_metrics(z.float()))
            features.append(accelerator.gather_for_metrics(h.float()))
            index.append(accelerator.gather_for_metrics(raw["index"].to(device)))
            labels.append(accelerator.gather_for_metrics(raw["y"].to(device)))
    if not logits:
        raise ValueError("no loadable row in a training set: nothing to compute the model's outputs on")
    z, h, i, y = torch.cat(logits), torch.cat(features), torch.cat(index), torch.cat(labels)
    i, first = np.unique(i.cpu().numpy(), return_index=True)
    first = torch.as_tensor(first, device=z.device)
    return Pass(z[first].cpu(), h[first].cpu(), torch.as_tensor(i), y[first].cpu())


@torch.no_grad()
def _evaluate(step_module: _Step, loader: Any, targets: dict[str, np.ndarray], device: torch.device,
              accelerator: Any, record: Callable[[list[tuple[int, str]], str], None]) -> dict[str, float]:
    """Accuracy per level (`acc_<level>`), and `overall` = share of rows with every level right (failed rows excluded)."""
    step_module.eval()
    model, objective = step_module.model, step_module.objective
    right: dict[str, list[np.ndarray]] = {}
    for raw in loader:
        record(raw["failed"], "val")
        if raw["x"] is None:
            continue
        with accelerator.autocast():
            logits, features = model(raw["x"].to(device))
            heads = objective.heads(logits, features)
        wanted = {PRIMARY: raw["y"].cpu().numpy(), **{k: v[raw["index"].cpu().numpy()] for k, v in targets.items()}}
        for name, level_logits in heads.items():
            pred = level_logits.float().argmax(1).cpu().numpy()
            hits = torch.as_tensor(pred == wanted[name], device=device)
            right.setdefault(name, []).append(accelerator.gather_for_metrics(hits).cpu().numpy())
    if not right:
        return {}
    stacked = {name: np.concatenate(parts) for name, parts in right.items()}
    out = {f"acc_{name}": float(v.mean()) for name, v in stacked.items()}
    out["overall"] = float(np.logical_and.reduce(list(stacked.values())).mean())
    return out


# -- public entry points ---------------------------------------------------------------------------------------
def finetune(classifier: nn.Module, train: Manifest, *, epochs: int = 30, lr: float = 1e-3, batch_size: int = 64,
             weight_decay: float = 1e-5, warmup_epochs: float = 2, objective: Objective | None = None,
             aux: Manifest | None = None, aux_label_field: str | None = None, val: Manifest | None = None, seed: int = 0,
             precision: str = "auto", num_workers: int = 0, augment: Callable[[Any], Any] | None = None,
             checkpoint: str | os.PathLike | None = None, checkpoint_key: str = "") -> TrainResult:
    """Fine-tune `classifier` (an `ImageClassifier`: forward -> (logits, features), `.head`, `.preprocess`) in place.

    `train` holds ID rows (their `label`); `aux` (auxiliary / outlier rows) feeds objectives with `uses_aux`, its class
    index read from `aux_label_field` (sorted vocabulary; e.g. "species" for Extended). `val` (ID rows) gives the
    per-epoch accuracy. `augment` maps a training PIL image to a PIL image (e.g. random flips). `checkpoint`: a file
    written after every epoch and resumed from when it carries `checkpoint_key` (pipelines.checkpoints). Defaults follow the
    Open-Insects recipe: 30 epochs, AdamW lr 1e-3 (weight decay 1e-5), cosine schedule with 2 warm-up epochs.
    """
    objective = objective or CrossEntropy()
    seed_everything(seed)
    if objective.uses_aux and aux is None:
        raise ValueError(f"{type(objective).__name__} trains with auxiliary data: pass aux=<Manifest of auxiliary rows>")
    fields = objective.label_fields()
    train_values = _target_values(train.rows, fields, "train")
    objective.fit_targets(train_values)
    train_targets = objective.encode_targets(train_values)
    val_targets = objective.encode_targets(_target_values(val.rows, fields, "val")) if val is not None else {}
    aux_y, aux_vocab = _aux_labels(aux.rows, aux_label_field) if aux is not None and objective.uses_aux else (None, [])
    feature_dim = classifier.head.in_features
    objective.setup(feature_dim, classifier.head.out_features, len(aux_vocab))
    preprocess = classifier.preprocess
    train_rows = _ImageRows(train, _manifest_labels(train, "train"), preprocess, augment)
    aux_loader = None
    if objective.uses_aux and objective.pooled:
        pool = _PooledRows(train_rows, _ImageRows(aux, aux_y, preprocess, augment))
        train_loader = _loader(pool, batch_size, True, seed, num_workers, drop_last=len(pool) > batch_size, collate=_collate_pooled)
    else:
        train_loader = _loader(train_rows, batch_size, True, seed, num_workers, drop_last=len(train) > batch_size)
    if objective.uses_aux and not objective.pooled:
        aux_size = aux_batch_size(objective, batch_size, len(train), len(aux))
        aux_loader = _loader(_ImageRows(aux, aux_y, preprocess, augment), aux_size, True, seed + 1, num_workers, drop_last=len(aux) > aux_size)
    val_loader = _loader(_ImageRows(val, val.labels(), preprocess, None), batch_size, False, seed, num_workers) if val is not None else None
    manifests = {"train": train, "aux": aux, "val": val}
    result = TrainResult(aux_vocab=aux_vocab)
    return _run(classifier, objective, train_loader, aux_loader, val_loader, train_targets, val_targets, epochs=epochs, lr=lr,
                weight_decay=weight_decay, warmup_epochs=warmup_epochs, seed=seed, precision=precision, result=result,
                failed_files=lambda split, i: manifests[split].rows[i]["file_name"], desc="finetune",
                checkpoint=checkpoint, checkpoint_key=checkpoint_key)


def train_heads(head: Any, train_features: np.ndarray, train_labels: np.ndarray, *, epochs: int = 30, lr: float = 1e-3,
                batch_size: int = 256, weight_decay: float = 1e-5, warmup_epochs: float = 2, objective: Objective | None = None,
                aux_features: np.ndarray | None = None, aux_labels: np.ndarray | None = None,
                train_targets: dict[str, Sequence[Any]] | None = None, val_features: np.ndarray | None = None,
                val_labels: np.ndarray | None = None, val_targets: dict[str, Sequence[Any]] | None = None, seed: int = 0,
                precision: str = "auto", checkpoint: str | os.PathLike | None = None,
                checkpoint_key: str = "") -> tuple[nn.Linear, TrainResult]:
    """Fast mode: train only the linear head(s) on cached penultimate features, with the same loop and objectives.

    `head` (nn.Linear, LinearHead or (weight, bias)) initialises the closed-set head; a copy is trained and returned.
    `aux_labels` are auxiliary class indices (-1 unknown); `*_targets` are raw values per extra label level
    (multi-granularity). Objectives that transform inputs (MixOE) mix features here instead of pixels.
    """
    objective = objective or CrossEntropy()
    seed_everything(seed)
    if objective.uses_aux and aux_features is None:
        raise ValueError(f"{type(objective).__name__} trains with auxiliary data: pass aux_features")
    layer = _copy_linear(as_linear(head))
    labels = np.asarray(train_labels, dtype=np.int64)
    if (labels < 0).any():
        raise ValueError("train_labels hold -1 (OOD) entries: pass ID features only")
    fields = objective.label_fields()
    missing = set(fields) - set(train_targets or {})
    if missing:
        raise ValueError(f"{type(objective).__name__} needs train_targets for level(s) {sorted(missing)}")
    if fields:
        objective.fit_targets({k: list(train_targets[k]) for k in fields})
    encoded_train = objective.encode_targets({k: list(train_targets[k]) for k in fields}) if fields else {}
    encoded_val = objective.encode_targets({k: list(val_targets[k]) for k in fields}) if fields and val_targets else {}
    aux_y = None
    n_aux_classes = 0
    if objective.uses_aux:
        aux_y = np.full(len(aux_features), -1, dtype=np.int64) if aux_labels is None else np.asarray(aux_labels, dtype=np.int64)
        n_aux_classes = int(aux_y.max()) + 1 if (aux_y >= 0).any() else 0
    objective.setup(layer.in_features, layer.out_features, n_aux_classes)
    aux_loader = None
    if objective.uses_aux and objective.pooled:
        train_loader = _PooledTensorBatches(train_features, labels, aux_features, aux_y, batch_size, seed,
                                            drop_last=len(labels) + len(aux_y) > batch_size)
    else:
        train_loader = _TensorBatches(train_features, labels, batch_size, True, seed, drop_last=len(labels) > batch_size)
    if objective.uses_aux and not objective.pooled:
        aux_size = aux_batch_size(objective, batch_size, len(labels), len(aux_y))
        aux_loader = _TensorBatches(aux_features, aux_y, aux_size, True, seed + 1, drop_last=len(aux_y) > aux_size)
    val_loader = None
    if val_features is not None:
        val_loader = _TensorBatches(val_features, np.asarray(val_labels, dtype=np.int64), batch_size, False, seed, False)
    model = _HeadsOnly(layer)
    result = _run(model, objective, train_loader, aux_loader, val_loader, encoded_train, encoded_val, epochs=epochs, lr=lr,
                  weight_decay=weight_decay, warmup_epochs=warmup_epochs, seed=seed, precision=precision, result=TrainResult(),
                  failed_files=lambda split, i: f"{split}[{i}]", desc="train_heads", checkpoint=checkpoint,
                  checkpoint_key=checkpoint_key)
    return layer, result


def _copy_linear(layer: nn.Linear) -> nn.Linear:
    out = nn.Linear(layer.in_features, layer.out_features)
    with torch.no_grad():
        out.weight.copy_(layer.weight.detach().float().cpu())
        out.bias.copy_(layer.bias.detach().float().cpu())
    return out
