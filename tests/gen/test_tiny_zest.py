"""The ZeST stand-ins (gen.tiny_zest): saved in the real folder layouts; the in-memory assembly equals the saved one."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from diffusers import ControlNetModel, UNet2DConditionModel
from PIL import Image
from safetensors import safe_open
from transformers import AutoModelForDepthEstimation

from gen.tiny_zest import random_zest_pipeline


def test_tiny_zest_uses_the_real_layouts(tiny_zest_config):
    ip_root = Path(tiny_zest_config.ip_adapter)
    assert (ip_root / "models" / "image_encoder" / "config.json").is_file()
    weights = ip_root / tiny_zest_config.ip_adapter_subfolder / tiny_zest_config.ip_adapter_weight
    unet = UNet2DConditionModel.from_pretrained(tiny_zest_config.base, subfolder="unet")
    cross = [name for name in unet.attn_processors if name.endswith("attn2.processor")]
    with safe_open(str(weights), "pt") as f:
        keys = set(f.keys())
        # h94 layout: image_proj.* and ip_adapter.<k>.to_{k,v}_ip with k = 1, 3, 5, ... one per cross-attention
        assert {f"ip_adapter.{2 * i + 1}.to_k_ip.weight" for i in range(len(cross))} <= keys
        assert f.get_tensor("image_proj.proj.weight").shape == (4 * unet.config.cross_attention_dim, 32)
    assert len([k for k in keys if k.startswith("ip_adapter.")]) == 2 * len(cross)
    controlnet = ControlNetModel.from_pretrained(tiny_zest_config.controlnet)
    # the real ones: x8 like the VAE
    assert tuple(controlnet.config.conditioning_embedding_out_channels) == (16, 32, 96, 256)
    assert unet.config.projection_class_embeddings_input_dim == 6 * 8 + 32
    assert AutoModelForDepthEstimation.from_pretrained(tiny_zest_config.depth).config.model_type == "dpt"


@pytest.mark.slow
def test_in_memory_random_zest_equals_the_saved_and_reloaded_one(tiny_zest, one_thread):
    """`random_zest_pipeline` (the GPU benchmark's path) builds the same weights as `save_tiny_zest` (same seed),
    so both must generate the same images: checks the save/load round trip and the in-memory assembly at once."""
    rng = np.random.default_rng(5)
    targets = [Image.fromarray(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)) for _ in range(2)]
    mask = Image.fromarray(np.pad(np.full((20, 24), 255, np.uint8), ((10, 10), (12, 12))))
    call = dict(masks=[mask, mask], seeds=[3, 4], num_inference_steps=3, resolution=64)
    in_memory = random_zest_pipeline("tiny", "cpu", torch.float32, attention="sdpa")
    expected, _ = tiny_zest.generate(targets, targets[::-1], **call)
    got, _ = in_memory.generate(targets, targets[::-1], **call)
    np.testing.assert_allclose(got, expected, atol=5e-5)  # float32 noise through the 4-level (x8) VAE
