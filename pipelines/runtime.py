"""Device, dtype and attention policy, accelerate state, reproducible per-item seeds, model loading errors."""
from __future__ import annotations

import hashlib
import importlib.util
import os
import random
from pathlib import Path
from typing import Any, Callable, TypeVar

import numpy as np
import torch

T = TypeVar("T")

PRECISIONS = ("auto", "bf16", "fp16", "fp32")


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    """`device` if given, else the first CUDA device when present, else the CPU."""
    if device is not None:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def resolve_dtype(precision: str = "auto", device: str | torch.device | None = None) -> torch.dtype:
    """Dtype policy: `auto` is bf16 on a GPU that supports it (else fp16) and fp32 on the CPU."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    device = resolve_device(device)
    if precision == "fp32":
        return torch.float32
    if precision == "bf16":
        return torch.bfloat16
    if precision == "fp16":
        return torch.float16
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


def xformers_available() -> bool:
    """True when xformers is importable and a CUDA device is present (it has no CPU kernels)."""
    return torch.cuda.is_available() and importlib.util.find_spec("xformers") is not None


def attention_backend(preferred: str = "auto") -> str:
    """`xformers` when requested or available on GPU, else PyTorch scaled-dot-product attention (`sdpa`)."""
    if preferred not in ("auto", "xformers", "sdpa"):
        raise ValueError(f"attention backend must be auto, xformers or sdpa, got {preferred!r}")
    if preferred == "xformers" and not xformers_available():
        raise RuntimeError("attention='xformers' needs the xformers package and a CUDA device")
    if preferred == "auto":
        return "xformers" if xformers_available() else "sdpa"
    return preferred


def enable_attention(model: Any, preferred: str = "auto") -> str:
    """Switch a diffusers model or pipeline to the chosen attention backend; returns the backend used."""
    backend = attention_backend(preferred)
    if backend == "xformers" and hasattr(model, "enable_xformers_memory_efficient_attention"):
        model.enable_xformers_memory_efficient_attention()
    return backend


def partial_state(cpu: bool | None = None):
    """The accelerate `PartialState` (one per process); `cpu=True` forces CPU (e.g. torchrun on CPU)."""
    from accelerate import PartialState

    if cpu is None:
        cpu = not torch.cuda.is_available()
    return PartialState(cpu=cpu)


def item_seed(base_seed: int, key: int | str) -> int:
    """A 63-bit seed derived from the job seed and an item's global index or id (independent of process count)."""
    digest = hashlib.sha256(f"{int(base_seed)}:{key}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def item_generator(seed: int, device: str | torch.device = "cpu") -> torch.Generator:
    """A torch generator on `device` seeded with `seed`."""
    return torch.Generator(device=torch.device(device)).manual_seed(int(seed))


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def diffusers_dtype(dtype: torch.dtype) -> dict[str, torch.dtype]:
    """The dtype keyword of diffusers' `from_pretrained`: `dtype` from 0.42 on (which deprecates `torch_dtype`)."""
    from importlib.metadata import version

    major, minor = (int(part) for part in version("diffusers").split(".")[:2])
    return {"dtype": dtype} if (major, minor) >= (0, 42) else {"torch_dtype": dtype}


def is_local(path_or_id: str | os.PathLike) -> bool:
    """True when the argument names an existing local folder or file."""
    return Path(path_or_id).expanduser().exists()


def load_pretrained(loader: Callable[..., T], name_or_path: str | os.PathLike, what: str = "model", **kwargs: Any) -> T:
    """Call `loader(name_or_path, **kwargs)` (a `from_pretrained`); offline misses raise one clear error.

    The error names the hub id and says how to pass a local folder instead.
    """
    target = str(Path(name_or_path).expanduser()) if is_local(name_or_path) else str(name_or_path)
    try:
        return loader(target, **kwargs)
    except (OSError, ValueError) as err:
        if is_local(name_or_path):
            raise OSError(f"could not load {what} from local folder {target!r}: {err}") from err
        raise OSError(
            f"could not load {what} {target!r}: it is neither a local folder nor in the Hugging Face cache, and the hub "
            f"could not be reached ({type(err).__name__}). Download it on a connected machine "
            f"(`huggingface-cli download {target} --local-dir DIR`) and pass DIR instead of the hub id."
        ) from err
