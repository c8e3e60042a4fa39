"""Every default model built at full size from its real config on the meta device (no memory, no weights): its
parameter count is the exact count of the published architecture and agrees with the published figure; the IP-Adapter
weights in h94's key layout load into diffusers' full-size SDXL UNet with no missing or unexpected key."""
from __future__ import annotations

import pytest
import torch
from accelerate import init_empty_weights

from pipelines import tiny

# (model id, config file) -> (exact count from the real config, published figure, its last significant unit, source)
PARAMETER_COUNTS = {
    (tiny.SDXL_ID, "unet/config.json"): (2_567_463_684, 2.6e9, 1e8,
                                         "SDXL paper (Podell et al. 2023), Table 1: UNet 2.6B"),
    (tiny.SDXL_ID, "text_encoder/config.json"): (123_060_480, 123e6, 1e6,
                                                 "SD v1 model card: 123M CLIP ViT-L/14 text encoder"),
    (tiny.SDXL_ID, "text_encoder_2/config.json"): (694_659_840, 817e6 - 123e6, 1e6,
                                                    "SDXL paper: text encoders 817M in total (ViT-L 123M + bigG)"),
    (tiny.SDXL_ID, "vae/config.json"): (83_653_863, 83.7e6, 1e5,
                                        "the KL-f8 autoencoder of LDM/SD (83.7M, diffusers docs)"),
    (tiny.SDXL_VAE_FP16_ID, "config.json"): (83_653_863, 83.7e6, 1e5, "same architecture as SDXL's VAE"),
    (tiny.CONTROLNET_ID, "config.json"): (1_251_014_160, 5.0e9 / 4, 1e7,
                                          "hub file diffusion_pytorch_model.safetensors: 5.0 GB of float32 = 1.25B"),
    (tiny.IP_ADAPTER_ID, tiny.IMAGE_ENCODER_FILE): (632_076_800, 632e6, 1e6,
                                                    "open_clip ViT-H-14 image tower: 632.08M (open_clip model "
                                                    "profile)"),
    (tiny.DPT_ID, "config.json"): (122_377_985, 123e6, 1e6, "DPT paper (Ranftl et al. 2021): DPT-Hybrid 123M"),
    (tiny.CLIP_ID, "config.json"): (149_620_737, 149.6e6, 1e5,
                                    "open_clip ViT-B-16: 149.62M (equals open_clip's own state dict, 149,620,737)"),
    (tiny.SD15_ID, "unet/config.json"): (859_520_964, 860e6, 1e6, "SD v1 model card: 860M UNet"),
    (tiny.SD15_ID, "text_encoder/config.json"): (123_060_480, 123e6, 1e6, "SD v1 model card: 123M text encoder"),
    (tiny.SD15_ID, "vae/config.json"): (83_653_863, 83.7e6, 1e5, "the KL-f8 autoencoder of LDM/SD"),
    (tiny.SD21_ID, "unet/config.json"): (865_910_724, 865e6, 1e6, "SD 2 release notes: 865M UNet"),
    (tiny.SD21_ID, "text_encoder/config.json"): (340_387_840, None, None,
                                                 "OpenCLIP ViT-H/14 text tower without its last layer (no published "
                                                 "count)"),
    (tiny.SD21_ID, "vae/config.json"): (83_653_863, 83.7e6, 1e5, "the KL-f8 autoencoder of LDM/SD"),
    (tiny.RESNET_ID, "config.json"): (25_557_032, 25.6e6, 1e5, "He et al. 2016 / torchvision resnet50: 25,557,032"),
}


def count_on_meta(model_id: str, file: str) -> int:
    with init_empty_weights():
        model = tiny.build_model(tiny.full_config(model_id, file))
    assert all(p.device.type == "meta" for p in model.parameters())
    return sum(p.numel() for p in model.parameters())


def test_every_model_id_of_the_shrink_table_has_a_count():
    assert {model_id for model_id, _ in PARAMETER_COUNTS} == set(tiny.TINY)


@pytest.mark.parametrize("model_id,file", sorted(PARAMETER_COUNTS))
def test_full_size_parameter_count(model_id, file):
    exact, published, unit, _source = PARAMETER_COUNTS[(model_id, file)]
    assert count_on_meta(model_id, file) == exact
    if published is not None:  # the published figure is the exact count to its last significant digit
        assert abs(exact - published) < unit, (exact, published)


@pytest.fixture(scope="module")
def sdxl_unet_meta():
    with init_empty_weights():
        return tiny.build_model(tiny.full_config(tiny.SDXL_ID, "unet/config.json"))


SDXL_BLOCK_WIDTH = {"down_blocks.1": 640, "down_blocks.2": 1280, "mid_block": 1280, "up_blocks.0": 1280,
                    "up_blocks.1": 640}


def h94_sdxl_vit_h_keys(unet) -> dict[str, tuple[int, ...]]:
    """The keys and shapes of h94/IP-Adapter sdxl_models/ip-adapter_sdxl_vit-h.safetensors as published: image_proj
    (4 tokens x 2048 from the ViT-H projection 1024) and to_k_ip/to_v_ip [width, 2048] for k = 1, 3, ..., 139, one
    per cross-attention of the UNet in `attn_processors` order, width that of SDXL's block (640 or 1280)."""
    keys = {"image_proj.proj.weight": (8192, 1024), "image_proj.proj.bias": (8192,),
            "image_proj.norm.weight": (2048,), "image_proj.norm.bias": (2048,)}
    names = [n for n in unet.attn_processors if n.endswith("attn2.processor")]
    for i, name in enumerate(names):
        block = "mid_block" if name.startswith("mid_block") else ".".join(name.split(".")[:2])
        for kind in ("to_k_ip", "to_v_ip"):
            keys[f"ip_adapter.{2 * i + 1}.{kind}.weight"] = (SDXL_BLOCK_WIDTH[block], 2048)
    assert len(names) == 70
    return keys


@pytest.mark.slow
def test_ip_adapter_h94_layout_loads_into_full_size_sdxl_unet(sdxl_unet_meta):
    unet = sdxl_unet_meta
    state = tiny.ip_adapter_state(unet, image_embed_dim=1024, device="meta")
    flat = {f"{part}.{key}": tuple(t.shape) for part, tensors in state.items() for key, t in tensors.items()}
    published = h94_sdxl_vit_h_keys(unet)
    assert flat == published  # no missing, no unexpected key, every shape as published
    assert sum(torch.Size(s).numel() for s in published.values()) * 2 == 698_376_192  # the 698 MB fp16 file on the hub
    # diffusers' own loader converts every key: one IP processor per cross-attention, the projection to 4 tokens
    processors = unet._convert_ip_adapter_attn_to_diffusers([state], low_cpu_mem_usage=True)
    ip = {name: p for name, p in processors.items() if hasattr(p, "to_k_ip")}
    assert len(ip) == 70 and all(name.endswith("attn2.processor") for name in ip)
    for i, proc in enumerate(ip.values()):
        assert tuple(proc.to_k_ip[0].weight.shape) == published[f"ip_adapter.{2 * i + 1}.to_k_ip.weight"]
    projection = unet._convert_ip_adapter_image_proj_to_diffusers(state["image_proj"], low_cpu_mem_usage=True)
    assert tuple(projection.image_embeds.weight.shape) == (8192, 1024) and projection.num_image_text_embeds == 4
