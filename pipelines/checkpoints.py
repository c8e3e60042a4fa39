"""Per-epoch training checkpoints: everything the shared loop needs to continue a killed run where it stopped.

One file (torch.save, written atomically) holds the model + objective weights, the optimiser and schedule, the epochs
done, the run's history so far, the objective's plain Python attributes (margins, lambda schedules, cluster tables),
the global torch (and CUDA) RNG and the data loaders' shuffling generators. `key` names what the run trains (the caller's content
key); a file with another key is ignored and overwritten, never resumed.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pipelines.io import atomic_path

FORMAT = "oodforge-train-checkpoint-v1"


def loader_generators(loaders: list[Any]) -> list[torch.Generator | None]:
    """The torch.Generator that shuffles each loader (cached-feature batches, pooled batches, DataLoaders and the
    wrappers accelerate puts around them), None where there is none."""
    found = []
    for loader in loaders:
        gen = None
        for path in ("generator", "pool.generator", "sampler.generator", "batch_sampler.sampler.generator",
                     "batch_sampler.batch_sampler.sampler.generator", "base_dataloader.generator"):
            obj: Any = loader
            for part in path.split("."):
                obj = getattr(obj, part, None)
            if isinstance(obj, torch.Generator):
                gen = obj
                break
        found.append(gen)
    return found


def _plain_attributes(objective: nn.Module) -> dict[str, Any]:
    return {k: v for k, v in vars(objective).items() if not k.startswith("_") and k != "training"}


def save_checkpoint(path: str | os.PathLike, key: str, epoch: int, module: nn.Module, objective: nn.Module,
                    optimizer: Any, scheduler: Any, result: Any, generators: list[torch.Generator | None]) -> None:
    """Write the state after `epoch` epochs (atomic: a reader sees the previous file or this one, never a part)."""
    state = {
        "format": FORMAT, "key": key, "epoch": epoch, "module": module.state_dict(),
        "objective": _plain_attributes(objective), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
        "history": result.history, "lrs": result.lrs, "steps": result.steps, "seconds": result.seconds,
        "torch_rng": torch.get_rng_state(), "generators": [None if g is None else g.get_state() for g in generators],
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }
    with atomic_path(path) as tmp:
        torch.save(state, tmp)


def load_checkpoint(path: str | os.PathLike, key: str, module: nn.Module, objective: nn.Module, optimizer: Any,
                    scheduler: Any, result: Any, generators: list[torch.Generator | None]) -> int:
    """Restore a matching checkpoint into the given objects; return the number of epochs it had done (0: none)."""
    path = Path(path)
    if not path.is_file():
        return 0
    state = torch.load(path, map_location="cpu", weights_only=False)
    if not isinstance(state, dict) or state.get("format") != FORMAT or state.get("key") != key:
        return 0
    module.load_state_dict(state["module"])
    for name, value in state["objective"].items():
        setattr(objective, name, value)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    result.history, result.lrs, result.steps = list(state["history"]), list(state["lrs"]), int(state["steps"])
    result.seconds = float(state["seconds"])
    torch.set_rng_state(state["torch_rng"])
    if state.get("cuda_rng") is not None and torch.cuda.is_available() and len(state["cuda_rng"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    for gen, saved in zip(generators, state["generators"]):
        if gen is not None and saved is not None:
            gen.set_state(saved)
    return int(state["epoch"])
