"""OpenAI guided-diffusion (ADM) checkpoints as diffusers UNet2DModels, checked against OpenAI's own UNetModel
(the `guided-diffusion-sdk` package: `pip install --no-deps guided-diffusion-sdk`)."""
from __future__ import annotations

import json

import pytest
import torch

from detectors.generative.guided_diffusion import (
    ADM_256_UNCOND,
    attention_levels,
    build_unet,
    channel_mult,
    convert_state_dict,
    load_pixel_unet,
    resolve_flags,
    save_tiny_adm_unet,
    shrink_flags,
)
from pipelines.hub import fixtures_root

script_util = pytest.importorskip("guided_diffusion.script_util", reason="pip install --no-deps guided-diffusion-sdk")
FIXTURE = fixtures_root() / "openai" / "guided-diffusion" / "256x256_diffusion_uncond.json"
SIZE_FIELDS = {"image_size", "num_channels", "num_head_channels", "attention_resolutions", "channel_mult"}
ADM_256_UNCOND_PARAMETERS = 552_814_086  # OpenAI's UNetModel with these flags (the published 552.8 M)


def official_unet(flags, empty: bool = False):
    """guided_diffusion.script_util.create_model(**flags) in float32 (use_fp16 only converts later)."""
    kwargs = {k: v for k, v in resolve_flags(flags).items() if k not in ("diffusion_steps", "noise_schedule")}
    kwargs["use_fp16"] = False
    if not empty:
        return script_util.create_model(**kwargs)
    from accelerate import init_empty_weights

    with init_empty_weights():
        return script_util.create_model(**kwargs)


def test_flags_are_the_published_ones_and_the_stand_in_only_shrinks_sizes():
    fixture = {k: v for k, v in json.loads(FIXTURE.read_text()).items() if not k.startswith("_")}
    assert fixture == ADM_256_UNCOND
    tiny = shrink_flags()
    real = resolve_flags(ADM_256_UNCOND)
    changed = {k for k in resolve_flags(tiny) if resolve_flags(tiny)[k] != real[k]}
    assert changed <= SIZE_FIELDS, changed
    assert tiny["image_size"] < real["image_size"] and tiny["num_channels"] < real["num_channels"]
    # the same architecture at another size: channel multipliers and attention levels are the real model's
    assert channel_mult(tiny) == channel_mult(real) == (1, 1, 2, 2, 4, 4)
    assert attention_levels(tiny) == attention_levels(real) == [False, False, False, True, True, True]


@pytest.mark.parametrize("variant", [
    {},  # 256x256_diffusion_uncond shrunk: learned sigma, legacy qkv order, res-block up/down, scale-shift norm
    {"resblock_updown": False, "use_scale_shift_norm": False, "use_new_attention_order": True, "learn_sigma": False},
    {"num_head_channels": -1, "num_heads": 4},  # improved-diffusion's fixed head count: head sizes 16 and 32
])
@pytest.mark.slow
def test_converted_checkpoint_gives_the_official_output(variant, tmp_path):
    flags = {**shrink_flags(), **variant}
    torch.manual_seed(0)
    official = official_unet(flags).eval()
    with torch.no_grad():
        for p in official.parameters():  # ADM zero-initialises output convolutions: random weights test them too
            p.normal_(0, 0.05) if p.dim() > 1 else p.normal_(0, 0.5)
    torch.save(official.state_dict(), tmp_path / "adm.pt")
    ours = load_pixel_unet(tmp_path / "adm.pt", flags)
    heads = [m.heads for m in ours.modules() if type(m).__name__ == "Attention"]
    assert min(heads) > 1, "several heads per attention block, so that the qkv head ordering matters"
    x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    t = torch.tensor([0, 499, 999])
    with torch.no_grad():
        expected, got = official(x, t), ours(x, t).sample
    assert got.shape == expected.shape == (3, 6 if flags.get("learn_sigma", True) else 3, 32, 32)
    assert expected.abs().mean() > 0.1
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


@pytest.mark.slow
def test_full_size_layout_equals_the_official_checkpoint():
    official = official_unet(ADM_256_UNCOND, empty=True)
    ours = build_unet(ADM_256_UNCOND, empty=True)
    assert {p.device.type for p in ours.parameters()} == {"meta"}
    n_official = sum(p.numel() for p in official.parameters())
    assert sum(p.numel() for p in ours.parameters()) == n_official == ADM_256_UNCOND_PARAMETERS
    converted = {k: tuple(v.shape) for k, v in convert_state_dict(official.state_dict(), ADM_256_UNCOND).items()}
    expected = {k: tuple(v.shape) for k, v in ours.state_dict().items()}
    assert set(converted) == set(expected)  # no missing, no unexpected keys
    assert converted == expected
    # every official tensor is used: each attention block's fused qkv (weight, bias) becomes 3 x (weight, bias)
    n_attention = sum(k.endswith(".qkv.weight") for k in official.state_dict())
    assert n_attention == 16 and len(expected) == len(official.state_dict()) + 4 * n_attention


@pytest.mark.slow
def test_loader_reads_diffusers_folders_and_names_bad_inputs(tmp_path):
    folder = save_tiny_adm_unet(tmp_path / "unet")
    unet = load_pixel_unet(folder)
    assert unet.config.sample_size == 32 and unet.config.out_channels == 6
    with pytest.raises(FileNotFoundError, match="missing.pt"):
        load_pixel_unet(tmp_path / "missing.pt")
    torch.save(official_unet(shrink_flags()).state_dict(), tmp_path / "adm.pt")
    with pytest.raises(KeyError, match="MODEL_FLAGS"):
        load_pixel_unet(tmp_path / "adm.pt", {**shrink_flags(), "num_res_blocks": 1})
    with pytest.raises(ValueError, match="unknown guided-diffusion model flags"):
        resolve_flags({"num_chanels": 8})
