"""Data for the loop: manifest rows as image datasets (decoded, augmented per (seed, epoch, row), unreadable images
recorded), cached features in batches, pooled ID + aux sets, and the epoch-seeded sampler that makes the order of
every epoch independent of resumes and of the number of processes."""
from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from pipelines.collectives import share
from pipelines.data import ImageLoadError, Manifest, load_image
from pipelines.training.objectives import Objective


class ImageRows(Dataset):
    """Manifest rows -> (pixels or None, class index, row position, failure reason).

    Pixels come from `transform.load(path, rng)` (a uint8 tensor decoded for the transform's crop,
    `transforms.Compose.load`; `rng` seeded by (seed, epoch, row), see `set_epoch`), or `transform(image, rng)` for a
    transform without `load`, else from `augment(image)` then `preprocess([image])[0]` (normalised floats, the
    classifier's own processor)."""

    def __init__(self, manifest: Manifest, labels: np.ndarray, preprocess: Callable[[list[Any]], torch.Tensor] | None,
                 augment: Callable[[Any], Any] | None = None,
                 transform: Callable[[Any, Any], torch.Tensor] | None = None, seed: int = 0):
        self.manifest, self.labels, self.preprocess, self.augment = manifest, labels, preprocess, augment
        self.transform, self.seed, self.epoch = transform, int(seed), 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return len(self.manifest.rows)

    def __getitem__(self, i: int) -> tuple[torch.Tensor | None, int, int, str]:
        path = self.manifest.path(self.manifest.rows[i])
        try:
            if self.transform is not None and hasattr(self.transform, "load"):  # decoded for the transform's crop
                return self.transform.load(path, self._rng(i)), int(self.labels[i]), i, ""
            image = load_image(path)
        except ImageLoadError as err:
            return None, int(self.labels[i]), i, err.reason
        if self.transform is not None:
            return self.transform(image, self._rng(i)), int(self.labels[i]), i, ""
        if self.augment is not None:
            image = self.augment(image)
        return self.preprocess([image])[0], int(self.labels[i]), i, ""

    def _rng(self, i: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, self.epoch, i])


class EpochSampler(Sampler[int]):
    """Row order of one epoch: a permutation seeded by (seed, epoch) when shuffling, else 0..n-1. The same on every
    process (accelerate then hands each process its share of every batch) and after a resume. `set_epoch` also tells
    the dataset (and its `ImageRows` parts) the epoch, for per-row augmentation seeds."""

    def __init__(self, dataset: Dataset, seed: int, shuffle: bool):
        self.dataset, self.seed, self.shuffle, self.epoch = dataset, int(seed), shuffle, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)
        for part in (self.dataset, getattr(self.dataset, "train", None), getattr(self.dataset, "aux", None)):
            if hasattr(part, "set_epoch"):
                part.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.dataset)

    def __iter__(self) -> Iterator[int]:
        if not self.shuffle:
            return iter(range(len(self.dataset)))
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return iter(torch.randperm(len(self.dataset), generator=generator).tolist())


class TensorBatches:
    """Cached features in (optionally shuffled) batches, sliced whole (no per-row Python work); the loader interface
    of `_run` (len + iteration yielding the collated dict)."""

    def __init__(self, features: np.ndarray, labels: np.ndarray, batch_size: int, shuffle: bool, seed: int,
                 drop_last: bool):
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


class PooledTensorBatches:
    """ID and aux feature rows shuffled into one pool, cut into batches of `batch_size`; each batch is split back into
    its ID part (`x`, `y`, `index`) and its aux part (`aux`: the same keys)."""

    def __init__(self, features: np.ndarray, labels: np.ndarray, aux_features: np.ndarray, aux_labels: np.ndarray,
                 batch_size: int, seed: int, drop_last: bool):
        self.n_id = len(labels)
        self.pool = TensorBatches(np.concatenate([np.asarray(features, np.float32),
                                                  np.asarray(aux_features, np.float32)]),
                                   np.concatenate([labels, aux_labels]), batch_size, True, seed, drop_last)

    def __len__(self) -> int:
        return len(self.pool)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for batch in self.pool:
            is_id = batch["index"] < self.n_id
            aux = {"x": batch["x"][~is_id], "y": batch["y"][~is_id], "index": batch["index"][~is_id] - self.n_id,
                   "failed": []}
            yield {"x": batch["x"][is_id], "y": batch["y"][is_id], "index": batch["index"][is_id], "failed": [],
                   "aux": aux}


class PooledRows(Dataset):
    """ID rows then aux rows as one dataset (for a pooled image loader); items carry their source."""

    def __init__(self, train: Dataset, aux: Dataset):
        self.train, self.aux = train, aux

    def __len__(self) -> int:
        return len(self.train) + len(self.aux)

    def __getitem__(self, i: int) -> tuple[Any, ...]:
        n = len(self.train)
        return (*self.train[i], "id") if i < n else (*self.aux[i - n], "aux")


def collate_pooled(items: list[tuple[Any, ...]]) -> dict[str, Any]:
    out = collate([it[:4] for it in items if it[4] == "id"])
    aux = collate([it[:4] for it in items if it[4] == "aux"])
    if out["x"] is None and aux["x"] is not None:  # a batch of aux rows only: an empty ID part of the right shape
        out["x"] = aux["x"][:0]
    out["aux"] = aux
    return out


def collate(items: list[tuple[Any, int, int, str]]) -> dict[str, Any]:
    ok = [it for it in items if it[0] is not None]
    return {
        "x": torch.stack([it[0] for it in ok]) if ok else None,
        "y": torch.tensor([it[1] for it in ok], dtype=torch.long),
        "index": torch.tensor([it[2] for it in ok], dtype=torch.long),
        "failed": [(it[2], it[3]) for it in items if it[0] is None],
    }


def make_loader(dataset: Dataset, batch_size: int, shuffle: bool, seed: int, num_workers: int, drop_last: bool = False,
                collate_fn: Callable[[list[Any]], dict[str, Any]] = collate) -> DataLoader:
    """A DataLoader over `dataset` in `EpochSampler` order (pinned memory on GPU, seeded workers)."""
    return DataLoader(dataset, batch_size=batch_size, sampler=EpochSampler(dataset, seed, shuffle),
                      num_workers=num_workers,
                      collate_fn=collate_fn, generator=torch.Generator().manual_seed(seed), drop_last=drop_last,
                      pin_memory=torch.cuda.is_available(), worker_init_fn=seed_worker if num_workers else None)


class ShareBatches(Sampler[list[int]]):
    """This process's contiguous share of every global batch of `batches` (a batch sampler): shares differ by one row
    at most, and every process takes every step, the last partial batch included. accelerate's `even_batches` would
    instead pad the last batch with rows from the first (repeated rows: 2 processes would train on other rows than
    1); with full batches the shares are accelerate's `split_batches` ones."""

    def __init__(self, batches: Any, rank: int, processes: int):
        self.batch_sampler, self.rank, self.processes = batches, rank, processes

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def __iter__(self) -> Iterator[list[int]]:
        for batch in self.batch_sampler:
            mine = share(len(batch), self.rank, self.processes)
            yield list(batch[mine.start:mine.stop])

    def set_epoch(self, epoch: int) -> None:
        set_epoch(self.batch_sampler, epoch)


def share_loader(loader: DataLoader, rank: int, processes: int) -> DataLoader:
    """`loader` drawing only this process's share of each global batch (`ShareBatches`), its other settings kept."""
    return DataLoader(loader.dataset, batch_sampler=ShareBatches(loader.batch_sampler, rank, processes),
                      num_workers=loader.num_workers, collate_fn=loader.collate_fn, pin_memory=loader.pin_memory,
                      worker_init_fn=loader.worker_init_fn, generator=loader.generator)


def set_epoch(loader: Any, epoch: int) -> None:
    """Tell a loader's sampler (and dataset) the epoch: an accelerate-prepared loader through its own `set_epoch` (it
    re-applies its counter at every pass), a plain DataLoader through its sampler (or its batch sampler, for a
    `share_loader`); cached-feature batches need none."""
    if hasattr(loader, "set_epoch"):
        loader.set_epoch(epoch)
    elif hasattr(getattr(loader, "sampler", None), "set_epoch"):
        loader.sampler.set_epoch(epoch)
    elif hasattr(getattr(loader, "batch_sampler", None), "set_epoch"):
        loader.batch_sampler.set_epoch(epoch)


def seed_worker(worker_id: int) -> None:
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)


def cycle(loader: Any, epoch: int) -> Iterator[dict[str, Any]]:
    """Endless iteration over a loader, started afresh each training epoch: pass k of epoch e is shuffled as epoch
    e * 1000 + k of the loader (so a resumed epoch draws the same auxiliary batches)."""
    passes = 0
    while True:
        set_epoch(loader, epoch * 1000 + passes)
        passes += 1
        yielded = False
        for batch in loader:
            yielded = True
            yield batch
        if not yielded:
            raise ValueError("the auxiliary set is empty")


def manifest_labels(manifest: Manifest, what: str) -> np.ndarray:
    labels = manifest.labels()
    if what == "train" and (labels < 0).any():
        bad = manifest.rows[int(np.flatnonzero(labels < 0)[0])]["file_name"]
        raise ValueError(f"train manifest holds rows without an ID class label (label -1), e.g. {bad!r}: pass ID rows "
                         "only")
    return labels


def aux_labels(rows: list[dict[str, Any]], field_name: str | None) -> tuple[np.ndarray, list[Any]]:
    """Aux class indices from `field_name` (sorted vocabulary), or all -1 without a field."""
    if field_name is None:
        return np.full(len(rows), -1, dtype=np.int64), []
    values = [r.get(field_name) for r in rows]
    vocab = sorted({v for v in values if v is not None}, key=lambda v: (str(type(v)), v))
    index = {v: i for i, v in enumerate(vocab)}
    return np.array([index.get(v, -1) for v in values], dtype=np.int64), vocab


def aux_batch_size(objective: Objective, batch_size: int, n_train: int, n_aux: int) -> int:
    """Aux rows drawn per step: `aux_batch_ratio * batch_size`, or proportional to the set sizes when the ratio is
    None."""
    ratio = objective.aux_batch_ratio if objective.aux_batch_ratio is not None else n_aux / max(n_train, 1)
    return max(1, int(round(ratio * batch_size)))


def target_values(rows: list[dict[str, Any]], fields: dict[str, str], what: str) -> dict[str, list[Any]]:
    values = {}
    for name, field_name in fields.items():
        if rows and not any(field_name in r for r in rows):
            raise ValueError(f"{what} manifest rows have no field {field_name!r} (label level {name!r})")
        values[name] = [r.get(field_name) for r in rows]
    return values


