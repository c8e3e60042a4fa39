"""The tiny CLIP folder of pipelines.tiny loads through the real from_pretrained code and its tokenizer ends every
prompt with its end-of-text token."""
from __future__ import annotations

import pytest
from PIL import Image
from transformers import CLIPModel, CLIPProcessor

import detectors


def test_tiny_clip_sizes_and_tokenizer(tiny_clip_dir):
    model = CLIPModel.from_pretrained(tiny_clip_dir)
    processor = CLIPProcessor.from_pretrained(tiny_clip_dir)
    vision, text = model.config.vision_config, model.config.text_config
    assert (vision.hidden_size, vision.num_hidden_layers, vision.image_size, vision.patch_size) == (32, 2, 32, 8)
    assert model.config.projection_dim == 16
    # like openai/clip-vit-base-patch16: the config's eos id is 2, the tokenizer's end-of-text is its last id
    assert text.vocab_size == len(processor.tokenizer) and text.eos_token_id == 2
    assert processor.tokenizer.eos_token_id == len(processor.tokenizer) - 1
    ids = processor.tokenizer(["a photo of a bronze ding.", "moth"], padding=True)["input_ids"]
    assert all(row[0] == processor.tokenizer.bos_token_id and processor.tokenizer.eos_token_id in row for row in ids)
    pixels = processor(images=[Image.new("RGB", (50, 40))], return_tensors="pt")["pixel_values"]
    assert pixels.shape == (1, 3, 32, 32)


def test_clip_detectors_are_registered_with_clear_parameter_errors(backbone):
    assert set(detectors.available("clip")) >= {"mcm", "glmcm", "neglabel", "locoop", "idlike", "clipn"}
    with pytest.raises(TypeError, match="unknown parameter"):
        detectors.build("mcm", model=backbone, class_names=["a"], lamda=1.0)
    with pytest.raises(ValueError, match="class_names"):
        detectors.build("mcm", model=backbone).class_text()
