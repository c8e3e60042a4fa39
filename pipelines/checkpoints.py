"""Per-epoch training checkpoints: everything the shared loop needs to continue a killed run where it stopped, stored
without pickles.

One safetensors file (written atomically) holds every tensor of the state: the model + objective weights, the
optimiser's moments, the global torch (and CUDA) RNG and the data loaders' shuffling generators; its metadata holds
the rest as JSON: the epochs done, the run's history, the schedule, the optimiser's settings and the objective's plain
Python attributes (margins, lambda schedules, cluster tables), with placeholders naming the tensors. Reading one
parses JSON and tensors only, so a planted file cannot run code: a file that is not such a checkpoint (a pickle, a
truncated write, another format) is ignored with one warning line and overwritten, like one with another `key` (the
caller's content key of what the run trains).

`safe_torch_load` is the one way the project reads a `.pt`/`.bin` file it did not write: tensors only
(`weights_only=True`), and a file holding anything else is one `UserInputError` line naming it.

`check_safetensors` is what every safetensors read does first (here, in `pipelines.runtime.load_pretrained` for the
libraries' own loads, and in detectors' `from_pretrained`): the header a file declares must fit in the file and in
safetensors' own 100 MB limit, be a JSON object, and every tensor's byte range must lie in the file; else one
`UnsafeFileError` line naming the file (safetensors itself answers a 2^62-byte header with a traceback). Only regular
files are opened (`pipelines.io.open_regular`).
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from pipelines.errors import UserInputError
from pipelines.io import atomic_path, open_regular

log = logging.getLogger(__name__)

FORMAT = "oodforge-train-checkpoint-v2"
_TENSOR, _ARRAY, _TUPLE, _ITEMS = "$tensor", "$array", "$tuple", "$items"
_MARKS = (_TENSOR, _ARRAY, _TUPLE, _ITEMS)


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


# -- a state tree as JSON + named tensors --------------------------------------------------------------------------
def encode_tree(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """`obj` (dicts, lists, tuples, scalars, strings, None, tensors, numpy arrays) as JSON-ready values; every tensor
    goes into `tensors` under a new name and is replaced by a placeholder. Anything else is a TypeError."""
    if isinstance(obj, np.generic):
        obj = obj.item()
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, torch.Tensor):
        name = f"t{len(tensors)}"
        tensors[name] = obj.detach().to("cpu", copy=True).contiguous()  # a copy: shared storage is saved twice
        return {_TENSOR: name}
    if isinstance(obj, np.ndarray):
        if obj.dtype == object:
            raise TypeError("a checkpoint holds numeric arrays only, not object arrays")
        return {_ARRAY: encode_tree(torch.from_numpy(np.ascontiguousarray(obj)), tensors)[_TENSOR]}
    if isinstance(obj, tuple):
        return {_TUPLE: [encode_tree(v, tensors) for v in obj]}
    if isinstance(obj, list):
        return [encode_tree(v, tensors) for v in obj]
    if isinstance(obj, dict):
        if all(isinstance(k, str) and k not in _MARKS for k in obj):
            return {k: encode_tree(v, tensors) for k, v in obj.items()}
        return {_ITEMS: [[encode_tree(k, tensors), encode_tree(v, tensors)] for k, v in obj.items()]}
    raise TypeError(f"a checkpoint cannot hold a {type(obj).__name__} (plain values, tensors and arrays only)")


def decode_tree(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """The inverse of `encode_tree`: placeholders back to the named tensors (numpy arrays where they were)."""
    if isinstance(obj, list):
        return [decode_tree(v, tensors) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if _TENSOR in obj:
        return tensors[obj[_TENSOR]]
    if _ARRAY in obj:
        return tensors[obj[_ARRAY]].numpy()
    if _TUPLE in obj:
        return tuple(decode_tree(v, tensors) for v in obj[_TUPLE])
    if _ITEMS in obj:
        return {_hashable(decode_tree(k, tensors)): decode_tree(v, tensors) for k, v in obj[_ITEMS]}
    return {k: decode_tree(v, tensors) for k, v in obj.items()}


def _hashable(key: Any) -> Any:
    return tuple(_hashable(k) for k in key) if isinstance(key, (list, tuple)) else key


SAFETENSORS_HEADER_LIMIT = 100_000_000  # bytes: safetensors' own limit on a header (its MAX_HEADER_SIZE)


class UnsafeFileError(UserInputError):
    """A weight or cache file that is not what it claims to be (a safetensors header that does not fit its file)."""


def check_safetensors(path: str | os.PathLike) -> None:
    """Refuse, in one `UnsafeFileError` line naming `path`, a file that is not a well-formed safetensors file: a
    non-regular file, one shorter than its 8-byte header length, a declared header larger than the file or than
    `SAFETENSORS_HEADER_LIMIT`, a header that is not a JSON object, or a tensor whose byte range leaves the file."""
    def refuse(reason: str) -> UnsafeFileError:
        return UnsafeFileError(f"{os.fspath(path)}: not a readable safetensors file ({reason}); refused")

    try:
        with open_regular(path) as fh:
            size = os.fstat(fh.fileno()).st_size
            prefix = fh.read(8)
            if len(prefix) < 8:
                raise refuse(f"{size} bytes, shorter than the 8-byte header length")
            length = int.from_bytes(prefix, "little")
            if length > min(size - 8, SAFETENSORS_HEADER_LIMIT):
                limit = "the file's" if length > size - 8 else "safetensors' limit of"
                raise refuse(f"it declares a {length}-byte header, more than {limit} "
                             f"{min(size - 8, SAFETENSORS_HEADER_LIMIT)} bytes")
            raw = fh.read(length)
    except OSError as err:
        raise refuse(err.strerror or type(err).__name__) from None
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise refuse("its header is not JSON") from None
    if not isinstance(header, dict):
        raise refuse("its header is not a JSON object")
    data = size - 8 - length
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(isinstance(o, int) for o in offsets)
                or not 0 <= offsets[0] <= offsets[1] <= data):
            raise refuse(f"tensor {name!r} has data_offsets {offsets!r} outside its {data} data bytes")


def save_tree(path: str | os.PathLike, tree: Any, metadata: dict[str, str]) -> None:
    """Write `tree` atomically as one safetensors file: its tensors, and the rest as JSON in the metadata (`tree`)."""
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    encoded = json.dumps(encode_tree(tree, tensors))
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata={**metadata, "tree": encoded})


def read_metadata(path: str | os.PathLike) -> dict[str, str] | None:
    """The metadata of a safetensors file (its header only), None when the file is not a readable safetensors file."""
    from safetensors import safe_open

    try:
        check_safetensors(path)
        with safe_open(str(path), framework="pt") as handle:
            return dict(handle.metadata() or {})
    except Exception:  # noqa: BLE001 - safetensors raises its own error (or OSError) for anything else
        return None


def load_tree(path: str | os.PathLike) -> Any:
    """The tree `save_tree` wrote (JSON and tensors only: nothing in the file is executed)."""
    from safetensors.torch import load_file

    check_safetensors(path)
    meta = read_metadata(path)
    if meta is None or "tree" not in meta:
        raise ValueError(f"{path}: not a checkpoint written by save_tree")
    return decode_tree(json.loads(meta["tree"]), load_file(str(path)))


# -- training checkpoints ------------------------------------------------------------------------------------------
def save_checkpoint(path: str | os.PathLike, key: str, epoch: int, module: nn.Module, objective: nn.Module,
                    optimizer: Any, scheduler: Any, result: Any, generators: list[torch.Generator | None]) -> None:
    """Write the state after `epoch` epochs (atomic: a reader sees the previous file or this one, never a part)."""
    state = {
        "epoch": epoch, "module": module.state_dict(), "objective": _plain_attributes(objective),
        "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "history": result.history,
        "lrs": torch.tensor(result.lrs, dtype=torch.float64), "steps": result.steps, "seconds": result.seconds,
        "torch_rng": torch.get_rng_state(), "generators": [None if g is None else g.get_state() for g in generators],
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }
    save_tree(path, state, {"format": FORMAT, "key": key, "epoch": str(epoch)})


def checkpoint_matches(path: str | os.PathLike, key: str) -> bool:
    """True when `path` is a checkpoint of this format for `key` (its header alone is read). A file there that is not
    one is reported in one warning line."""
    path = Path(path)
    if not path.is_file():
        return False
    meta = read_metadata(path)
    if meta is None or meta.get("format") != FORMAT:
        log.warning("[oodforge] ignoring %s: not an oodforge training checkpoint (%s); it will be overwritten", path,
                    FORMAT)
        return False
    return meta.get("key") == key


def checkpoint_epoch(path: str | os.PathLike, key: str) -> int:
    """Epochs a checkpoint of this format for `key` has done (its header alone is read, silently: the run's resume
    reports a foreign file); 0 without one."""
    meta = read_metadata(path) if Path(path).is_file() else None
    if meta is None or meta.get("format") != FORMAT or meta.get("key") != key:
        return 0
    return int(meta.get("epoch", 0))


def load_checkpoint(path: str | os.PathLike, key: str, module: nn.Module, objective: nn.Module, optimizer: Any,
                    scheduler: Any, result: Any, generators: list[torch.Generator | None]) -> int:
    """Restore a matching checkpoint into the given objects; return the number of epochs it had done (0: none)."""
    if not checkpoint_matches(path, key):
        return 0
    state = load_tree(path)
    module.load_state_dict(state["module"])
    for name, value in state["objective"].items():
        setattr(objective, name, value)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    result.history, result.lrs, result.steps = list(state["history"]), state["lrs"].tolist(), int(state["steps"])
    result.seconds = float(state["seconds"])
    torch.set_rng_state(state["torch_rng"])
    if (state.get("cuda_rng") is not None and torch.cuda.is_available()
            and len(state["cuda_rng"]) == torch.cuda.device_count()):
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    for gen, saved in zip(generators, state["generators"]):
        if gen is not None and saved is not None:
            gen.set_state(saved)
    return int(state["epoch"])


def safe_torch_load(path: str | os.PathLike, what: str = "checkpoint") -> Any:
    """`torch.load` of a file from elsewhere with tensors and plain containers only (`weights_only=True`); a file
    holding anything else (pickled code or objects) is one UserInputError line naming it, never run."""
    import pickle

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        raise UserInputError(unsafe_pickle_message(path, what)) from err


def unsafe_pickle_message(path: str | os.PathLike, what: str) -> str:
    """The one line for a weight file refused because it holds more than tensors."""
    return (f"{what} {os.fspath(path)!r} holds pickled objects other than tensors and is refused (loading it could run "
            "code); re-save its tensors as safetensors or a tensors-only state dict")


# -- the best epoch's weights (beside the per-epoch checkpoint) ------------------------------------------------------
BEST_FORMAT = "oodforge-best-weights-v1"


def best_path(checkpoint: str | os.PathLike) -> Path:
    """Where the best epoch's weights of a run checkpointed at `checkpoint` are kept: `<stem>.best<suffix>` beside
    it."""
    checkpoint = Path(checkpoint)
    return checkpoint.with_name(f"{checkpoint.stem}.best{checkpoint.suffix}")


def save_best(path: str | os.PathLike, key: str, epoch: int, module: nn.Module, objective: nn.Module,
              metrics: dict[str, Any]) -> None:
    """Write the weights after `epoch` epochs (model + objective state and the objective's plain attributes) and that
    epoch's validation entry, atomically, as one safetensors file (no pickle)."""
    state = {"epoch": epoch, "module": module.state_dict(), "objective": _plain_attributes(objective),
             "metrics": metrics}
    save_tree(path, state, {"format": BEST_FORMAT, "key": key, "epoch": str(epoch)})


def best_epoch_saved(path: str | os.PathLike, key: str) -> int:
    """The epoch whose weights `path` holds for the run `key` (its header alone is read); 0 without such a file."""
    meta = read_metadata(path) if Path(path).is_file() else None
    if meta is None or meta.get("format") != BEST_FORMAT or meta.get("key") != key:
        return 0
    return int(meta.get("epoch", 0))


def load_best(path: str | os.PathLike, key: str, module: nn.Module, objective: nn.Module) -> int:
    """Load what `save_best` wrote for the run `key` into `module` (its state dict) and `objective` (its plain
    attributes); return the epoch. A file of another run or format is a ValueError naming it."""
    if not best_epoch_saved(path, key):
        raise ValueError(f"{path}: no best-epoch weights of this run ({BEST_FORMAT}, its key)")
    state = load_tree(path)
    module.load_state_dict(state["module"])
    for name, value in state["objective"].items():
        setattr(objective, name, value)
    return int(state["epoch"])


def checkpoint_history(path: str | os.PathLike, key: str) -> list[dict[str, Any]] | None:
    """The per-epoch history a training checkpoint of this format for `key` holds, read from its JSON header (no
    tensor is loaded); None without one."""
    meta = read_metadata(path) if Path(path).is_file() else None
    if meta is None or meta.get("format") != FORMAT or meta.get("key") != key or "tree" not in meta:
        return None
    history = json.loads(meta["tree"]).get("history")
    return history if isinstance(history, list) else None


# -- which weights a trained model folder holds (`checkpoints.json`) ------------------------------------------------
CHECKPOINT_INDEX = "checkpoints.json"
INDEX_FORMAT = "oodforge-checkpoints-v1"


def write_checkpoint_index(folder: str | os.PathLike, entries: dict[str, dict[str, Any] | None], rule: str) -> None:
    """`folder/checkpoints.json`: per checkpoint name (`last`, `best`) the sub-folder holding its model (`.`: the
    folder itself), its epoch and validation accuracy, or None where the run kept none; `rule` says how `best` chose."""
    from pipelines.io import atomic_write_json

    atomic_write_json(Path(folder) / CHECKPOINT_INDEX, {"format": INDEX_FORMAT, "rule": rule, **entries})


def read_checkpoint_index(folder: str | os.PathLike) -> dict[str, Any] | None:
    """The `checkpoints.json` of a model folder; None for a hub id, a file or a folder without one. A file that is
    not such an index is a UserInputError naming it."""
    path = Path(folder) / CHECKPOINT_INDEX
    if not path.is_file():
        return None
    try:
        index = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise UserInputError(f"{path}: not readable as JSON ({err})") from None
    if not isinstance(index, dict) or index.get("format") != INDEX_FORMAT:
        raise UserInputError(f"{path}: not an oodforge checkpoint index ({INDEX_FORMAT})")
    return index


def checkpoint_folder(model: str | os.PathLike, name: str) -> Path | None:
    """The model folder of checkpoint `name` of a trained model folder (its `checkpoints.json`), None where the run
    kept none. The index's sub-folder must lie inside `model` and hold a config.json (a planted index cannot point
    elsewhere): otherwise a UserInputError naming the file."""
    index = read_checkpoint_index(model)
    entry = None if index is None else index.get(name)
    if entry is None:
        return None
    root = Path(model).resolve()
    where = entry.get("folder") if isinstance(entry, dict) else None
    target = (root / where).resolve() if isinstance(where, str) else None
    if target is None or not target.is_relative_to(root) or not (target / "config.json").is_file():
        raise UserInputError(f"{Path(model) / CHECKPOINT_INDEX}: checkpoint {name!r} names {where!r}, not a model "
                             "folder "
                             f"inside {model}")
    return target
