"""ZeST pipeline on tiny random-weight models: batching, seeding, IP-Adapter wiring, resize and composite options."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from gen.zest import (
    NEGATIVE_PROMPT,
    PROMPT,
    ZeSTConfig,
    ZeSTPipeline,
    composite_background,
    feathered_weights,
    fit_square,
    unfit_square,
)

FAST = dict(num_inference_steps=3, resolution=64)  # strength 0.9999 -> 2 denoising steps


@pytest.fixture(scope="module", autouse=True)
def _single_threaded(one_thread):
    """Every model call of this module (fixtures included) runs with the same thread count, so repeats are bitwise."""


def _images(seed: int, size: tuple[int, int], n: int) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)) for _ in range(n)]


def _box_mask(size: tuple[int, int], box: tuple[int, int, int, int]) -> Image.Image:
    mask = np.zeros((size[1], size[0]), dtype=np.uint8)
    left, top, right, bottom = box
    mask[top:bottom, left:right] = 255
    return Image.fromarray(mask, mode="L")


@pytest.fixture(scope="module")
def inputs():
    targets = _images(0, (56, 40), 2)
    materials = _images(1, (32, 48), 2)  # two different exemplars: a mixed batch
    masks = [_box_mask((56, 40), (12, 8, 44, 32)), _box_mask((56, 40), (4, 4, 30, 36))]
    return targets, materials, masks


@pytest.fixture(scope="module")
def first_alone(tiny_zest, inputs):
    targets, materials, masks = inputs
    return tiny_zest.generate(targets[:1], materials[:1], masks[:1], seeds=[11], **FAST)[0][0]


def test_config_round_trip_and_unknown_key(tmp_path):
    from pipelines.errors import ConfigError

    cfg = ZeSTConfig(vae="madebyollin/sdxl-vae-fp16-fix")
    assert ZeSTConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ConfigError, match=r"^models.ip_adaptor: unknown key \(did you mean 'ip_adapter'\?\)$"):
        ZeSTConfig.from_dict({"ip_adaptor": "h94/IP-Adapter"})
    with pytest.raises(ConfigError, match=r"^models.base: the local model folder '/no/such/dir' does not exist$"):
        ZeSTConfig.from_dict({"base": "/no/such/dir"})
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"^models.depth: the local model folder .* holds no weight files"):
        ZeSTConfig.from_dict({"depth": str(tmp_path / "empty")})


def test_call_defaults_are_zest_s_and_defined_once():
    """ZeST's call parameters live in ZeSTCall only: the pipeline's methods take them as keywords without defaults
    of their own, a generation config inherits them, and no other module spells 0.9999."""
    import inspect
    import re

    from gen.config import GenerationConfig
    from gen.zest import ZeSTCall
    from pipelines.errors import ConfigError

    call = ZeSTCall()
    assert (call.num_inference_steps, call.strength, call.guidance_scale, call.controlnet_conditioning_scale,
            call.ip_adapter_scale, call.resolution, call.resize) == (30, 0.9999, 5.0, 0.9, 1.0, 1024, "squash")
    for method in (ZeSTPipeline.__call__, ZeSTPipeline.generate):
        assert not set(inspect.signature(method).parameters) & set(ZeSTCall.fields())
    assert {k: v for k, v in GenerationConfig.defaults().items() if k in ZeSTCall.fields()} == ZeSTCall.defaults()
    root = Path(__file__).resolve().parents[2]
    spelled = [str(p.relative_to(root)) for folder in ("pipelines", "gen", "detectors", "oodforge", "scripts")
               for p in (root / folder).rglob("*.py") if re.search(r"(?<![\d.])0\.9999(?!\d)", p.read_text())]
    assert spelled == ["gen/zest.py"]
    with pytest.raises(ConfigError, match=r"^zest.strength: must be > 0 and <= 1, got 1.5"):
        ZeSTCall.from_dict({"strength": 1.5}, "zest")


def test_prompt_is_zest_s_and_text_encoders_are_dropped(tiny_zest, tiny_zest_config):
    assert (PROMPT, NEGATIVE_PROMPT) == ("best quality, high quality",
                                         "monochrome, lowres, bad anatomy, worst quality, low quality")
    assert tiny_zest.pipe.text_encoder is None and tiny_zest.pipe.text_encoder_2 is None
    assert [e.shape[0] for e in tiny_zest.prompt_embeds] == [1, 1, 1, 1]
    assert tiny_zest.model_ids["base"] == tiny_zest_config.base


def test_batched_equals_one_at_a_time_with_mixed_exemplars(tiny_zest, inputs, first_alone):
    targets, materials, masks = inputs
    batched, _ = tiny_zest.generate(targets, materials, masks, seeds=[11, 12], **FAST)
    second_alone = tiny_zest.generate(targets[1:], materials[1:], masks[1:], seeds=[12], **FAST)[0][0]
    np.testing.assert_allclose(batched[0], first_alone, atol=1e-4)
    np.testing.assert_allclose(batched[1], second_alone, atol=1e-4)
    # the exemplar matters per sample: swapping the exemplars changes each output
    swapped, _ = tiny_zest.generate(targets, materials[::-1], masks, seeds=[11, 12], **FAST)
    assert np.abs(swapped[0] - batched[0]).max() > 1e-3


def test_ip_adapter_scale_changes_the_output(tiny_zest, inputs, first_alone):
    targets, materials, masks = inputs
    without = tiny_zest.generate(targets[:1], materials[:1], masks[:1], seeds=[11], ip_adapter_scale=0.0, **FAST)[0][0]
    assert np.abs(without - first_alone).max() > 1e-3


def test_same_seed_same_image_different_seed_different_image(tiny_zest, inputs, first_alone):
    targets, materials, masks = inputs
    again = tiny_zest.generate(targets[:1], materials[:1], masks[:1], seeds=[11], **FAST)[0][0]
    other = tiny_zest.generate(targets[:1], materials[:1], masks[:1], seeds=[99], **FAST)[0][0]
    np.testing.assert_array_equal(again, first_alone)
    assert np.abs(other - first_alone).max() > 1e-3


@pytest.mark.parametrize("resize", ["squash", "pad"])
def test_call_returns_the_target_size_and_composite_keeps_the_background(tiny_zest, inputs, resize):
    targets, materials, masks = inputs
    feather = 1.5
    outputs = tiny_zest(targets, materials, masks, seeds=[11, 12], resize=resize, composite=True, feather=feather,
                        **FAST)
    for output, target, mask in zip(outputs, targets, masks):
        assert output.size == target.size and output.mode == "RGB"
        outside = feathered_weights(mask, feather) == 0
        assert outside.sum() > 0
        np.testing.assert_array_equal(np.asarray(output)[outside], np.asarray(target)[outside])
        inside = np.asarray(mask) > 0
        assert np.abs(np.asarray(output, dtype=int)[inside] - np.asarray(target, dtype=int)[inside]).max() > 0


def test_pad_resize_round_trips_geometry():
    image = Image.fromarray(np.arange(30 * 50 * 3, dtype=np.uint8).reshape(30, 50, 3) % 251)
    padded = fit_square(image, 50, "pad", Image.NEAREST)
    assert padded.size == (50, 50)
    # the content sits centred, between 10 rows of replicated edge above and below
    np.testing.assert_array_equal(np.asarray(padded)[10:40], np.asarray(image))
    np.testing.assert_array_equal(np.asarray(padded)[0], np.asarray(image)[0])
    np.testing.assert_array_equal(np.asarray(unfit_square(padded, image.size, "pad")), np.asarray(image))


def test_feathered_composite_formula():
    mask = _box_mask((20, 20), (5, 5, 15, 15))
    generated = Image.new("RGB", (20, 20), (200, 100, 0))
    original = Image.new("RGB", (20, 20), (0, 100, 200))
    weights = feathered_weights(mask, 1.0)
    # independent check: weights are the Gaussian-blurred box, exactly 1 deep inside and 0 beyond the kernel radius
    assert weights[10, 10] == pytest.approx(1.0) and weights[0, 0] == 0.0 and 0 < weights[5, 10] < 1
    result = np.asarray(composite_background(generated, original, mask, 1.0), dtype=np.float64)
    expected = np.rint(weights[..., None] * np.array([200, 100, 0])
                       + (1 - weights[..., None]) * np.array([0, 100, 200]))
    np.testing.assert_array_equal(result, expected)


def test_uncached_hub_id_raises_the_clear_offline_error(monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # the library reads the variable at import
    cfg = ZeSTConfig(controlnet="oodforge-tests/no-such-controlnet")
    with pytest.raises(OSError, match="oodforge-tests/no-such-controlnet.*pass DIR instead"):
        ZeSTPipeline.from_config(cfg, device="cpu")



def test_half_precision_load_uses_the_fp16_variant_records_revisions_and_keeps_dpt_in_fp32(tiny_zest_config, tmp_path):
    import shutil

    import torch

    from pipelines.runtime import folder_hash

    # a ControlNet folder that ships only the fp16 variant file: it loads only if the variant is asked for
    controlnet = tmp_path / "controlnet"
    shutil.copytree(tiny_zest_config.controlnet, controlnet)
    (controlnet / "diffusion_pytorch_model.safetensors").rename(controlnet / "diffusion_pytorch_model.fp16.safetensors")
    config = ZeSTConfig.from_dict({**tiny_zest_config.to_dict(), "controlnet": str(controlnet)})
    zest = ZeSTPipeline.from_config(config, device="cpu", dtype="bf16")
    assert zest.dtype == torch.bfloat16 and zest.pipe.controlnet.dtype == torch.bfloat16
    assert next(zest.depth.model.parameters()).dtype == torch.float32
    assert zest.model_revisions == {key: folder_hash(getattr(config, key))
                                    for key in ("base", "controlnet", "ip_adapter", "depth")}
    assert zest.attention == "sdpa" and zest.compiled is False


def test_cpu_0_is_the_cpu(tiny_zest, tiny_zest_config):
    """accelerate reports `cpu:0` under torchrun: the pipeline must encode its prompt as on `cpu` (byte-identical
    outputs for any process count)."""
    import torch

    from pipelines.runtime import resolve_device

    assert resolve_device("cpu:0") == torch.device("cpu")
    other = ZeSTPipeline.from_config(tiny_zest_config, device="cpu:0", dtype="fp32")
    for a, b in zip(tiny_zest.prompt_embeds, other.prompt_embeds):
        assert torch.equal(a, b)
