"""The per-epoch training checkpoint: one file written atomically (temp file + rename), so a run killed at any moment
(even `kill -9`) leaves the previous complete checkpoint, and a rerun resumes from it. A checkpoint carries the key of
the run that wrote it; another run's checkpoint is refused instead of silently continued."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from pipelines.errors import ConfigError
from pipelines.io import atomic_path


def save_checkpoint(path: str | os.PathLike, state: dict[str, Any]) -> None:
    """`torch.save(state)` to `path` atomically."""
    with atomic_path(path) as tmp:
        torch.save(state, tmp)


def load_checkpoint(path: str | os.PathLike, run_key: str) -> dict[str, Any]:
    """The state saved at `path`; a ConfigError when it was written by a run with another key."""
    state = torch.load(Path(path), map_location="cpu", weights_only=False)
    if state.get("run_key") != run_key:
        raise ConfigError(f"{path}: this checkpoint was written by a run with other settings (key {state.get('run_key')!r},"
                          f" now {run_key!r}); write to another output folder or delete it to start again")
    return state
