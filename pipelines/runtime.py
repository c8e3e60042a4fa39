"""Device, dtype and attention policy, accelerate state, reproducible per-item seeds, model loading: clear offline
errors, half-precision weight variants and the revision of what was loaded (for provenance).

`load_pretrained` is the one door every model, config and processor comes in by, and model folders come from
strangers: it never runs a folder's own code (`trust_remote_code=False` to every transformers and diffusers loader,
and a folder that would need its code, `custom_code_reason`, is refused in one line before the library is called, so
transformers never asks on stdin), and every safetensors file in the folder must pass
`pipelines.checkpoints.check_safetensors` first.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import random
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from pipelines.errors import ConfigError, UserInputError
from pipelines.io import open_regular

T = TypeVar("T")

PRECISIONS = ("auto", "bf16", "fp16", "fp32")
ATTENTION_BACKENDS = ("auto", "sdpa", "xformers")
HALF_DTYPES = (torch.float16, torch.bfloat16)
WEIGHT_SUFFIXES = ("safetensors", "bin")


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    """`device` if given, else the first CUDA device when present, else the CPU. A CPU device is always plain `cpu`:
    accelerate reports `cpu:0` under torchrun, and diffusers' SDXL prompt encoding returned other pooled embeddings on
    `cpu:0` than on `cpu`, so one- and multi-process runs would differ."""
    if device is not None:
        device = torch.device(device)
        return torch.device("cpu") if device.type == "cpu" else device
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
    if preferred not in ATTENTION_BACKENDS:
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


HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?$")
WEIGHT_FILE_SUFFIXES = tuple(f".{s}" for s in (*WEIGHT_SUFFIXES, "pt", "pth", "ckpt"))  # a local model folder holds one


def looks_local(path_or_id: str | os.PathLike) -> bool:
    """True for a value meant as a local path: it exists, or is not of a hub id's form (`org/name` or `name`), e.g.
    `runs/own/classifier`, `./model`, `~/m`, `/abs/path`; or it has a hub id's form `a/b` but `a` is a folder here
    and `a/b` is no model in the Hugging Face cache (`runs/x` after a typo, or before its training ran)."""
    text = str(path_or_id)
    if is_local(text) or text.startswith((".", "/", "~")) or not HUB_ID.match(text):
        return True
    owner, _, name = text.partition("/")
    return bool(name) and Path(owner).is_dir() and hub_commit(text) is None


def check_model_ref(value: str | None, key: str) -> None:
    """A `param(check=...)` for model fields: a hub id passes (it is looked up at load time); a local path must be
    a folder holding weight files (in it or one level down, as diffusers pipelines keep them) that passes
    `check_model_folder` (no code of its own, well-formed safetensors), else one ConfigError naming `key` (and never
    hub advice)."""
    if value is None or not looks_local(value):
        return
    folder = Path(value).expanduser()
    if not folder.exists():
        why = ""
        if HUB_ID.match(str(value)):  # of a hub id's form, read as a path because its first part is a folder here
            why = (f" (read as a path: the folder {str(value).partition('/')[0]!r} is here; a hub model of that name "
                   "is "
                   "read as one once it is in the Hugging Face cache)")
        raise ConfigError(f"{key}: the local model folder {value!r} does not exist{why}")
    if folder.is_file():
        return
    found = any(p.suffix in WEIGHT_FILE_SUFFIXES for pattern in ("*", "*/*") for p in folder.glob(pattern))
    if not found:
        raise ConfigError(f"{key}: the local model folder {value!r} holds no weight files "
                          f"({', '.join('*' + s for s in WEIGHT_FILE_SUFFIXES)})")
    check_safe_folder(folder, key)


def check_safe_folder(value: str | os.PathLike, key: str) -> None:
    """`check_model_folder` as a config check (one ConfigError naming `key`): the load's own checks, run when the
    config is read, so that a dry run refuses the folder too."""
    try:
        check_model_folder(value, "the model")
    except UserInputError as err:
        raise ConfigError(f"{key}: {err}") from None


DEVICE_FORM = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


def check_device(value: str | None, key: str) -> None:
    """A `param(check=...)` for device fields: null, `auto`, `cpu`, `cuda` or `cuda:N`, else one ConfigError naming
    `key`. `mps` is refused in its own words: several detectors (CLIP scores, WeBO, ASH, GRAM, MDS ensemble, the
    training losses' reductions) compute in float64 on the device, which MPS lacks, so a run there would fail part
    way; the CPU runs every path."""
    if value is not None and str(value).split(":")[0] == "mps":
        raise ConfigError(f"{key}: mps is not supported (several detectors compute in float64, which MPS lacks); "
                          "use cpu")
    if value is not None and not DEVICE_FORM.match(str(value)):
        raise ConfigError(f"{key}: must be cpu, cuda, cuda:N or auto (null: auto), got {value!r}")


def runtime_device(value: str | None) -> str | None:
    """A config's device as `resolve_device` takes it: `auto` and null are None (the first CUDA device, else CPU)."""
    return None if value in (None, "auto") else value
class ModelUnavailableError(UserInputError, OSError):
    """A hub model that is neither cached nor reachable: the user's setup, so one line (an OSError as before)."""


class CustomCodeRefused(ConfigError):
    """A model folder that needs its own Python code to load: refused, whatever the user or stdin says."""


CONFIG_FILE_LIMIT = 10_000_000  # bytes: a config file larger than this is not read by the custom-code check
_CLASS_FIELDS = ("image_processor_type", "feature_extractor_type", "processor_class", "tokenizer_class",
                 "video_processor_type")


def _native(config: dict[str, Any]) -> bool:
    """True when the libraries load what `config` describes with their own classes (its `auto_map` unused)."""
    if "_class_name" in config:  # diffusers' configs name their class
        import diffusers

        return isinstance(config["_class_name"], str) and hasattr(diffusers, config["_class_name"])
    import transformers

    if "model_type" in config:
        from transformers import CONFIG_MAPPING

        return config["model_type"] in CONFIG_MAPPING
    names = [config[key] for key in _CLASS_FIELDS if isinstance(config.get(key), str)]
    return bool(names) and all(hasattr(transformers, name.removesuffix("Fast")) for name in names)


def _config_files(folder: Path) -> list[Path]:
    """The JSON configuration files of a model folder and of its component subfolders (diffusers' layout)."""
    found = []
    for pattern in ("*.json", "*/*.json"):
        for path in sorted(folder.glob(pattern)):
            if ("config" in path.name or path.name == "model_index.json") and path.is_file():
                found.append(path)
    return found


def custom_code_reason(folder: str | os.PathLike) -> str | None:
    """Why loading the model folder would run code it ships (or load a model other than the one its author meant), None
    when it would not: a config with an `auto_map`, whether its class is one the libraries lack (an unknown
    `model_type`, image-processor or tokenizer class, or diffusers class) or one they implement (the folder's code would
    then be silently replaced by the library's class), or a diffusers pipeline (`model_index.json`) with a component
    from a library other than diffusers and transformers (its code would come from the folder)."""
    root = Path(folder)
    for path in _config_files(root):
        config = _read_config(path)
        if config is None:
            continue
        reason = _config_reason(path.relative_to(root).as_posix(), path.name, config)
        if reason is not None:
            return reason
    return None


def _read_config(path: Path) -> dict[str, Any] | None:
    """A config file's JSON object; None when it is too large, unreadable or not an object (the library reports an
    unreadable config in its own words)."""
    try:
        if path.stat().st_size > CONFIG_FILE_LIMIT:
            return None
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def _config_reason(name: str, file_name: str, config: dict[str, Any]) -> str | None:
    """`custom_code_reason` for one config file (`name`: its path in the folder)."""
    if "auto_map" in config:
        kind = f"model_type {config['model_type']!r}" if "model_type" in config else "classes"
        if not _native(config):
            return f"{name} maps its {kind} to Python code in the folder (auto_map {config['auto_map']!r:.120})"
        return (f"{name} maps its {kind} to Python code in the folder (auto_map {config['auto_map']!r:.120}), "
                "though the libraries implement it: its author meant that code to run, and another model is "
                f"never loaded in its place (remove `auto_map` from {name} to load it as the library's own)")
    if file_name == "model_index.json":
        if isinstance(config.get("_class_name"), str) and not _native({"_class_name": config["_class_name"]}):
            return f"{name}: the pipeline class {config['_class_name']!r} is not one of diffusers'"
        for key, value in config.items():
            if isinstance(value, list) and len(value) == 2 and value[0] not in (None, "diffusers", "transformers"):
                return f"{name}: component {key!r} comes from {value[0]!r}, code shipped with the folder"
    return None


def _model_folder(name_or_path: str | os.PathLike) -> Path | None:
    """The folder a load would read: the local folder, or the cached hub snapshot of a hub id (None: neither)."""
    if is_local(name_or_path):
        folder = Path(name_or_path).expanduser()
        return folder if folder.is_dir() else None
    return hub_snapshot(str(name_or_path)) if HUB_ID.match(str(name_or_path)) else None


def check_model_folder(name_or_path: str | os.PathLike, what: str = "model") -> None:
    """Every check `load_pretrained` makes before a library reads a model folder: no code of its own to run
    (`custom_code_reason`), every safetensors file well formed (`check_safetensors`); one error line otherwise."""
    from pipelines.checkpoints import check_safetensors

    if is_local(name_or_path) and Path(name_or_path).expanduser().suffix == ".safetensors":
        check_safetensors(Path(name_or_path).expanduser())  # a single-file checkpoint
    folder = _model_folder(name_or_path)
    if folder is None:
        return
    reason = custom_code_reason(folder)
    if reason is not None:
        raise CustomCodeRefused(f"could not load {what} from {str(name_or_path)!r}: {reason}; the project never runs "
                                "a model folder's own code (use a model transformers or diffusers implements)")
    for path in sorted(folder.rglob("*.safetensors")):
        check_safetensors(path)


def _remote_code_flag(loader: Callable[..., Any]) -> dict[str, bool]:
    """`{"trust_remote_code": False}` for the libraries' `from_pretrained` loaders (transformers asks on stdin
    without it; diffusers' pipelines take it too), `{}` for other callables."""
    module = getattr(loader, "__module__", "") or ""
    named = getattr(loader, "__name__", "") == "from_pretrained"
    return {"trust_remote_code": False} if named and module.split(".")[0] in ("transformers", "diffusers") else {}


def _remote_code_error(err: BaseException) -> bool:
    """True when a library refused a load because the model needs its own code (trust_remote_code is False)."""
    return "trust_remote_code" in str(err) or "custom code" in str(err)


def load_pretrained(loader: Callable[..., T], name_or_path: str | os.PathLike, what: str = "model", **kwargs: Any) -> T:
    """Call `loader(name_or_path, **kwargs)` (a `from_pretrained`) with `trust_remote_code=False`, after the folder's
    checks (`check_model_folder`); offline misses raise one clear error.

    The error names the hub id and says how to pass a local folder instead.
    """
    import pickle

    target = str(Path(name_or_path).expanduser()) if is_local(name_or_path) else str(name_or_path)
    check_model_folder(name_or_path, what)
    kwargs = {**kwargs, **_remote_code_flag(loader)}
    try:
        return loader(target, **kwargs)
    except (OSError, ValueError, pickle.UnpicklingError) as err:
        if _remote_code_error(err) and not isinstance(err, OSError):
            raise CustomCodeRefused(f"could not load {what} from {target!r}: it needs Python code of its own, and the "
                                    "project never runs a model's own code (use a model transformers or diffusers "
                                    "implements)") from err
        if _refused_pickle(err):  # transformers / diffusers read .bin files tensors-only: one line, no unsafe advice
            raise UserInputError(f"could not load {what} from {target!r}: a weight file in it holds pickled objects "
                                 "other than tensors and is refused (loading it could run code); re-save the weights "
                                 "as safetensors") from err
        if looks_local(name_or_path):
            first = " ".join(str(err).split())[:300]
            raise ConfigError(f"could not load {what} from the local folder {target!r}: {first}") from err
        raise ModelUnavailableError(
            f"could not load {what} {target!r}: it is neither a local folder nor in the Hugging Face cache, and the "
            "hub "
            f"could not be reached ({type(err).__name__}). Download it on a connected machine "
            f"(`huggingface-cli download {target} --local-dir DIR`) and pass DIR instead of the hub id."
        ) from err
    except Exception as err:
        if type(err).__name__ != "SafetensorError":  # safetensors' own error type derives from Exception only
            raise
        raise ConfigError(f"could not load {what} from {target!r}: a weight file is not a readable safetensors file "
                          f"({' '.join(str(err).split())[:200]})") from err


def _refused_pickle(err: BaseException | None) -> bool:
    """True when `err` or an error it was raised from is a refused (non-tensor) pickle."""
    import pickle

    seen = 0
    while err is not None and seen < 10:
        if isinstance(err, pickle.UnpicklingError):
            return True
        err, seen = err.__cause__ or err.__context__, seen + 1
    return False


def list_model_files(name_or_path: str | os.PathLike) -> list[str]:
    """Relative file paths of a local folder, or of a hub repo: its cached snapshot when there is one (so what is
    already downloaded is used as is, without a network call), else the hub's listing, else [] (nothing known: no
    variant is asked for)."""
    if is_local(name_or_path):
        root = Path(name_or_path).expanduser()
        return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()) if root.is_dir() else []
    snapshot = hub_snapshot(str(name_or_path))
    if snapshot is not None:
        return sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file())
    try:
        from huggingface_hub import HfApi

        return sorted(HfApi().list_repo_files(str(name_or_path)))
    except Exception:  # offline, unknown repo, no network: no variant
        return []


def has_variant(files: Iterable[str], variant: str, subfolder: str | None = None) -> bool:
    """True when a weight file named in diffusers' variant scheme (`<name>.<variant>.safetensors`, sharded
    `<name>.<variant>-00001-of-00002.safetensors` or legacy `<name>-00001-of-00002.<variant>.bin`) is among `files`
    (below `subfolder` when given)."""
    suffix = "|".join(WEIGHT_SUFFIXES)
    pattern = re.compile(rf"(\.{re.escape(variant)}(-\d+-of-\d+)?|-\d+-of-\d+\.{re.escape(variant)})\.({suffix})$")
    prefix = (subfolder.strip("/") + "/") if subfolder else ""
    return any(f.startswith(prefix) and pattern.search(f.rsplit("/", 1)[-1]) for f in files)


def select_variant(name_or_path: str | os.PathLike, dtype: torch.dtype, variant: str = "fp16",
                   subfolder: str | None = None, files: Iterable[str] | None = None) -> str | None:
    """The weight `variant` to load for `dtype`: `variant` when the dtype is half precision (fp16 or bf16: half the
    download, cast once) and the repo or folder ships such files, else None (full-precision files; a local folder
    without variant files loads as is). `files` replaces the listing (`list_model_files`)."""
    if dtype not in HALF_DTYPES:
        return None
    listing = list_model_files(name_or_path) if files is None else list(files)
    return variant if has_variant(listing, variant, subfolder) else None


def hub_snapshot(repo_id: str, revision: str = "main") -> Path | None:
    """The cached snapshot folder of a hub model repo (`<HF_HUB_CACHE>/models--org--name/snapshots/<commit>`), or
    None."""
    commit = hub_commit(repo_id, revision)
    if commit is None:
        return None
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    folder = Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo_id, repo_type="model") / "snapshots" / commit
    return folder if folder.is_dir() else None


def hub_commit(repo_id: str, revision: str = "main") -> str | None:
    """The commit hash the hub cache resolves `revision` of `repo_id` to (its `refs/<revision>` file), or None."""
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    if re.fullmatch(r"[0-9a-f]{40}", revision):
        return revision
    try:
        ref = Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo_id, repo_type="model") / "refs" / revision
        return ref.read_text(encoding="utf-8").strip() or None
    except (OSError, ValueError):
        return None


def folder_hash(folder: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """A content fingerprint of a local model folder: every file's relative path and size, the whole content of
    files up to `chunk` bytes (configs, tokenizers) and the first and last `chunk` bytes of larger ones (weights), so
    hashing a multi-GB checkpoint reads a few MB per file. `sha256:<16 hex>`."""
    root = Path(folder).expanduser()
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    digest = hashlib.sha256()
    for path in files:
        size = path.stat().st_size
        digest.update(f"{path.relative_to(root).as_posix() if path != root else path.name}\0{size}\0".encode())
        with open_regular(path) as fh:  # a FIFO swapped in after the listing is refused, never read
            digest.update(fh.read(chunk))
            if size > 2 * chunk:
                fh.seek(size - chunk)
            digest.update(fh.read(chunk))
    return "sha256:" + digest.hexdigest()[:16]


def model_revision(name_or_path: str | os.PathLike | None) -> str | None:
    """What identifies loaded weights in provenance: the hub commit from the cache for a hub id, `folder_hash` for a
    local folder, None when unknown (or no model)."""
    if name_or_path is None:
        return None
    if is_local(name_or_path):
        return folder_hash(name_or_path)
    return hub_commit(str(name_or_path))
