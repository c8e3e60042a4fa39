"""The real hub configuration files of every default model id, kept in the repository (configuration values only,
never weights), and the comparison that proves a stand-in differs from them in size fields only.

The files live in `pipelines/hub_configs/<org>/<name>/` (one `SOURCE.md` per model says where each was copied from)
and ship with the package (package data), so `models: tiny` and `make demo` work in an installed package too.
`pipelines.tiny` builds every stand-in from these files; `config_diff` is what the tests use to check a saved
stand-in against the real configuration: both sides go through the library's own config classes (so defaults and
legacy keys are resolved the same way the real checkpoint's are), metadata keys are dropped, and the leaves that differ
are returned as dotted paths.
"""
from __future__ import annotations

import copy
import inspect
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

FIXTURES_ENV = "OODFORGE_HUB_FIXTURES"
# The only fields a stand-in may change: widths, depths, head counts, channels, spatial and vocabulary sizes.
SIZE_FIELDS = frozenset({
    "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "projection_dim", "vocab_size",
    "block_out_channels", "attention_head_dim", "transformer_layers_per_block", "cross_attention_dim",
    "addition_time_embed_dim", "projection_class_embeddings_input_dim", "sample_size", "image_size", "patch_size",
    "neck_hidden_sizes", "fusion_hidden_size", "backbone_featmap_shape", "pooler_output_size", "hidden_sizes",
    "embedding_size", "depths", "num_groups", "size", "crop_size",
})
# Image-processor fields whose value is a dict of sizes (reported whole by `config_diff`).
SIZE_DICT_FIELDS = frozenset({"size", "crop_size"})

# Written by the libraries, never a property of the model.
METADATA_KEYS = frozenset({
    "_diffusers_version", "transformers_version", "_name_or_path", "name_or_path", "torch_dtype", "dtype",
    "_commit_hash", "_use_default_values", "special_tokens_map_file", "feature_extractor_type",
    "image_processor_type", "processor_class", "_processor_class",
})


PACKAGED_CONFIGS = Path(__file__).resolve().parent / "hub_configs"


def fixtures_root() -> Path:
    """The folder of the real hub configs: `$OODFORGE_HUB_FIXTURES`, else the package's own `pipelines/hub_configs`."""
    root = Path(os.environ.get(FIXTURES_ENV) or PACKAGED_CONFIGS)
    if not root.is_dir():
        raise FileNotFoundError(f"hub configs not found at {root}: the tiny stand-ins are built from the real configs "
                                f"shipped in pipelines/hub_configs (docs/hub.md); unset {FIXTURES_ENV} or reinstall")
    return root


def model_dir(model_id: str) -> Path:
    """`pipelines/hub_configs/<org>/<name>` of a hub model id."""
    folder = fixtures_root() / model_id
    if not folder.is_dir():
        raise FileNotFoundError(f"no real hub config kept for {model_id!r} (expected {folder})")
    return folder


def real_config(model_id: str, file: str = "config.json") -> dict[str, Any]:
    """The real configuration file `file` of `model_id` as a dict."""
    path = model_dir(model_id) / file
    if not path.is_file():
        raise FileNotFoundError(f"{model_id!r} has no kept config file {file!r} (expected {path})")
    return json.loads(path.read_text(encoding="utf-8"))


def set_dotted(config: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of `config` with `{"a.b": v}` overrides applied (`a` must exist and be a dict)."""
    out = copy.deepcopy(config)
    for dotted, value in overrides.items():
        *parents, leaf = dotted.split(".")
        node = out
        for key in parents:
            if not isinstance(node.get(key), dict):
                raise KeyError(f"override {dotted!r}: {key!r} is not a section of the config")
            node = node[key]
        node[leaf] = copy.deepcopy(value)
    return out


# -- effective configurations ------------------------------------------------------------------------------
def plain(value: Any) -> Any:
    """Tuples as lists, recursively (JSON has only lists)."""
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def _diffusers_effective(config: Mapping[str, Any]) -> dict[str, Any]:
    import diffusers

    cls = getattr(diffusers, config["_class_name"])
    params = inspect.signature(cls.__init__).parameters
    out = {name: p.default for name, p in params.items()
           if name not in ("self", "kwargs") and p.default is not inspect.Parameter.empty}
    out.update({k: v for k, v in config.items() if k in params})
    out["_class_name"] = config["_class_name"]
    return plain(out)


def _transformers_effective(config: Mapping[str, Any]) -> dict[str, Any]:
    from transformers import CONFIG_MAPPING

    return plain(CONFIG_MAPPING[config["model_type"]].from_dict(dict(config)).to_dict())


def _image_processor_effective(config: Mapping[str, Any], cls_name: str) -> dict[str, Any]:
    import transformers

    return plain(getattr(transformers, cls_name).from_dict(dict(config)).to_dict())


def _token(value: Any) -> Any:
    return value.get("content") if isinstance(value, dict) else value


def _tokenizer_effective(config: Mapping[str, Any], special: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What decides tokenization: special tokens (content), maximum length, lower-casing, class.
    `special_tokens_map.json` wins over `tokenizer_config.json`, as in transformers' loader (SD 2.x pads with "!")."""
    merged = {**config, **(special or {})}
    return {key: _token(merged.get(key)) for key in ("bos_token", "eos_token", "pad_token", "unk_token")} | {
        "model_max_length": merged.get("model_max_length"), "do_lower_case": merged.get("do_lower_case", True),
        "tokenizer_class": merged.get("tokenizer_class")}


def _model_index_effective(config: Mapping[str, Any]) -> dict[str, Any]:
    """Components (absent ones, `[null, null]`, dropped) and pipeline flags."""
    return plain({k: v for k, v in config.items() if v != [None, None] and v != (None, None)})


def effective_config(kind: str, config: Mapping[str, Any], special: Mapping[str, Any] | None = None,
                     cls_name: str | None = None) -> dict[str, Any]:
    """The configuration a library actually uses, metadata removed. `kind`: diffusers (models and schedulers),
    transformers, image_processor (`cls_name` = the processor class), tokenizer (`special` = special_tokens_map),
    pipeline."""
    if kind == "diffusers":
        out = _diffusers_effective(config)
    elif kind == "transformers":
        out = _transformers_effective(config)
    elif kind == "image_processor":
        out = _image_processor_effective(config, cls_name or "CLIPImageProcessor")
    elif kind == "tokenizer":
        out = _tokenizer_effective(config, special)
    elif kind == "pipeline":
        out = _model_index_effective(config)
    else:
        raise ValueError(f"unknown config kind {kind!r}")
    return _strip_metadata(out)


def _strip_metadata(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_metadata(v) for k, v in value.items() if k not in METADATA_KEYS}
    return value


def leaves(value: Any, prefix: str = "") -> dict[str, Any]:
    """`{dotted path: value}` of the non-dict leaves of a nested config."""
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for key, sub in value.items():
            out.update(leaves(sub, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: value}


def config_diff(real: Mapping[str, Any], other: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """`{dotted path: (real value, other value)}` for every leaf that differs (a missing leaf counts as None).
    Image-processor size dicts (`size`, `crop_size`) are reported whole, under their own name."""
    a, b = leaves(real), leaves(other)
    out: dict[str, tuple[Any, Any]] = {}
    for key in sorted(set(a) | set(b)):
        if a.get(key) == b.get(key):
            continue
        top = key.split(".")[0]
        if top in SIZE_DICT_FIELDS and isinstance(real.get(top), dict):
            out[top] = (real.get(top), other.get(top))
        else:
            out[key] = (a.get(key), b.get(key))
    return out



# Deprecated or backend-specific class names that load the same thing.
CLASS_ALIASES = {"CLIPFeatureExtractor": "CLIPImageProcessor", "CLIPImageProcessorPil": "CLIPImageProcessor",
                 "DPTImageProcessorPil": "DPTImageProcessor", "ConvNextImageProcessorPil": "ConvNextImageProcessor",
                 "CLIPTokenizerFast": "CLIPTokenizer"}


def kind_of(file: str, config: Mapping[str, Any]) -> str:
    """The `effective_config` kind of a hub config file."""
    name = Path(file).name
    if name == "model_index.json":
        return "pipeline"
    if name == "tokenizer_config.json":
        return "tokenizer"
    if name == "preprocessor_config.json":
        return "image_processor"
    return "diffusers" if "_class_name" in config else "transformers"


def image_processor_class(config: Mapping[str, Any]) -> str:
    """The image-processor class a preprocessor config names (old `feature_extractor_type` names mapped)."""
    name = config.get("image_processor_type") or config.get("feature_extractor_type") or "CLIPImageProcessor"
    name = name.replace("FeatureExtractor", "ImageProcessor")
    return CLASS_ALIASES.get(name, name)


def real_effective(model_id: str, file: str) -> dict[str, Any]:
    """The effective config of a kept real config file."""
    config = real_config(model_id, file)
    kind = kind_of(file, config)
    special = None
    if kind == "tokenizer":
        special_file = str(Path(file).with_name("special_tokens_map.json"))
        special = real_config(model_id, special_file) if (model_dir(model_id) / special_file).is_file() else None
    cls = image_processor_class(config) if kind == "image_processor" else None
    return _aliased(effective_config(kind, config, special, cls))


def saved_effective(path: str | os.PathLike, kind: str, cls_name: str | None = None) -> dict[str, Any]:
    """The effective config of a stand-in's saved file at `path` (a tokenizer is loaded from its folder)."""
    path = Path(path)
    if kind == "tokenizer":
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path.parent, trust_remote_code=False)  # never a folder's code
        saved = json.loads(path.read_text(encoding="utf-8"))
        config = {key: str(getattr(tokenizer, key)) for key in ("bos_token", "eos_token", "pad_token", "unk_token")}
        config.update(model_max_length=tokenizer.model_max_length, do_lower_case=saved.get("do_lower_case", True),
                      tokenizer_class=type(tokenizer).__name__)
        return _aliased(effective_config(kind, config))
    if kind == "image_processor" and not path.is_file() and (path.parent / "processor_config.json").is_file():
        # transformers 5 saves a processor's image-processor settings inside processor_config.json
        config = json.loads((path.parent / "processor_config.json").read_text(encoding="utf-8"))["image_processor"]
    else:
        config = json.loads(path.read_text(encoding="utf-8"))
    return _aliased(effective_config(kind, config, cls_name=cls_name))


def _aliased(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _aliased(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_aliased(v) for v in value]
    return CLASS_ALIASES.get(value, value) if isinstance(value, str) else value
