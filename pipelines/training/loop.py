"""The shared accelerate loop: AdamW, a per-step schedule (`schedule`: "clean" warm-up + cosine, or "reference", the
Open-Insect trainers' timm schedule and step counter), mixed precision on GPU unless `precision: fp32` (fp32 on CPU), a
progress display over the run and a log line per epoch (`epoch_log`), per-epoch validation accuracy, an atomic
checkpoint after every epoch and resume, and the best epoch's weights by ID-val accuracy kept beside the last
(`keep_best`; `best_epoch` is the reference's rule).

`finetune(classifier, train_manifest, ...)` trains the whole `ImageClassifier` on images; `train_heads(head, features,
...)` trains only linear heads on cached penultimate features (fast studies). Both run `_run`.
"""
from __future__ import annotations

import copy
import logging
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

from pipelines.checkpoints import (
    best_epoch_saved,
    best_path,
    checkpoint_history,
    checkpoint_matches,
    load_best,
    load_checkpoint,
    loader_generators,
    read_metadata,
    save_best,
    save_checkpoint,
)
from pipelines.collectives import host, main_decides
from pipelines.data import LoadFailure, Manifest
from pipelines.errors import ConfigError, UserInputError
from pipelines.params import param
from pipelines.progress import progress
from pipelines.runtime import resolve_device, resolve_dtype, seed_everything
from pipelines.training.batchnorm import global_batchnorm
from pipelines.training.epoch_log import EpochLog
from pipelines.training.loaders import (
    ImageRows,
    PooledRows,
    PooledTensorBatches,
    TensorBatches,
    aux_batch_size,
    aux_labels,
    collate_pooled,
    cycle,
    make_loader,
    manifest_labels,
    set_epoch,
    share_loader,
    target_values,
)
from pipelines.training.objectives import PRIMARY, CrossEntropy, Objective, Pass, TrainBatch
from pipelines.training.schedule import describe, make_scheduler
from pipelines.training.settings import TrainSettings
from pipelines.training.transforms import Normalize

log = logging.getLogger(__name__)

# -- results -------------------------------------------------------------------------------------------------
CHECKPOINT_CHOICES: tuple[str, ...] = ("last", "best")
"""Which weights a trained model scores with: the last epoch's, or the best epoch's by ID-val accuracy
(`best_epoch`)."""
Checkpoint = Literal[CHECKPOINT_CHOICES]  # type: ignore[valid-type]
BEST_METRIC = f"acc_{PRIMARY}"
"""The history entry the best epoch is chosen by: top-1 accuracy of the primary head on ID val."""


def best_epoch(history: list[dict[str, float]]) -> int | None:
    """The epoch the reference keeps as `best.ckpt` (Open-Insect / OpenOOD `recorders/base_recorder.py:40-50`): from
    a best accuracy of 0.0, every epoch whose ID-val accuracy is `>=` the best so far replaces it, so of equal
    accuracies the later epoch wins. An epoch without validation accuracy (or a NaN one) never does; None without
    any."""
    best_acc, found = 0.0, None
    for entry in history:
        acc = entry.get(BEST_METRIC)
        if acc is not None and acc >= best_acc:
            best_acc, found = acc, int(entry["epoch"])
    return found


@dataclass
class TrainResult:
    """What a training run produced: per-epoch history (mean loss, validation accuracy per level and `overall`),
    images that failed to load (each once), the learning rate of every optimiser step (`lrs`), the number of steps,
    seconds, and the aux class vocabulary. With the best epoch kept (`keep_best`): `best` its number (`best_epoch`),
    `best_test` the test accuracy of its weights, and where they are (`best_file`, or in memory); `kept` names the
    weights the model holds once training returns (`last` or `best`)."""

    history: list[dict[str, float]] = field(default_factory=list)
    failures: list[LoadFailure] = field(default_factory=list)
    lrs: list[float] = field(default_factory=list)
    steps: int = 0
    seconds: float = 0.0
    aux_vocab: list[Any] = field(default_factory=list)
    test: dict[str, float] = field(default_factory=dict)
    best: int | None = None
    best_test: dict[str, float] = field(default_factory=dict)
    best_file: Path | None = None
    best_key: str = ""
    kept: str = "last"
    best_state: dict[str, Any] | None = field(default=None, repr=False)

    @property
    def final(self) -> dict[str, float]:
        return self.history[-1] if self.history else {}

    @property
    def best_entry(self) -> dict[str, float]:
        """The history entry of the best epoch ({} without one)."""
        return next((h for h in self.history if h.get("epoch") == self.best), {}) if self.best else {}


def load_best_weights(result: TrainResult, model: nn.Module, objective: Objective) -> int:
    """Put the best epoch's weights of a finished run into `model` and `objective` (as `_Step` saved them); return the
    epoch. A run that kept no best epoch is a ValueError."""
    if result.best is None:
        raise ValueError("this run kept no best epoch (no ID validation accuracy)")
    step = _Step(model, objective)
    if result.best_state is not None:
        return _restore(step, result.best_state)
    return load_best(result.best_file, result.best_key, step, objective)


def _snapshot(step: nn.Module) -> dict[str, Any]:
    """A copy of a `_Step`'s weights and its objective's plain attributes, in memory (CPU)."""
    from pipelines.checkpoints import _plain_attributes

    return {"epoch": 0, "module": {k: v.detach().to("cpu", copy=True) for k, v in step.state_dict().items()},
            "objective": copy.deepcopy(_plain_attributes(step.objective))}


def _restore(step: nn.Module, state: dict[str, Any]) -> int:
    step.load_state_dict(state["module"])
    for name, value in copy.deepcopy(state["objective"]).items():
        setattr(step.objective, name, value)
    return int(state["epoch"])


class _Step(nn.Module):
    """Model + objective as one module whose forward returns the loss (so distributed wrappers see every parameter)."""

    def __init__(self, model: nn.Module, objective: Objective, compiled: bool = False):
        super().__init__()
        self.model, self.objective = model, objective
        # the compiled wrapper is kept out of the registered submodules, so state_dict keys stay the model's own
        self._forward = [torch.compile(model) if compiled else model]

    def forward(self, batch: TrainBatch) -> torch.Tensor:
        inputs = self.objective.model_inputs(self.model, batch)
        model = self._forward[0] if self.training else self.model
        if isinstance(inputs, (tuple, list)):  # separate forward passes (batch-norm statistics per pass)
            outputs = [model(x) for x in inputs]
            logits, features = torch.cat([o[0] for o in outputs]), torch.cat([o[1] for o in outputs])
        else:
            logits, features = model(inputs)
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
@dataclass(frozen=True)
class LoopSettings(TrainSettings):
    """How `_run` trains: the training hyperparameters (`TrainSettings`), and the loop's own settings: a description,
    the optional speed and resume settings, and which weights the model keeps.

    `checkpoint`: a file written atomically after every epoch (`pipelines.checkpoints`: model + objective state and
    attributes, optimiser, schedule, history); an existing one whose `checkpoint_key` matches is resumed from, another
    one is ignored and overwritten. `normalize` maps a loader's uint8 batch to the model's input on the device
    (`transforms.Normalize`). `channels_last` / `compile` are GPU speed options; `sync_bn` normalises batch-norm layers
    over the global batch when several processes train (`batchnorm.GlobalBatchNorm`). `keep_best` keeps the best
    epoch's weights by ID-val accuracy (`best_epoch`) beside the last: in `pipelines.checkpoints.best_path(checkpoint)`
    with a checkpoint (written after the epoch's checkpoint, so a killed run resumes to the same best), else in memory;
    `weights` names the weights the model holds when training returns (`best` implies `keep_best` and needs validation
    rows)."""

    desc: str = param("train", "the progress bar's and the messages' label", runtime=True)
    checkpoint: str | os.PathLike | None = param(None, "the per-epoch checkpoint file (None: no resume)", runtime=True)
    checkpoint_key: str = param("", "the run's key: a checkpoint with another is not resumed", runtime=True)
    normalize: Callable[[torch.Tensor], torch.Tensor] | None = param(None, "uint8 batch -> model input, on the device",
                                                                     runtime=True)
    channels_last: bool = param(False, "channels-last memory on GPU", runtime=True)
    compile: bool = param(False, "torch.compile the model (GPU speed option)", runtime=True)
    sync_bn: bool = param(True, "batch-norm statistics over the global batch with several processes")
    keep_best: bool = param(False, "keep the best epoch's weights by ID-val accuracy beside the last")
    weights: Checkpoint = param("last", "the weights the model holds when training returns")

    @classmethod
    def of(cls, settings: TrainSettings | None, **options: Any) -> LoopSettings:
        """`settings` (None: the defaults) with `options` (names of `LoopSettings` fields) over them; an unknown name
        is a TypeError naming it."""
        unknown = set(options) - set(cls.fields())
        if unknown:
            raise TypeError(f"unknown training setting(s) {sorted(unknown)}; known: {sorted(cls.fields())}")
        base = {} if settings is None else {f: getattr(settings, f) for f in settings.fields() if f in cls.fields()}
        return cls(**{**base, **options})


def drop_last(rows: int, batch_size: int, keep_partial: bool) -> bool:
    """Whether a training loader drops its last partial batch: always when more rows than one batch (`keep_partial`
    false, protocol `exact`), else only a last batch of exactly one row, on which batch norm cannot train (the
    reference keeps every partial batch)."""
    if not keep_partial:
        return rows > batch_size
    return rows > batch_size and rows % batch_size == 1


def _rows(loader: Any) -> int:
    """The number of rows a training loader draws from (the reference's `dataset.train.len`)."""
    if hasattr(loader, "dataset"):
        return len(loader.dataset)
    if hasattr(loader, "pool"):
        return len(loader.pool.labels)
    return len(loader.labels)


def _mixed_precision(precision: str) -> str:
    dtype = resolve_dtype(precision, resolve_device())
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, "no")


def _optimizer(step_module: nn.Module, objective: Objective, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    no_decay = {id(p) for p in objective.no_decay_parameters()}
    trainable = [p for p in step_module.parameters() if p.requires_grad]
    groups = [{"params": [p for p in trainable if id(p) not in no_decay]},
              {"params": [p for p in trainable if id(p) in no_decay], "weight_decay": 0.0}]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=lr, weight_decay=weight_decay)


@torch.no_grad()
def second_adam_step(optimizer: Any, params: Sequence[nn.Parameter], lr: float) -> None:
    """The step a second AdamW (weight decay 0, `lr`, the same betas and eps) would take on `params` right after
    `optimizer` stepped: it sees the same gradients, so its moments equal `optimizer`'s; the update is
    lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps), torch's AdamW arithmetic."""
    inner = getattr(optimizer, "optimizer", optimizer)
    for group in inner.param_groups:
        beta1, beta2 = group["betas"]
        for p in group["params"]:
            if not any(p is q for q in params) or p not in inner.state:
                continue
            state = inner.state[p]
            step = float(state["step"])
            denom = (state["exp_avg_sq"].sqrt() / math.sqrt(1 - beta2 ** step)).add_(group["eps"])
            p.addcdiv_(state["exp_avg"], denom, value=-lr / (1 - beta1 ** step))


class _Loop:
    """One training run under accelerate. Image loaders hand each process its share of every global batch
    (`loaders.ShareBatches`: the last partial batch shared too, no row repeated) and each process's loss is weighted
    by its share of the batch's real rows (`share_weight`), so the steps, the schedule and (with `sync_bn`) the
    weights do not depend on the number of processes; cached-feature batches stay whole on every process."""

    def __init__(self, model: nn.Module, objective: Objective, loaders: tuple[Any, Any, Any, Any],
                 targets: tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, np.ndarray]],
                 settings: LoopSettings, result: TrainResult, failed_files: Callable[[str, int], str]):
        from accelerate import Accelerator, DataLoaderConfiguration, DistributedDataParallelKwargs

        if settings.epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {settings.epochs}")
        if settings.warmup_epochs >= settings.epochs:  # train_classifier refuses it (TrainConfig); said, never silent
            log.warning("%s: warning: warmup_epochs (%g) >= epochs (%d): every step is in the warm-up", settings.desc,
                        settings.warmup_epochs, settings.epochs)
        if len(loaders[0]) == 0:
            raise ConfigError(f"batch_size: {_rows(loaders[0])} training rows make no batch: no optimiser step would "
                              "run "
                              "(lower batch_size or keep the last partial batch)")
        if settings.weights == "best" and loaders[2] is None:
            raise ValueError(f"{settings.desc}: the best epoch is chosen by ID validation accuracy: pass validation "
                             "rows "
                             "(or keep the last epoch's weights)")
        self.tracks_best = (settings.keep_best or settings.weights == "best") and loaders[2] is not None
        self.s, self.result, self.failed_files, self.objective = settings, result, failed_files, objective
        handlers = [DistributedDataParallelKwargs(find_unused_parameters=True)] if objective.replaces_head else []
        self.acc = Accelerator(mixed_precision=_mixed_precision(settings.precision), cpu=resolve_device().type == "cpu",
                               kwargs_handlers=handlers, dataloader_config=DataLoaderConfiguration(split_batches=True))
        if settings.channels_last and self.acc.device.type == "cuda":
            model.to(memory_format=torch.channels_last)
        step_module = _Step(model, objective, compiled=settings.compile)
        optimizer = _optimizer(step_module, objective, settings.lr, settings.weight_decay)
        self.step_module, self.optimizer = self.acc.prepare(step_module, optimizer)
        prepare = lambda x: self.acc.prepare(x) if isinstance(x, DataLoader) else x  # noqa: E731
        self.val, self.test = prepare(loaders[2]), prepare(loaders[3])
        # training image loaders: each process draws its share of every global batch, the last one too, never a
        # repeated row (`ShareBatches`); the passes over every row keep accelerate's loaders (gathered, deduplicated)
        self.shared = self.acc.num_processes > 1 and isinstance(loaders[0], DataLoader)
        share = lambda x: share_loader(x, self.acc.process_index, self.acc.num_processes)  # noqa: E731
        self.train, self.aux = ((share(x) if self.shared and isinstance(x, DataLoader) else prepare(x))
                                for x in loaders[:2])
        self.pass_train, self.pass_aux = ((prepare(x) if self.shared else y) for x, y in zip(loaders[:2],
                                                                                             (self.train, self.aux)))
        self.train_targets, self.val_targets, self.test_targets = targets
        # one schedule step per optimiser step; with split batches every process takes every global step
        self.batches = len(self.train)
        self.scheduler = make_scheduler(self.optimizer, settings.schedule, epochs=settings.epochs,
                                        warmup_epochs=settings.warmup_epochs, batches=self.batches,
                                        rows=_rows(loaders[0]), batch_size=_batch_size(loaders[0]),
                                        advances=objective.advances_schedule)
        self.device = self.acc.device
        self.twice = list(objective.twice_stepped_parameters())
        self.seen: set[tuple[str, int]] = set()
        self.sample_shape: tuple[int, ...] | None = None  # one training image's, for an empty share's batch

    def record(self, failed: list[tuple[int, str]], split: str) -> None:
        for index, reason in failed:
            if (split, index) not in self.seen:
                self.seen.add((split, index))
                self.result.failures.append(LoadFailure(index, self.failed_files(split, index), reason))

    def inputs(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.device, non_blocking=True)
        return self.s.normalize(x) if self.s.normalize is not None else x

    def passes(self) -> tuple[Pass, Pass | None]:
        """The model's outputs on every ID-train (and aux) row, for calibration and per-epoch passes."""
        inner = self.acc.unwrap_model(self.step_module)
        inner.eval()
        id_loader, aux_loader = _pass_loaders(self.pass_train, self.pass_aux, self.objective.pooled)
        id_pass = _all_outputs(inner.model, id_loader, self.inputs, self.acc)
        return (id_pass,
                (_all_outputs(inner.model, aux_loader, self.inputs, self.acc) if aux_loader is not None else None))

    def run(self) -> TrainResult:
        start, first = time.perf_counter(), self.resume()
        if self.objective.needs_calibration and first == 0:
            id_pass, aux_pass = self.passes()
            self.acc.unwrap_model(self.step_module).objective.calibrate_pass(id_pass, aux_pass)
        self.report = EpochLog(self.s.desc, self.s.epochs, first, self.batches, self.acc.is_local_main_process)
        try:
            for epoch in range(first, self.s.epochs):
                seed_everything(self.s.seed * 7919 + epoch)
                self.acc.unwrap_model(self.step_module).objective.epoch_begin(epoch)
                if self.objective.needs_epoch_pass:
                    self.acc.unwrap_model(self.step_module).objective.epoch_start(epoch, *self.passes())
                entry = self.train_epoch(epoch)
                if self.val is not None:
                    entry.update(self.evaluate(self.val, self.val_targets, "val"))
                self.result.history.append(entry)
                self.result.seconds += time.perf_counter() - start
                start = time.perf_counter()
                self.save(epoch + 1)
                self.keep_best(epoch + 1)
                self.report.epoch_done(entry)
        finally:
            self.report.close()
        if self.test is not None:
            self.result.test = self.evaluate(self.test, self.test_targets, "test")
        self.finish_best()
        self.result.seconds += time.perf_counter() - start
        if self.acc.is_main_process and first < self.s.epochs:
            log.info("%s: %s", self.s.desc, describe(self.s.schedule, self.result.lrs, epochs=self.s.epochs,
                                                     batches=self.batches, warmup_epochs=self.s.warmup_epochs,
                                                     lr=self.s.lr))
        return self.result

    def train_epoch(self, epoch: int) -> dict[str, float]:
        set_epoch(self.train, epoch)
        aux_stream = cycle(self.aux, epoch) if self.aux is not None and self.objective.aux_active(epoch) else None
        self.step_module.train()
        total, count, steps_before = 0.0, 0, self.result.steps
        for step, raw in enumerate(self.train):
            try:
                batch = self.batch(raw, aux_stream, epoch, step)
            except Exception as err:
                if self.shared:  # the others learn it at this step's agreement and stop with this process
                    self.share_weight(0, err)
                raise
            if batch is None:
                continue
            weight = self.share_weight(batch.n_id)  # before the forward: its all-reduce is the step's agreement
            with self.acc.autocast():
                loss = self.step_module(batch)
            self.optimizer.zero_grad(set_to_none=True)
            self.acc.backward(loss * weight)
            if self.objective.max_grad_norm is not None:
                self.acc.clip_grad_norm_(self.step_module.parameters(), self.objective.max_grad_norm)
            self.optimizer.step()
            if self.twice and not self.acc.optimizer_step_was_skipped:
                second_adam_step(self.optimizer, self.twice, self.s.lr)
            self.result.lrs.append(float(self.optimizer.param_groups[0]["lr"]))
            if not self.acc.optimizer_step_was_skipped:  # fp16 overflow: no step taken, the schedule waits
                self.scheduler.step()
            self.result.steps += 1
            if batch.n_id:  # an empty share's loss is the mean of no rows (NaN); its weight and gradients are 0
                total += float(loss.detach()) * batch.n_id
                count += batch.n_id
            self.report.step(epoch, total / max(count, 1))
        total, count = self.acc.reduce(torch.tensor([total, count], dtype=torch.float64, device=self.device),
                                       "sum").tolist()
        if self.result.steps == steps_before:
            raise RuntimeError(f"{self.s.desc} epoch {epoch + 1}: no optimiser step (every training batch failed to "
                               "load)")
        return {"epoch": epoch + 1, "loss": total / count if count else math.nan, "lr": self.scheduler.get_last_lr()[0]}

    def empty_shape(self) -> tuple[int, ...]:
        """The shape of one training image (an empty share's batch is [0, *shape]): the last batch's, else the first
        readable row's."""
        if self.sample_shape is None:
            dataset = self.train.dataset
            first = next((item[0] for item in map(dataset.__getitem__, range(len(dataset))) if item[0] is not None),
                         None)
            if first is None:
                raise RuntimeError(f"{self.s.desc}: no training image could be loaded")
            self.sample_shape = tuple(first.shape)
        return self.sample_shape

    def share_weight(self, rows: int, error: BaseException | None = None) -> float:
        """The factor on this process's mean loss that makes the gradient (DDP averages the processes') the mean over
        the global batch's real rows: rows x processes / global rows, 1.0 for equal shares (and one process). Its
        all-reduce, one per step before any other, also carries whether a process failed to prepare its share
        (`error`): then every process stops there, this one with its own error, none waiting in a later
        collective for it."""
        if not self.shared:
            return 1.0
        total, failed = self.acc.reduce(torch.tensor([float(rows), float(error is not None)], dtype=torch.float64,
                                                     device=self.device), "sum").tolist()
        if error is not None:
            raise error
        if failed:
            raise RuntimeError(f"{self.s.desc}: {int(failed)} other process(es) could not prepare their share of a "
                               "training batch (their error says why); this process stops with them")
        return rows * self.acc.num_processes / total

    def batch(self, raw: dict[str, Any], aux_stream: Iterator[dict[str, Any]] | None, epoch: int,
              step: int) -> TrainBatch | None:
        self.record(raw["failed"], "train")
        aux = raw["aux"] if "aux" in raw else next(aux_stream) if aux_stream is not None else None
        if aux is not None:
            self.record(aux["failed"], "aux")
        if raw["x"] is not None:
            self.sample_shape = tuple(raw["x"].shape[1:])
        elif self.shared and not raw["failed"]:
            # a global batch with fewer rows than processes (the last one) leaves this share empty: it still takes
            # the step, on no rows (weight 0), so every process enters the step's collectives
            raw = {**raw, "x": torch.empty((0, *self.empty_shape()))}
        if raw["x"] is None:
            if self.acc.num_processes > 1:  # the other processes would wait forever in the gradient all-reduce
                raise RuntimeError("every image of a training batch share failed to load on process "
                                   f"{self.acc.process_index}: "
                                   f"{raw['failed'][:3]}; drop unreadable images from the manifest")
            return None
        index = raw["index"]
        has_aux = aux is not None and aux["x"] is not None
        return TrainBatch(
            x=self.inputs(raw["x"]), y=raw["y"].to(self.device),
            targets={k: torch.as_tensor(v[index.cpu().numpy()]).to(self.device) for k, v in self.train_targets.items()},
            aux_x=self.inputs(aux["x"]) if has_aux else None, aux_y=aux["y"].to(self.device) if has_aux else None,
            generator=torch.Generator().manual_seed(self.s.seed * 1_000_003 + epoch * 10_007 + step),
            index=index.to(self.device), aux_index=aux["index"].to(self.device) if has_aux else None, epoch=epoch)

    def evaluate(self, loader: Any, targets: dict[str, np.ndarray], split: str) -> dict[str, float]:
        set_epoch(loader, 0)
        return _evaluate(self.acc.unwrap_model(self.step_module), loader, targets, self.inputs, self.acc,
                         lambda failed, _: self.record(failed, split))

    # -- checkpoints ---------------------------------------------------------------------------------------------
    def _saved(self) -> tuple[Any, ...]:
        inner = self.acc.unwrap_model(self.step_module)
        return (inner, inner.objective, self.optimizer, self.scheduler, self.result,
                loader_generators([self.train, self.aux]))

    def save(self, epochs_done: int) -> None:
        if self.s.checkpoint is None:
            return
        if self.acc.is_main_process:
            save_checkpoint(self.s.checkpoint, self.s.checkpoint_key, epochs_done, *self._saved())
        self.acc.wait_for_everyone()

    def resume(self) -> int:
        """Epochs already done according to a matching checkpoint (0 without one); restores every state it holds. The
        main process decides from its files whether and from which epoch (`_resumable`), and every process loads that
        checkpoint: a process that read another epoch there (a folder not shared, NFS lag) stops in one line instead
        of training out of step with the others."""
        first = main_decides(self._resumable, "the training resume check")
        if not first:
            return 0
        loaded = load_checkpoint(self.s.checkpoint, self.s.checkpoint_key, *self._saved())
        if loaded != first:
            raise UserInputError(f"{self.s.checkpoint}: the main process resumes after epoch {first}, the process on "
                                 f"{host()} read epoch {loaded or 'none'} there: the checkpoint must be in a folder "
                                 "every process sees")
        if self.tracks_best:
            self.keep_best(first)
        return first

    def _resumable(self) -> int:
        """The epochs a matching checkpoint had done, 0 to start over. A run that keeps its best epoch resumes only
        when the best epoch's weights are there: the best epoch of the saved history is either the checkpoint's own
        epoch (its weights are rewritten from the restored state) or an earlier one whose file `keep_best` wrote
        before any later checkpoint; otherwise training starts over (one warning)."""
        if self.s.checkpoint is None or not checkpoint_matches(self.s.checkpoint, self.s.checkpoint_key):
            return 0
        history = checkpoint_history(self.s.checkpoint, self.s.checkpoint_key) or []
        if self.tracks_best:
            best, done = best_epoch(history), len(history)
            found = best_epoch_saved(best_path(self.s.checkpoint), self.s.checkpoint_key)
            if best is not None and best != done and found != best:
                log.warning("[oodforge] %s does not hold the best epoch (%s) of %s (%s): training starts over",
                            best_path(self.s.checkpoint), best, self.s.checkpoint,
                            f"epoch {found}" if found else "no such file")
                return 0
        return int((read_metadata(self.s.checkpoint) or {}).get("epoch", 0))

    # -- the best epoch ------------------------------------------------------------------------------------------
    def keep_best(self, epochs_done: int) -> None:
        """After epoch `epochs_done` (saved): when it is the best so far (`best_epoch`), keep its weights, unless the
        file already holds them (a resumed run)."""
        if not self.tracks_best or best_epoch(self.result.history) != epochs_done:
            return
        inner = self.acc.unwrap_model(self.step_module)
        self.result.best = epochs_done
        if self.s.checkpoint is None:
            self.result.best_state = {**_snapshot(inner), "epoch": epochs_done}
            return
        path = best_path(self.s.checkpoint)
        self.result.best_file, self.result.best_key = path, self.s.checkpoint_key
        if self.acc.is_main_process and best_epoch_saved(path, self.s.checkpoint_key) != epochs_done:
            save_best(path, self.s.checkpoint_key, epochs_done, inner, inner.objective, self.result.history[-1])
        self.acc.wait_for_everyone()

    def finish_best(self) -> None:
        """The best epoch found (a resumed run's from its history), its weights' test accuracy, and the weights the
        model keeps (`weights`)."""
        if not self.tracks_best:
            return
        self.result.best = best_epoch(self.result.history)
        if self.result.best is None:
            if self.s.weights == "best":
                raise ValueError(f"{self.s.desc}: no epoch has an ID validation accuracy (every validation image "
                                 "failed "
                                 "to load?): there is no best epoch to keep")
            return
        if self.s.checkpoint is not None:
            self.result.best_file, self.result.best_key = best_path(self.s.checkpoint), self.s.checkpoint_key
        inner = self.acc.unwrap_model(self.step_module)
        if self.result.best == len(self.result.history):  # the last epoch is the best: the model holds it already
            self.result.best_test = dict(self.result.test)
            self.result.kept = self.s.weights
            return
        last = _snapshot(inner) if self.s.weights == "last" else None
        load_best_weights(self.result, inner.model, inner.objective)
        if self.test is not None:
            self.result.best_test = self.evaluate(self.test, self.test_targets, "test")
        if last is not None:
            _restore(inner, last)
        self.result.kept = self.s.weights


def _run(model: nn.Module, objective: Objective, train_loader: Any, aux_loader: Any, val_loader: Any,
         train_targets: dict[str, np.ndarray], val_targets: dict[str, np.ndarray], *, settings: LoopSettings,
         result: TrainResult, failed_files: Callable[[str, int], str], test_loader: Any = None,
         test_targets: dict[str, np.ndarray] | None = None) -> TrainResult:
    """Train `model` with `objective` (see `_Loop`); returns `result` filled in."""
    with global_batchnorm(model, settings.sync_bn and _world_size() > 1):
        loop = _Loop(model, objective, (train_loader, aux_loader, val_loader, test_loader),
                     (train_targets, val_targets, test_targets or {}), settings, result, failed_files)
        return loop.run()


def _batch_size(loader: Any) -> int:
    return int(loader.batch_size if hasattr(loader, "batch_size") else loader.pool.batch_size)


def _world_size() -> int:
    from pipelines.runtime import partial_state

    return partial_state(cpu=resolve_device().type == "cpu").num_processes


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
    if isinstance(train_loader, PooledTensorBatches):
        pool = train_loader.pool
        n = train_loader.n_id
        return (TensorBatches(pool.features[:n].numpy(), pool.labels[:n].numpy(), pool.batch_size, False, 0, False),
                TensorBatches(pool.features[n:].numpy(), pool.labels[n:].numpy(), pool.batch_size, False, 0, False))
    if pooled:
        return _SplitPool(train_loader, "id"), _SplitPool(train_loader, "aux")

    def ordered(loader: Any) -> Any:
        if isinstance(loader, TensorBatches):
            return TensorBatches(loader.features.numpy(), loader.labels.numpy(), loader.batch_size, False, 0, False)
        return loader

    return ordered(train_loader), None if aux_loader is None else ordered(aux_loader)


@torch.no_grad()
def _all_outputs(model: nn.Module, loader: Any, inputs: Callable[[torch.Tensor], torch.Tensor],
                 accelerator: Any) -> Pass:
    """float32 logits and features of every loadable row of `loader` (one pass, no gradient), gathered from every
    process, sorted by row index with duplicates (whole batches seen by several processes) removed."""
    logits, features, index, labels = [], [], [], []
    device = accelerator.device
    for raw in progress(loader, desc="pass over the training rows", leave=False,
                        disable=not accelerator.is_local_main_process):
        if raw["x"] is not None:
            with accelerator.autocast():
                z, h = model(inputs(raw["x"]))
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
def _evaluate(step_module: _Step, loader: Any, targets: dict[str, np.ndarray],
              inputs: Callable[[torch.Tensor], torch.Tensor],
              accelerator: Any, record: Callable[[list[tuple[int, str]], str], None]) -> dict[str, float]:
    """Accuracy per level (`acc_<level>`), and `overall` = share of rows with every level right (failed rows
    excluded)."""
    step_module.eval()
    model, objective = step_module.model, step_module.objective
    right: dict[str, list[np.ndarray]] = {}
    for raw in loader:
        record(raw["failed"], "val")
        if raw["x"] is None:
            continue
        with accelerator.autocast():
            logits, features = model(inputs(raw["x"]))
            heads = objective.heads(logits, features)
        wanted = {PRIMARY: raw["y"].cpu().numpy(), **{k: v[raw["index"].cpu().numpy()] for k, v in targets.items()}}
        for name, level_logits in heads.items():
            pred = level_logits.float().argmax(1).cpu().numpy()
            hits = torch.as_tensor(pred == wanted[name], device=accelerator.device)
            right.setdefault(name, []).append(accelerator.gather_for_metrics(hits).cpu().numpy())
    if not right:
        return {}
    stacked = {name: np.concatenate(parts) for name, parts in right.items()}
    out = {f"acc_{name}": float(v.mean()) for name, v in stacked.items()}
    out["overall"] = float(np.logical_and.reduce(list(stacked.values())).mean())
    return out


# -- public entry points ---------------------------------------------------------------------------------------
def finetune(classifier: nn.Module, train: Manifest, *, settings: TrainSettings | None = None,
             objective: Objective | None = None, aux: Manifest | None = None, aux_label_field: str | None = None,
             val: Manifest | None = None, test: Manifest | None = None, num_workers: int = 0,
             augment: Callable[[Any], Any] | None = None, transforms: tuple[Callable, Callable] | None = None,
             **options: Any) -> TrainResult:
    """Fine-tune `classifier` (an `ImageClassifier`: forward -> (logits, features), `.head`, `.preprocess`) in place.

    `settings` (`TrainSettings`; None: its defaults, the Open-Insects fine-tuning recipe) says how; `options` are
    `LoopSettings` fields over them (epochs, lr, batch_size, ... and checkpoint, checkpoint_key, channels_last,
    compile, sync_bn, keep_best, weights: the best epoch by ID-val accuracy kept beside the last, and which the model
    holds). `batch_size` is the global batch (split across processes); `drop_last` false keeps the last partial
    training batch (the `drop_last` function's rule).
    `train` holds ID rows (their `label`); `aux` (auxiliary / outlier rows) feeds objectives with `uses_aux`, its class
    index read from `aux_label_field` (sorted vocabulary; e.g. "species" for Extended). `val` (ID rows) gives the
    per-epoch accuracy, `test` the accuracy at the end (`TrainResult.test`). Pixels come from the classifier's own
    `preprocess` after `augment` (PIL -> PIL), or from `transforms` = (train, eval) `(image, rng) -> uint8 tensor`
    normalised on the device with the classifier's mean and std; auxiliary rows of a separate aux stream get the eval
    transform (the reference's test preprocessor for its `oe` split), pooled aux rows the training one.
    """
    s = LoopSettings.of(settings, **{"desc": "finetune", **options})
    if transforms is not None and s.normalize is None:
        s = s.replace(normalize=Normalize(classifier.mean.flatten().tolist(), classifier.std.flatten().tolist(),
                                          channels_last=s.channels_last))
    objective = objective or CrossEntropy()
    seed_everything(s.seed)
    if objective.uses_aux and aux is None:
        raise ValueError(f"{type(objective).__name__} trains with auxiliary data: pass aux=<Manifest of auxiliary "
                         "rows>")
    fields = objective.label_fields()
    train_values = target_values(train.rows, fields, "train")
    objective.fit_targets(train_values)
    targets = [objective.encode_targets(train_values)]
    targets += [objective.encode_targets(target_values(m.rows, fields, name)) if m is not None else {}
                for name, m in (("val", val), ("test", test))]
    aux_y, aux_vocab = aux_labels(aux.rows, aux_label_field) if aux is not None and objective.uses_aux else (None, [])
    objective.bind_head(classifier.head)
    objective.setup(classifier.head.in_features, classifier.head.out_features, len(aux_vocab))
    pixels = _pixels(classifier.preprocess, augment, transforms, s.seed)
    loaders = _image_loaders(objective, train, aux, aux_y, val, test, pixels, s.batch_size, s.seed, num_workers,
                             not s.drop_last, aux_train_pixels=transforms is None)
    manifests = {"train": train, "aux": aux, "val": val, "test": test}
    return _run(classifier, objective, *loaders[:3], targets[0], targets[1], settings=s,
                result=TrainResult(aux_vocab=aux_vocab),
                failed_files=lambda split, i: manifests[split].rows[i]["file_name"],
                test_loader=loaders[3], test_targets=targets[2])


def _pixels(preprocess: Callable, augment: Callable | None, transforms: tuple[Callable, Callable] | None,
            seed: int) -> Callable[[Manifest, np.ndarray, bool], ImageRows]:
    """A maker of `ImageRows` (training rows augmented, evaluation rows not) for the chosen pixel path."""
    def rows(manifest: Manifest, labels: np.ndarray, training: bool) -> ImageRows:
        if transforms is not None:
            return ImageRows(manifest, labels, None, transform=transforms[0 if training else 1], seed=seed)
        return ImageRows(manifest, labels, preprocess, augment if training else None)

    return rows


def _image_loaders(objective: Objective, train: Manifest, aux: Manifest | None, aux_y: np.ndarray | None,
                   val: Manifest | None, test: Manifest | None, rows: Callable[[Manifest, np.ndarray, bool], ImageRows],
                   batch_size: int, seed: int, num_workers: int, keep_last_batch: bool = False,
                   aux_train_pixels: bool = True) -> tuple[Any, Any, Any, Any]:
    """(train, aux, val, test) DataLoaders; aux is None unless the objective draws a separate auxiliary stream (its
    rows with the training pixels when `aux_train_pixels`, else the evaluation ones)."""
    train_rows = rows(train, manifest_labels(train, "train"), True)
    aux_loader = None
    if objective.uses_aux and objective.pooled:
        pool = PooledRows(train_rows, rows(aux, aux_y, True))
        train_loader = make_loader(pool, batch_size, True, seed, num_workers,
                                   drop_last=drop_last(len(pool), batch_size, keep_last_batch),
                                   collate_fn=collate_pooled)
    else:
        train_loader = make_loader(train_rows, batch_size, True, seed, num_workers,
                                   drop_last=drop_last(len(train), batch_size, keep_last_batch))
    if objective.uses_aux and not objective.pooled:
        aux_size = aux_batch_size(objective, batch_size, len(train), len(aux))
        aux_loader = make_loader(rows(aux, aux_y, aux_train_pixels), aux_size, True, seed + 1, num_workers,
                                 drop_last=drop_last(len(aux), aux_size, keep_last_batch))
    evals = [make_loader(rows(m, m.labels(), False), batch_size, False, seed, num_workers) if m is not None else None
             for m in (val, test)]
    return train_loader, aux_loader, evals[0], evals[1]


def train_heads(head: Any, train_features: np.ndarray, train_labels: np.ndarray, *,
                settings: TrainSettings | None = None, objective: Objective | None = None,
                aux_features: np.ndarray | None = None, aux_labels: np.ndarray | None = None,
                train_targets: dict[str, Sequence[Any]] | None = None, val_features: np.ndarray | None = None,
                val_labels: np.ndarray | None = None, val_targets: dict[str, Sequence[Any]] | None = None,
                **options: Any) -> tuple[nn.Linear, TrainResult]:
    """Fast mode: train only the linear head(s) on cached penultimate features, with the same loop and objectives.

    `head` (nn.Linear, LinearHead or (weight, bias)) initialises the closed-set head; a copy is trained and returned.
    `settings` and `options` as in `finetune`. `aux_labels` are auxiliary class indices (-1 unknown); `*_targets` are
    raw values per extra label level (multi-granularity). Objectives that transform inputs (MixOE) mix features here
    instead of pixels. `weights`: the returned head is the last epoch's, or the best epoch's by validation accuracy
    (`best_epoch`; needs `val_features`).
    """
    s = LoopSettings.of(settings, **{"desc": "train_heads", **options})
    objective = objective or CrossEntropy()
    seed_everything(s.seed)
    if objective.uses_aux and aux_features is None:
        raise ValueError(f"{type(objective).__name__} trains with auxiliary data: pass aux_features")
    layer = _copy_linear(as_linear(head))
    labels = np.asarray(train_labels, dtype=np.int64)
    if (labels < 0).any():
        raise ValueError("train_labels hold -1 (OOD) entries: pass ID features only")
    encoded_train, encoded_val = _head_targets(objective, train_targets, val_targets)
    aux_y = None
    n_aux_classes = 0
    if objective.uses_aux:
        aux_y = (np.full(len(aux_features), -1, dtype=np.int64) if aux_labels is None
                 else np.asarray(aux_labels, dtype=np.int64))
        n_aux_classes = int(aux_y.max()) + 1 if (aux_y >= 0).any() else 0
    objective.bind_head(layer)
    objective.setup(layer.in_features, layer.out_features, n_aux_classes)
    aux_loader = None
    if objective.uses_aux and objective.pooled:
        train_loader = PooledTensorBatches(train_features, labels, aux_features, aux_y, s.batch_size, s.seed,
                                           drop_last=drop_last(len(labels) + len(aux_y), s.batch_size, not s.drop_last))
    else:
        train_loader = TensorBatches(train_features, labels, s.batch_size, True, s.seed,
                                     drop_last=drop_last(len(labels), s.batch_size, not s.drop_last))
    if objective.uses_aux and not objective.pooled:
        aux_size = aux_batch_size(objective, s.batch_size, len(labels), len(aux_y))
        aux_loader = TensorBatches(aux_features, aux_y, aux_size, True, s.seed + 1,
                                   drop_last=drop_last(len(aux_y), aux_size, not s.drop_last))
    val_loader = None
    if val_features is not None:
        val_loader = TensorBatches(val_features, np.asarray(val_labels, dtype=np.int64), s.batch_size, False, s.seed,
                                   False)
    result = _run(_HeadsOnly(layer), objective, train_loader, aux_loader, val_loader, encoded_train, encoded_val,
                  settings=s, result=TrainResult(), failed_files=lambda split, i: f"{split}[{i}]")
    return layer, result


def _head_targets(objective: Objective, train_targets: dict[str, Sequence[Any]] | None,
                  val_targets: dict[str, Sequence[Any]] | None) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Encoded extra-level targets of the training and validation rows (the objective learns its vocabularies)."""
    fields = objective.label_fields()
    missing = set(fields) - set(train_targets or {})
    if missing:
        raise ValueError(f"{type(objective).__name__} needs train_targets for level(s) {sorted(missing)}")
    if not fields:
        return {}, {}
    objective.fit_targets({k: list(train_targets[k]) for k in fields})
    encoded_train = objective.encode_targets({k: list(train_targets[k]) for k in fields})
    encoded_val = objective.encode_targets({k: list(val_targets[k]) for k in fields}) if val_targets else {}
    return encoded_train, encoded_val


def _copy_linear(layer: nn.Linear) -> nn.Linear:
    out = nn.Linear(layer.in_features, layer.out_features)
    with torch.no_grad():
        out.weight.copy_(layer.weight.detach().float().cpu())
        out.bias.copy_(layer.bias.detach().float().cpu())
    return out
