"""Tiny random-weight stand-ins of the real models, saved with `save_pretrained` in the real folder layouts.

Each stand-in is its model id's real hub configuration (kept in `pipelines/hub_configs/`, see `pipelines.hub`) with
only the size fields listed in `TINY` shrunk, so the real checkpoints' quirks (CLIP's config eos id 2, scheduler
flags, activation and norm types, block types) reach every test. Tests, the demo and CPU benchmarks build these once,
save them and load them back through the same `from_pretrained` code paths users run with hub ids; no weights are
ever downloaded. `size="full"` builds use the real configs unchanged (random weights, for the GPU benchmark).

Modules: `tokenizer` (the tiny BPE), `configs` (the shrink table `TINY` and sized configs), `models` (the builders).
Every public name is importable from `pipelines.tiny`; the ZeST stand-ins assembled from these modules are
`gen.tiny_zest`'s.
"""
from __future__ import annotations

from pipelines.tiny.configs import (  # noqa: F401
                                    CLIP_ID,
                                    CONTROLNET_ID,
                                    DPT_ID,
                                    IMAGE_ENCODER_FILE,
                                    IP_ADAPTER_ID,
                                    OMITTED_COMPONENTS,
                                    RESNET_ID,
                                    SD15_ID,
                                    SD21_ID,
                                    SDXL_ID,
                                    SDXL_VAE_FP16_ID,
                                    TINY,
                                    full_config,
                                    sized_config,
                                    standin_fingerprint,
                                    tiny_config,
                                    zest_configs,
)
from pipelines.tiny.models import (  # noqa: F401
                                    build_model,
                                    dpt_processor,
                                    ip_adapter_state,
                                    random_zest_modules,
                                    save_tiny_clip,
                                    save_tiny_dpt,
                                    save_tiny_model,
                                    save_tiny_pixel_unet,
                                    save_tiny_stable_diffusion,
                                    scheduler_from_config,
                                    sdxl_scheduler,
)
from pipelines.tiny.tokenizer import (  # noqa: F401
                                    BOS_TOKEN,
                                    DEFAULT_VOCAB_WORDS,
                                    EOS_TOKEN,
                                    TINY_VOCAB_SIZE,
                                    TOKENIZER_MAX_LENGTH,
                                    load_tiny_tokenizer,
                                    save_tiny_tokenizer,
                                    tiny_tokenizer_vocab,
)
