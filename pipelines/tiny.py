"""Tiny random-weight stand-ins of the real models, saved with `save_pretrained` in the real folder layouts.

Each stand-in is its model id's real hub configuration (kept in `tests/fixtures/hub/`, see `pipelines.hub`) with
only the size fields listed in `TINY` shrunk, so the real checkpoints' quirks (CLIP's config eos id 2, scheduler
flags, activation and norm types, block types) reach every test. Tests, the demo and CPU benchmarks build these once,
save them and load them back through the same `from_pretrained` code paths users run with hub ids; no weights are
ever downloaded. `size="full"` builds use the real configs unchanged (random weights, for the GPU benchmark).
"""
from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator

import torch

DEFAULT_VOCAB_WORDS = (
    "a", "photo", "of", "the", "best", "quality", "high", "monochrome", "lowres", "bad", "anatomy", "worst", "low",
    "bronze", "container", "vessel", "moth", "insect", "bird", "dog", "cat", "no", "not", "this", "is",
)
TOKENIZER_MAX_LENGTH = 77
BOS_TOKEN = "<|startoftext|>"
EOS_TOKEN = "<|endoftext|>"


def _byte_symbols() -> list[str]:
    """The 256 printable characters GPT-2/CLIP byte-level BPE uses for the bytes 0..255, in CLIP's vocabulary order:
    the printable bytes first ('!' = id 0, '"' = 1, '#' = 2, ...), then the remapped ones (chr(256), chr(257), ...)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    remapped = [256 + n for n in range(256 - len(printable))]
    return [chr(c) for c in printable + remapped]


def _word_merges(words: Iterable[str]) -> list[tuple[str, str]]:
    """Left-to-right merges that assemble each (lower-case ASCII) word into one `word</w>` token."""
    merges: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()
    for word in words:
        word = word.lower()
        if not word.isascii() or not word.isalpha() or len(word) < 2:
            continue
        pieces = list(word[:-1]) + [word[-1] + "</w>"]
        merged = pieces[0]
        for piece in pieces[1:]:
            pair = (merged, piece)
            if pair not in seen:
                seen.add(pair)
                merges.append(pair)
            merged += piece
    return merges


def tiny_tokenizer_vocab(vocab_words: Iterable[str] = DEFAULT_VOCAB_WORDS) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Vocabulary and merges of a byte-level CLIP BPE: bytes, bytes + `</w>`, merged words, then BOS and EOS last."""
    symbols = _byte_symbols()
    tokens = symbols + [s + "</w>" for s in symbols]
    merges = _word_merges(vocab_words)
    for left, right in merges:
        token = left + right
        if token not in tokens:
            tokens.append(token)
    tokens += [BOS_TOKEN, EOS_TOKEN]
    return {token: i for i, token in enumerate(tokens)}, merges


def save_tiny_tokenizer(folder: str | os.PathLike, vocab_words: Iterable[str] = DEFAULT_VOCAB_WORDS,
                        model_id: str = "openai/clip-vit-base-patch16", subfolder: str = "") -> Path:
    """Write a working byte-level CLIP BPE tokenizer to `folder` and return the folder.

    The folder holds `vocab.json`, `merges.txt`, `tokenizer.json` and `tokenizer_config.json` (model_max_length 77),
    loadable with `CLIPTokenizer`, `CLIPTokenizerFast` and `AutoTokenizer`. Its vocabulary size is `len(tokenizer)`;
    BOS and EOS are the last two ids, as in CLIP's real vocabulary (49406, 49407). The special tokens (bos, eos, pad,
    unk) are those of `model_id`'s real tokenizer config in `subfolder` (SDXL's `tokenizer_2` pads with "!").
    """
    from transformers import CLIPTokenizer

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    vocab, merges = tiny_tokenizer_vocab(vocab_words)
    special = _tokenizer_special_tokens(model_id, subfolder)
    tokenizer = CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=TOKENIZER_MAX_LENGTH, **special)
    tokenizer.save_pretrained(folder)
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    merges_text = "#version: 0.2\n" + "".join(f"{left} {right}\n" for left, right in merges)
    (folder / "merges.txt").write_text(merges_text, encoding="utf-8")
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config.update(model_max_length=TOKENIZER_MAX_LENGTH, tokenizer_class="CLIPTokenizer")
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False), encoding="utf-8")
    return folder


# --- the shrink table: real hub config -> tiny stand-in ---------------------------------------------------
SDXL_ID = "stabilityai/stable-diffusion-xl-base-1.0"
CONTROLNET_ID = "diffusers/controlnet-depth-sdxl-1.0"
IP_ADAPTER_ID = "h94/IP-Adapter"
IMAGE_ENCODER_FILE = "models/image_encoder/config.json"
DPT_ID = "Intel/dpt-hybrid-midas"
CLIP_ID = "openai/clip-vit-base-patch16"
SD15_ID = "stable-diffusion-v1-5/stable-diffusion-v1-5"
SD21_ID = "stabilityai/stable-diffusion-2-1-base"
RESNET_ID = "microsoft/resnet-50"
SDXL_VAE_FP16_ID = "madebyollin/sdxl-vae-fp16-fix"

def _prefixed(section: str, fields: dict[str, Any]) -> dict[str, Any]:
    """`{"a": 1}` -> `{"section.a": 1}` (overrides of a nested config section)."""
    return {f"{section}.{key}": value for key, value in fields.items()}


TINY_VOCAB_SIZE = len(tiny_tokenizer_vocab()[0])  # the tiny BPE's size with the default words; BOS, EOS last

# Only size fields change (hidden sizes, depths, heads, channels, sample/image sizes, the vocabulary size the tiny
# BPE forces); every other value — token ids, activations, norm types and eps, scheduler flags, block types,
# projection types — is the real config's. tests/pipelines/test_hub_configs.py proves it per model id.
_TINY_TEXT = {"hidden_size": 32, "intermediate_size": 37, "num_hidden_layers": 2, "num_attention_heads": 4,
              "projection_dim": 32, "vocab_size": TINY_VOCAB_SIZE}
_TINY_SDXL_UNET = {"block_out_channels": [32, 64, 64], "attention_head_dim": [2, 4, 4],
                   "transformer_layers_per_block": [1, 2, 2], "cross_attention_dim": 64, "addition_time_embed_dim": 8,
                   "projection_class_embeddings_input_dim": 6 * 8 + 32, "sample_size": 8}
_TINY_CLIP_TEXT = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                   "projection_dim": 16, "vocab_size": TINY_VOCAB_SIZE}
_TINY_CLIP_VISION = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                     "projection_dim": 16, "image_size": 32, "patch_size": 8}

_TINY_VAE = {"block_out_channels": [32, 32, 64, 64], "sample_size": 64}
_TINY_SD_UNET = {"block_out_channels": [32, 64, 64, 64], "cross_attention_dim": 32, "sample_size": 8}
TINY: dict[str, dict[str, dict[str, Any]]] = {
    SDXL_ID: {
        "model_index.json": {},
        "scheduler/scheduler_config.json": {},
        "tokenizer/tokenizer_config.json": {},
        "tokenizer_2/tokenizer_config.json": {},
        "text_encoder/config.json": _TINY_TEXT,
        "text_encoder_2/config.json": _TINY_TEXT,
        "unet/config.json": _TINY_SDXL_UNET,
        "vae/config.json": _TINY_VAE,
    },
    CONTROLNET_ID: {"config.json": {k: v for k, v in _TINY_SDXL_UNET.items() if k != "sample_size"}},
    IP_ADAPTER_ID: {IMAGE_ENCODER_FILE: {"hidden_size": 32, "intermediate_size": 37, "num_hidden_layers": 2,
                                         "num_attention_heads": 4, "projection_dim": 32}},
    DPT_ID: {
        "config.json": {"hidden_size": 32, "intermediate_size": 37, "num_attention_heads": 4, "image_size": 64,
                        "neck_hidden_sizes": [8, 16, 32, 32], "fusion_hidden_size": 16,
                        "backbone_featmap_shape": [1, 32, 4, 4], "backbone_config.hidden_sizes": [8, 16, 32, 64],
                        "backbone_config.embedding_size": 8, "backbone_config.num_groups": 2,
                        "pooler_output_size": 32},  # derived from hidden_size when absent
        "preprocessor_config.json": {"size": {"height": 64, "width": 64}},
    },
    CLIP_ID: {
        # transformers rebuilds the vision tower from `vision_config_dict` (CLIPVisionConfig defaults + its keys),
        # so the vision sizes are shrunk there as well as in `vision_config`
        "config.json": {"projection_dim": 16, **_prefixed("text_config", _TINY_CLIP_TEXT),
                        **_prefixed("vision_config", _TINY_CLIP_VISION), **_prefixed("vision_config_dict", _TINY_CLIP_VISION)},
        "preprocessor_config.json": {"size": 32, "crop_size": 32},
        "tokenizer_config.json": {},
    },
    SD15_ID: {
        "model_index.json": {},
        "scheduler/scheduler_config.json": {},
        "tokenizer/tokenizer_config.json": {},
        "feature_extractor/preprocessor_config.json": {},
        "text_encoder/config.json": _TINY_TEXT,
        "unet/config.json": _TINY_SD_UNET,
        "vae/config.json": _TINY_VAE,
    },
    SD21_ID: {
        "model_index.json": {},
        "scheduler/scheduler_config.json": {},
        "tokenizer/tokenizer_config.json": {},
        "feature_extractor/preprocessor_config.json": {},
        "text_encoder/config.json": _TINY_TEXT,
        "unet/config.json": {**_TINY_SD_UNET, "attention_head_dim": [2, 4, 4, 4]},
        "vae/config.json": _TINY_VAE,
    },
    RESNET_ID: {
        "config.json": {"embedding_size": 8, "hidden_sizes": [8, 16, 32, 64], "depths": [1, 1, 1, 1]},
        "preprocessor_config.json": {"size": 32},
    },
    SDXL_VAE_FP16_ID: {"config.json": _TINY_VAE},
}
# Components a tiny pipeline folder leaves out (listed in the model_index check; never a size field).
OMITTED_COMPONENTS: dict[str, tuple[str, ...]] = {SD15_ID: ("safety_checker", "requires_safety_checker")}


def standin_fingerprint() -> str:
    """A short hash of what decides the stand-ins: the shrink table and the kept real config files. A folder of
    stand-ins built once and reused (e.g. `models: tiny` of generation jobs) is stale when this changes."""
    import hashlib

    from pipelines.hub import fixtures_root

    digest = hashlib.sha256(json.dumps(TINY, sort_keys=True, default=str).encode())
    for path in sorted(fixtures_root().rglob("*.json")):
        digest.update(path.relative_to(fixtures_root()).as_posix().encode() + path.read_bytes())
    return digest.hexdigest()[:16]


def tiny_config(model_id: str, file: str = "config.json") -> dict[str, Any]:
    """The real config file `file` of `model_id` with the size fields of `TINY` shrunk."""
    from pipelines.hub import real_config, set_dotted

    return set_dotted(real_config(model_id, file), TINY[model_id][file])


def full_config(model_id: str, file: str = "config.json") -> dict[str, Any]:
    """The real config file (full size)."""
    from pipelines.hub import real_config

    return real_config(model_id, file)


def _config(model_id: str, file: str, size: str) -> dict[str, Any]:
    if size not in ("tiny", "full"):
        raise ValueError(f"size must be 'tiny' or 'full', got {size!r}")
    return tiny_config(model_id, file) if size == "tiny" else full_config(model_id, file)


def build_model(config: dict[str, Any]) -> Any:
    """A random-weight model from a config dict: diffusers models by `_class_name`, transformers models by
    `architectures[0]` (falling back to the model type's base model)."""
    # the version that wrote a file is not a property of the model (an old `_diffusers_version` would make
    # StableDiffusionPipeline "fix" a small sample_size)
    config = {k: v for k, v in config.items() if k not in ("_diffusers_version", "transformers_version")}
    if "_class_name" in config:
        import diffusers

        return getattr(diffusers, config["_class_name"]).from_config(config)
    import transformers
    from transformers import CONFIG_MAPPING

    cfg = CONFIG_MAPPING[config["model_type"]].from_dict(config)
    arch = (config.get("architectures") or [None])[0]
    if arch is None:
        return transformers.AutoModel.from_config(cfg)
    return getattr(transformers, arch)(cfg)


def _tokenizer_special_tokens(model_id: str, subfolder: str) -> dict[str, str]:
    from pipelines.hub import effective_config, real_config

    prefix = f"{subfolder}/" if subfolder else ""
    special = real_config(model_id, f"{prefix}special_tokens_map.json")
    eff = effective_config("tokenizer", real_config(model_id, f"{prefix}tokenizer_config.json"), special)
    return {k: eff[k] for k in ("bos_token", "eos_token", "pad_token", "unk_token")}


def load_tiny_tokenizer(model_id: str = CLIP_ID, subfolder: str = "", vocab_words: Iterable[str] = DEFAULT_VOCAB_WORDS):
    """The tiny BPE as a `CLIPTokenizer` with the special tokens (bos/eos/pad/unk) of `model_id`'s real tokenizer."""
    with tempfile.TemporaryDirectory() as scratch:
        from transformers import CLIPTokenizer

        return CLIPTokenizer.from_pretrained(save_tiny_tokenizer(scratch, vocab_words, model_id, subfolder))


# --- CLIP ---
def save_tiny_clip(folder: str | os.PathLike, seed: int = 0, model_id: str = CLIP_ID) -> Path:
    """A random-weight `CLIPModel` + `CLIPProcessor` folder: `model_id`'s real config (default CLIP ViT-B/16) with
    the sizes of `TINY` (vision hidden 32, 2 layers, image 32, patch 8; text hidden 32, 2 layers; projection 16),
    and the tiny BPE tokenizer.

    Like the real checkpoint, the text config keeps OpenAI's `bos_token_id=0, eos_token_id=2, pad_token_id=1`
    while the tokenizer's end-of-text token is its last id: pooling must not trust the config's eos id.
    Loads with `CLIPModel.from_pretrained(folder)` and `CLIPProcessor.from_pretrained(folder)`.
    """
    from transformers import CLIPImageProcessor, CLIPProcessor

    folder = Path(folder)
    tokenizer = load_tiny_tokenizer(model_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build_model(tiny_config(model_id)).eval()
    model.save_pretrained(folder)
    image_processor = CLIPImageProcessor.from_dict(tiny_config(model_id, "preprocessor_config.json"))
    CLIPProcessor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(folder)
    return folder


# --- ZeST: SDXL base + depth ControlNet + IP-Adapter ViT-H + DPT-hybrid ---
def scheduler_from_config(model_id: str, file: str = "scheduler/scheduler_config.json") -> Any:
    """The scheduler class and settings of a real pipeline's scheduler config."""
    import diffusers

    config = full_config(model_id, file)
    return getattr(diffusers, config["_class_name"]).from_config(config)


def sdxl_scheduler():
    """SDXL base's scheduler (Euler discrete, scaled-linear betas, leading spacing) from its real config."""
    return scheduler_from_config(SDXL_ID)


def ip_adapter_state(unet, image_embed_dim: int, tokens: int = 4, device: str | torch.device = "cpu",
                     dtype: torch.dtype = torch.float32) -> dict[str, dict[str, torch.Tensor]]:
    """Random IP-Adapter weights as `{"image_proj": ..., "ip_adapter": ...}` with h94's key names.

    `ip_adapter` holds `<k>.to_k_ip.weight` / `<k>.to_v_ip.weight`, k = 1, 3, 5, ..., one k per cross-attention
    processor in `unet.attn_processors` order, its hidden size the width of its block; `image_proj.proj` maps the
    image encoder's projection to `tokens` x cross_attention_dim. On the `meta` device the tensors have shapes only.
    """
    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=device, dtype=dtype) * 0.05

    cross_dim = unet.config.cross_attention_dim
    channels = list(unet.config.block_out_channels)
    image_proj = {"proj.weight": randn(tokens * cross_dim, image_embed_dim),
                  "proj.bias": torch.zeros(tokens * cross_dim, device=device, dtype=dtype),
                  "norm.weight": torch.ones(cross_dim, device=device, dtype=dtype),
                  "norm.bias": torch.zeros(cross_dim, device=device, dtype=dtype)}
    adapter: dict[str, torch.Tensor] = {}
    key = 1
    for name in unet.attn_processors:
        if name.endswith("attn1.processor"):
            continue
        if name.startswith("mid_block"):
            hidden = channels[-1]
        elif name.startswith("up_blocks"):
            hidden = list(reversed(channels))[int(name.split(".")[1])]
        else:
            hidden = channels[int(name.split(".")[1])]
        adapter[f"{key}.to_k_ip.weight"] = randn(hidden, cross_dim)
        adapter[f"{key}.to_v_ip.weight"] = randn(hidden, cross_dim)
        key += 2
    return {"image_proj": image_proj, "ip_adapter": adapter}


@contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Temporarily make `dtype` torch's default floating dtype."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def zest_configs(size: str = "tiny") -> dict[str, dict[str, Any]]:
    """The component configs of the ZeST models at `size` ('tiny': `TINY`'s shrink, 'full': the real configs)."""
    return {
        "unet": _config(SDXL_ID, "unet/config.json", size),
        "vae": _config(SDXL_ID, "vae/config.json", size),
        "text_encoder": _config(SDXL_ID, "text_encoder/config.json", size),
        "text_encoder_2": _config(SDXL_ID, "text_encoder_2/config.json", size),
        "controlnet": _config(CONTROLNET_ID, "config.json", size),
        "image_encoder": _config(IP_ADAPTER_ID, IMAGE_ENCODER_FILE, size),
        "depth": _config(DPT_ID, "config.json", size),
    }


def random_zest_modules(size: str = "tiny", device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                        seed: int = 0) -> dict[str, Any]:
    """Random-weight ZeST modules of `size` ('tiny' or 'full' = the real configs) built directly on `device` in `dtype`.

    Keys: tokenizer, tokenizer_2 (the tiny byte-level BPE with SDXL's special tokens: tokenizer_2 pads with "!"),
    text_encoder, text_encoder_2, unet, vae, scheduler, controlnet, image_encoder, ip_adapter (state dict),
    depth (DPTForDepthEstimation). At 'full' size the text encoders keep the real 49408-token vocabulary, so only
    the tiny tokenizer's ids (all below it) are fed to them.
    """
    configs = zest_configs(size)
    torch.manual_seed(seed)
    tokenizers = {name: load_tiny_tokenizer(SDXL_ID, name) for name in ("tokenizer", "tokenizer_2")}
    with torch.device(device), _default_dtype(dtype):  # parameters are created where and as they will live
        modules = {name: build_model(configs[name]) for name in
                   ("text_encoder", "text_encoder_2", "unet", "vae", "controlnet", "image_encoder", "depth")}
    for module in modules.values():
        module.to(dtype).eval()
    modules.update(tokenizers)
    modules["scheduler"] = sdxl_scheduler()
    modules["ip_adapter"] = ip_adapter_state(modules["unet"], configs["image_encoder"]["projection_dim"], device=device,
                                             dtype=dtype)
    return modules


def dpt_processor(size: str = "tiny"):
    """DPT-hybrid-MiDaS's image processor (square resize, mean/std 0.5) at `size`."""
    from transformers import DPTImageProcessor

    return DPTImageProcessor.from_dict(_config(DPT_ID, "preprocessor_config.json", size))


def random_zest_pipeline(size: str = "full", device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                         attention: str = "auto", compile: bool = False, seed: int = 0) -> "ZeSTPipeline":
    """A `ZeSTPipeline` of random-weight modules assembled in memory (no files), for benchmarks on any device."""
    from pipelines.depth import DepthEstimator
    from pipelines.zest import ZeSTPipeline, diffusers_pipeline_class

    modules = random_zest_modules(size, device, dtype, seed)
    pipe = diffusers_pipeline_class()(
        vae=modules["vae"], text_encoder=modules["text_encoder"], text_encoder_2=modules["text_encoder_2"],
        tokenizer=modules["tokenizer"], tokenizer_2=modules["tokenizer_2"], unet=modules["unet"],
        controlnet=modules["controlnet"], scheduler=modules["scheduler"], image_encoder=modules["image_encoder"],
        add_watermarker=False,
    )
    pipe.load_ip_adapter(modules["ip_adapter"], subfolder="", weight_name="", image_encoder_folder=None)
    depth = DepthEstimator(modules["depth"], dpt_processor(size), f"random-{size}")
    model_ids = {name: f"random-{size}-{name}" for name in ("base", "controlnet", "ip_adapter", "depth")}
    return ZeSTPipeline.from_pipeline(pipe, depth, model_ids, device, attention, compile)


def save_tiny_dpt(folder: str | os.PathLike, model: Any = None) -> Path:
    """A tiny DPT-hybrid depth model (random unless `model` is given) and its image processor."""
    folder = Path(folder)
    (model if model is not None else build_model(tiny_config(DPT_ID)).eval()).save_pretrained(folder)
    dpt_processor("tiny").save_pretrained(folder)
    return folder


def save_tiny_zest(folder: str | os.PathLike, seed: int = 0) -> "ZeSTConfig":
    """Every ZeST component at tiny size with random weights, saved in the real layouts under `folder`.

    `sdxl/` (an SDXL pipeline folder), `controlnet/`, `ip_adapter/` laid out like h94/IP-Adapter
    (`sdxl_models/ip-adapter_sdxl_vit-h.safetensors` + `models/image_encoder`), `depth/` (DPT-hybrid).
    Returns a `ZeSTConfig` of these folders. The VAE downsamples by 8 like SDXL's: 64 px images have 8 x 8 latents.
    """
    from diffusers import StableDiffusionXLPipeline
    from safetensors.torch import save_file

    from pipelines.zest import ZeSTConfig

    folder = Path(folder)
    modules = random_zest_modules("tiny", seed=seed)
    StableDiffusionXLPipeline(vae=modules["vae"], text_encoder=modules["text_encoder"],
                              text_encoder_2=modules["text_encoder_2"], tokenizer=modules["tokenizer"],
                              tokenizer_2=modules["tokenizer_2"], unet=modules["unet"], scheduler=modules["scheduler"],
                              add_watermarker=False).save_pretrained(folder / "sdxl")
    modules["controlnet"].save_pretrained(folder / "controlnet")
    config = ZeSTConfig(base=str(folder / "sdxl"), controlnet=str(folder / "controlnet"),
                        ip_adapter=str(folder / "ip_adapter"), depth=str(folder / "depth"))
    modules["image_encoder"].save_pretrained(folder / "ip_adapter" / config.image_encoder)
    weights = folder / "ip_adapter" / config.ip_adapter_subfolder / config.ip_adapter_weight
    weights.parent.mkdir(parents=True, exist_ok=True)
    flat = {f"{part}.{key}": tensor.contiguous() for part, tensors in modules["ip_adapter"].items()
            for key, tensor in tensors.items()}
    save_file(flat, str(weights))
    save_tiny_dpt(folder / "depth", modules["depth"])
    return config


def save_tiny_model(folder: str | os.PathLike, model_id: str, file: str = "config.json", seed: int = 0) -> Path:
    """One random-weight model of `model_id` at tiny size (e.g. microsoft/resnet-50, madebyollin/sdxl-vae-fp16-fix),
    saved with its image processor when the model id keeps one."""
    folder = Path(folder)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        build_model(tiny_config(model_id, file)).eval().save_pretrained(folder)
    if "preprocessor_config.json" in TINY[model_id]:
        from transformers import AutoImageProcessor

        processor_config = tiny_config(model_id, "preprocessor_config.json")
        with tempfile.TemporaryDirectory() as scratch:
            (Path(scratch) / "preprocessor_config.json").write_text(json.dumps(processor_config), encoding="utf-8")
            (Path(scratch) / "config.json").write_text(json.dumps(tiny_config(model_id, file)), encoding="utf-8")
            AutoImageProcessor.from_pretrained(scratch).save_pretrained(folder)
    return folder


# --- generative detectors ---
def save_tiny_pixel_unet(folder: str | os.PathLike, seed: int = 0) -> Path:
    """A random-weight ADM-style unconditional `UNet2DModel` (32 px, learned-sigma 6 output channels) for DIFFGUARD.

    Two resolutions (16, 32 channels), one attention level, group norm of 8. Loads with `UNet2DModel.from_pretrained`.
    """
    from diffusers import UNet2DModel

    torch.manual_seed(seed)
    unet = UNet2DModel(
        sample_size=32, in_channels=3, out_channels=6, block_out_channels=(16, 32), layers_per_block=1,
        down_block_types=("DownBlock2D", "AttnDownBlock2D"), up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        attention_head_dim=8, norm_num_groups=8, resnet_time_scale_shift="scale_shift",
    )
    unet.save_pretrained(folder)
    return Path(folder)


def save_tiny_stable_diffusion(folder: str | os.PathLike, seed: int = 0, model_id: str = SD15_ID) -> Path:
    """A random-weight Stable Diffusion folder of `model_id` (default SD 1.5; also stabilityai/stable-diffusion-2-1-base):
    the real UNet, VAE, text-encoder, scheduler and feature-extractor configs with `TINY`'s sizes (UNet latent 8 ->
    64 px images, VAE x8 as the real one), the tiny BPE tokenizer, without the safety checker. Loads with
    `StableDiffusionPipeline.from_pretrained(folder)`.
    """
    from diffusers import StableDiffusionPipeline
    from transformers import CLIPImageProcessor

    folder = Path(folder)
    tokenizer = load_tiny_tokenizer(model_id, "tokenizer")
    torch.manual_seed(seed)
    parts = {name: build_model(tiny_config(model_id, f"{name}/config.json")).eval()
             for name in ("unet", "vae", "text_encoder")}
    feature_extractor = CLIPImageProcessor.from_dict(tiny_config(model_id, "feature_extractor/preprocessor_config.json"))
    pipe = StableDiffusionPipeline(**parts, tokenizer=tokenizer, scheduler=scheduler_from_config(model_id),
                                   safety_checker=None, feature_extractor=feature_extractor, requires_safety_checker=False)
    pipe.save_pretrained(folder)
    return folder
