"""CLIPN: losses and CTW/ATD against their formulas, the "no" tower, training, save/load and the open_clip converter."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.images import CLASSES, colour_images
from scipy.special import softmax

import detectors
from detectors.base import Detector, ImageSet
from detectors.clip.clipn import NoTextTower, binary_opposite_losses, semantic_opposite_loss
from detectors.clip.clipn_convert import convert_clipn, convert_state_dict
from detectors.clip.scores import clipn_atd, clipn_ctw, clipn_probabilities


def unit(a: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.normalize(a.double(), dim=-1)


def test_ctw_and_atd_equal_their_formulas():
    gen = torch.Generator().manual_seed(0)
    img, yes, no = (unit(torch.randn(5, 8, generator=gen)), unit(torch.randn(3, 8, generator=gen)),
                    unit(torch.randn(3, 8, generator=gen)))
    p, p_no = clipn_probabilities(img, yes, no, scale=10.0)
    ly, ln = 10 * img.numpy() @ yes.numpy().T, 10 * img.numpy() @ no.numpy().T
    probs = softmax(ly, axis=1)
    pno = np.exp(ln) / (np.exp(ly) + np.exp(ln))
    pred = probs.argmax(1)
    np.testing.assert_allclose(clipn_ctw(p, p_no), 1 - pno[np.arange(5), pred], rtol=1e-6)
    np.testing.assert_allclose(clipn_atd(p, p_no), (probs * (1 - pno)).sum(1), rtol=1e-6)


def test_clipn_losses_equal_hand_computation():
    gen = torch.Generator().manual_seed(1)
    img, yes, no = (unit(torch.randn(4, 6, generator=gen)), unit(torch.randn(4, 6, generator=gen)),
                    unit(torch.randn(4, 6, generator=gen)))
    bin_yes, bin_no = binary_opposite_losses(img, yes, no, scale=5.0)
    ly, ln = 5 * img.numpy() @ yes.numpy().T, 5 * img.numpy() @ no.numpy().T
    p_yes = np.exp(ly) / (np.exp(ly) + np.exp(ln))
    np.testing.assert_allclose(float(bin_yes), np.mean([-np.log(p_yes[i, i]) for i in range(4)]), rtol=1e-10)
    np.testing.assert_allclose(float(bin_no),
                               np.mean([-np.log(1 - p_yes[i, j]) for i in range(4) for j in range(4) if i != j]),
                               rtol=1e-10)
    dist = np.linalg.norm(yes.numpy() - no.numpy(), axis=1)
    np.testing.assert_allclose(float(semantic_opposite_loss(yes, no, eps=0.0)), np.mean(2 - dist), rtol=1e-8)


def test_untrained_no_tower_equals_the_text_tower(backbone):
    tower = NoTextTower.from_clip(backbone.model, n_prompts=4)
    ids = backbone.tokenize(["a photo of a red.", "a photo of a green."])
    with torch.no_grad():
        got = tower(backbone, ids)
    torch.testing.assert_close(got, backbone.encode_texts(["a photo of a red.", "a photo of a green."]), rtol=1e-5,
                               atol=1e-6)


def test_clipn_training_save_and_load(backbone, tmp_path):
    train = ImageSet(images=colour_images([0], 4, 0) + colour_images([1], 4, 1), labels=np.array([0] * 4 + [1] * 4))
    det = detectors.build("clipn", model=backbone, class_names=CLASSES, epochs=4, lr=1e-3, train_batch=4,
                          progress=False)
    det.fit(train)
    assert len(det.losses) == 8 and np.isfinite(det.losses).all()
    assert float(det.tower.prompt.detach().abs().sum()) > 0  # the prompts learned
    test = ImageSet(images=colour_images([0, 1], 3, 2))
    det.save_pretrained(tmp_path / "clipn")
    loaded = Detector.from_pretrained(tmp_path / "clipn", model=backbone, score_rule="ctw")
    for key, value in det.state().items():
        np.testing.assert_array_equal(loaded.state()[key], value)
    p, p_no = clipn_probabilities(det.features(test).global_, det.class_text(), det.no_text(), 100.0)
    np.testing.assert_allclose(loaded.score(test), clipn_ctw(p, p_no), rtol=1e-6)
    np.testing.assert_allclose(det.score(test), clipn_atd(p, p_no), rtol=1e-6)


def open_clip_state_dict(model, seed: int = 0) -> dict[str, torch.Tensor]:
    """A random CLIPN state dict in the open_clip layout (keys as CLIPN's open_clip model code) sized like `model`."""
    gen = torch.Generator().manual_seed(seed)
    vc, tc = model.config.vision_config, model.config.text_config
    rnd = lambda *shape: 0.2 * torch.randn(*shape, generator=gen)  # noqa: E731

    def blocks(prefix: str, width: int, mlp: int, layers: int) -> dict[str, torch.Tensor]:
        out = {}
        for i in range(layers):
            b = f"{prefix}.resblocks.{i}."
            out |= {b + "ln_1.weight": rnd(width), b + "ln_1.bias": rnd(width),
                    b + "attn.in_proj_weight": rnd(3 * width, width),
                    b + "attn.in_proj_bias": rnd(3 * width), b + "attn.out_proj.weight": rnd(width, width),
                    b + "attn.out_proj.bias": rnd(width), b + "ln_2.weight": rnd(width), b + "ln_2.bias": rnd(width),
                    b + "mlp.c_fc.weight": rnd(mlp, width), b + "mlp.c_fc.bias": rnd(mlp),
                    b + "mlp.c_proj.weight": rnd(width, mlp), b + "mlp.c_proj.bias": rnd(width)}
        return out

    vw, tw, proj = vc.hidden_size, tc.hidden_size, model.config.projection_dim
    grid = (vc.image_size // vc.patch_size) ** 2
    state = {"visual.class_embedding": rnd(vw), "visual.positional_embedding": rnd(grid + 1, vw),
             "visual.proj": rnd(vw, proj), "visual.conv1.weight": rnd(vw, 3, vc.patch_size, vc.patch_size),
             "visual.ln_pre.weight": rnd(vw), "visual.ln_pre.bias": rnd(vw), "visual.ln_post.weight": rnd(vw),
             "visual.ln_post.bias": rnd(vw), "logit_scale": rnd(())}
    state |= blocks("visual.transformer", vw, vc.intermediate_size, vc.num_hidden_layers)
    for suffix in ("", "_no"):
        state |= {f"token_embedding{suffix}.weight": rnd(tc.vocab_size, tw),
                  f"positional_embedding{suffix}": rnd(tc.max_position_embeddings, tw),
                  f"ln_final{suffix}.weight": rnd(tw), f"ln_final{suffix}.bias": rnd(tw),
                  f"text_projection{suffix}": rnd(tw, proj)}
        state |= blocks(f"transformer{suffix}", tw, tc.intermediate_size, tc.num_hidden_layers)
    state["prompt_no"] = rnd(16, tc.max_position_embeddings, tw)
    return {f"module.{k}": v for k, v in state.items()}


def test_converter_maps_every_key(backbone, tmp_path):
    state = open_clip_state_dict(backbone.model)
    path = tmp_path / "clipn_vit.pt"
    torch.save({"epoch": 10, "state_dict": state}, path)
    out = convert_clipn(path, tmp_path / "converted", processor=backbone.processor, head_width=8, class_names=CLASSES)
    det = Detector.from_pretrained(out)
    model = det.backbone.model
    bare = {k[len("module."):]: v for k, v in state.items()}
    clip_sd, no_sd = convert_state_dict(bare)
    n_attn = sum(k.endswith("attn.in_proj_weight") or k.endswith("attn.in_proj_bias") for k in bare)
    assert len(clip_sd) + len(no_sd) == len(bare) + 2 * n_attn  # every key mapped, q/k/v split in three
    assert set(clip_sd) == set(model.state_dict())
    assert set(no_sd) == {"no." + k for k in det.tower.state_dict()}
    w = bare["visual.transformer.resblocks.1.attn.in_proj_weight"]
    layer = model.vision_model.encoder.layers[1].self_attn
    torch.testing.assert_close(torch.cat([layer.q_proj.weight, layer.k_proj.weight, layer.v_proj.weight]), w)
    torch.testing.assert_close(model.visual_projection.weight, bare["visual.proj"].T)
    torch.testing.assert_close(model.text_model.encoder.layers[0].mlp.fc2.bias,
                               bare["transformer.resblocks.0.mlp.c_proj.bias"])
    torch.testing.assert_close(det.tower.projection.weight, bare["text_projection_no"].T)
    torch.testing.assert_close(det.tower.prompt, bare["prompt_no"])
    torch.testing.assert_close(det.tower.text_model.embeddings.position_embedding.weight,
                               bare["positional_embedding_no"])
    assert np.isfinite(det.score(ImageSet(images=colour_images([0], 2, 3)))).all()


def test_converter_rejects_unknown_keys():
    with pytest.raises(KeyError, match="visual.attnpool.c_proj.weight"):
        convert_state_dict({"visual.attnpool.c_proj.weight": torch.zeros(2, 2)})
    with pytest.raises(KeyError, match="attn.q_norm"):
        convert_state_dict({"transformer.resblocks.0.attn.q_norm.weight": torch.zeros(2)})


def open_clip_blocks(x: torch.Tensor, sd: dict[str, torch.Tensor], prefix: str, heads: int,
                     mask: torch.Tensor | None) -> torch.Tensor:
    """open_clip's ResidualAttentionBlocks (nn.MultiheadAttention with packed in_proj, GELU MLP), batch-first input."""
    F = torch.nn.functional
    width = x.shape[-1]
    i = 0
    while f"{prefix}.resblocks.{i}.ln_1.weight" in sd:
        b = lambda name, i=i: sd[f"{prefix}.resblocks.{i}.{name}"]  # noqa: E731
        h = F.layer_norm(x, (width,), b("ln_1.weight"), b("ln_1.bias")).transpose(0, 1)
        attn, _ = F.multi_head_attention_forward(h, h, h, width, heads, b("attn.in_proj_weight"),
                                                 b("attn.in_proj_bias"),
                                                 None, None, False, 0.0, b("attn.out_proj.weight"),
                                                 b("attn.out_proj.bias"), need_weights=False, attn_mask=mask)
        x = x + attn.transpose(0, 1)
        h = F.layer_norm(x, (width,), b("ln_2.weight"), b("ln_2.bias"))
        x = x + F.linear(F.gelu(F.linear(h, b("mlp.c_fc.weight"), b("mlp.c_fc.bias"))), b("mlp.c_proj.weight"),
                         b("mlp.c_proj.bias"))
        i += 1
    return x


def test_converted_weights_compute_what_open_clip_computes(backbone, tmp_path):
    F = torch.nn.functional
    sd = {k[len("module."):]: v for k, v in open_clip_state_dict(backbone.model, seed=3).items()}
    det = Detector.from_pretrained(convert_clipn(sd, tmp_path / "c", processor=backbone.processor, head_width=8,
                                                 class_names=CLASSES))
    model, heads = det.backbone.model, 32 // 8
    pixels = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    # image tower, written from CLIPN's open_clip VisualTransformer
    x = F.conv2d(pixels, sd["visual.conv1.weight"], stride=8).flatten(2).transpose(1, 2)
    x = torch.cat([sd["visual.class_embedding"].expand(2, 1, -1), x], dim=1) + sd["visual.positional_embedding"]
    x = F.layer_norm(x, (32,), sd["visual.ln_pre.weight"], sd["visual.ln_pre.bias"])
    x = open_clip_blocks(x, sd, "visual.transformer", heads, None)
    expected = F.layer_norm(x[:, 0], (32,), sd["visual.ln_post.weight"], sd["visual.ln_post.bias"]) @ sd["visual.proj"]
    with torch.no_grad():
        torch.testing.assert_close(model.get_image_features(pixel_values=pixels).pooler_output, expected, rtol=1e-4,
                                   atol=1e-5)
    # "yes" and "no" text towers, written from CLIPN's encode_text (the "no" one adds the mean prompt at inference)
    ids = det.backbone.tokenize(["a photo of a red.", "no"])
    length = ids.shape[1]
    causal = torch.full((length, length), float("-inf")).triu(1)
    eot = (ids == det.backbone.eos_token_id).int().argmax(1)
    for suffix, extra in (("", 0.0), ("_no", sd["prompt_no"].mean(0)[:length])):
        t = sd[f"token_embedding{suffix}.weight"][ids] + sd[f"positional_embedding{suffix}"][:length] + extra
        t = open_clip_blocks(t, sd, f"transformer{suffix}", heads, causal)
        t = F.layer_norm(t, (32,), sd[f"ln_final{suffix}.weight"], sd[f"ln_final{suffix}.bias"])
        ref = t[torch.arange(2), eot] @ sd[f"text_projection{suffix}"]
        with torch.no_grad():
            got = (model.get_text_features(input_ids=ids).pooler_output if not suffix
                   else det.tower(det.backbone, ids))
        torch.testing.assert_close(F.normalize(got, dim=-1), F.normalize(ref, dim=-1), rtol=1e-4, atol=1e-5)


def test_binary_opposite_loss_never_pushes_a_shared_caption_to_no():
    from detectors.clip.clipn import same_caption

    gen = torch.Generator().manual_seed(4)
    img, yes, no = (unit(torch.randn(5, 6, generator=gen)), unit(torch.randn(5, 6, generator=gen)),
                    unit(torch.randn(5, 6, generator=gen)))
    ids = torch.tensor([[1, 7, 2], [1, 8, 2], [1, 7, 2], [1, 9, 2], [1, 8, 2]])  # captions 0 = 2 and 1 = 4
    match = same_caption(ids)
    assert match.sum() == 5 + 4 and match[0, 2] and match[4, 1] and not match[0, 1]
    bin_yes, bin_no = binary_opposite_losses(img, yes, no, scale=5.0, match=match)
    ly, ln = 5 * img.numpy() @ yes.numpy().T, 5 * img.numpy() @ no.numpy().T
    p_yes = np.exp(ly) / (np.exp(ly) + np.exp(ln))
    same = [(i, j) for i in range(5) for j in range(5) if ids[i].tolist() == ids[j].tolist()]
    other = [(i, j) for i in range(5) for j in range(5) if ids[i].tolist() != ids[j].tolist()]
    np.testing.assert_allclose(float(bin_yes), np.mean([-np.log(p_yes[i, j]) for i, j in same]), rtol=1e-10)
    np.testing.assert_allclose(float(bin_no), np.mean([-np.log(1 - p_yes[i, j]) for i, j in other]), rtol=1e-10)
    # unique captions: the official identity (`eyes`), sums divided by N and N^2 - N
    unique = torch.arange(5)[:, None]
    assert torch.equal(same_caption(unique), torch.eye(5, dtype=torch.bool))
    eye = np.eye(5)
    official_yes = (eye * -np.log(p_yes)).sum() / 5
    official_no = ((1 - eye) * -np.log(1 - p_yes)).sum() / 20
    got = binary_opposite_losses(img, yes, no, scale=5.0, match=same_caption(unique))
    np.testing.assert_allclose([float(got[0]), float(got[1])], [official_yes, official_no], rtol=1e-10)


def test_clipn_training_follows_the_official_optimiser_and_schedule(backbone):
    from detectors.clip.clipn import parameter_groups

    tower = NoTextTower.from_clip(backbone.model, n_prompts=4)
    decay_free, decayed = parameter_groups(tower, 0.2)
    named = dict(tower.named_parameters())
    expected_free = {n for n, p in named.items() if p.ndim < 2 or "norm" in n}  # every gain and bias; no embedding
    assert ({id(p) for p in decay_free["params"]} == {id(named[n]) for n in expected_free}
            and decay_free["weight_decay"] == 0.0)
    assert decayed["weight_decay"] == 0.2 and any(p is tower.prompt for p in decayed["params"])
    assert all(n.endswith("bias") or "norm" in n for n in expected_free)

    train = ImageSet(images=colour_images([0], 3, 0) + colour_images([1], 3, 1), labels=np.array([0] * 3 + [1] * 3))
    det = detectors.build("clipn", model=backbone, class_names=CLASSES, epochs=3, lr=1e-3, train_batch=4,
                          progress=False)
    det.fit(train)
    total = 3 * 2  # 3 epochs x 2 batches: the cosine is set before every step, from the base lr at step 0
    np.testing.assert_allclose(det.lrs, [0.5 * (1 + np.cos(np.pi * s / total)) * 1e-3 for s in range(total)])
    full = detectors.build("clipn", model=backbone, class_names=CLASSES, epochs=1, lr=1e-3, train_batch=4,
                           loss_weight=1.0, progress=False).fit(train)
    np.testing.assert_allclose(det.losses[0], 0.5 * full.losses[0], rtol=1e-6)  # total loss halved, as the official
    assert det.params["templates"][0] == "'a bad photo of a {}.'" and len(det.params["templates"]) == 128
