"""Every tiny stand-in is its model id's real hub config with only size fields shrunk.

Per model id: build the stand-in with `pipelines.tiny`, read back the config files it saved, resolve both sides
through the libraries' own config classes (`pipelines.hub.saved_effective` / `real_effective`), and require that the
differing fields are exactly the size fields `pipelines.tiny.TINY` lists for that file (and hold the listed values).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from gen.tiny_zest import save_tiny_zest
from pipelines import hub, tiny


def _saved_files(model_id: str, root: Path) -> dict[str, Path]:
    """Where the stand-in of `model_id` saved each kept config file."""
    if model_id == tiny.SDXL_ID:
        return {file: root / "zest" / "sdxl" / file for file in tiny.TINY[model_id]}
    if model_id == tiny.CONTROLNET_ID:
        return {"config.json": root / "zest" / "controlnet" / "config.json"}
    if model_id == tiny.IP_ADAPTER_ID:
        return {tiny.IMAGE_ENCODER_FILE: root / "zest" / "ip_adapter" / tiny.IMAGE_ENCODER_FILE}
    if model_id == tiny.DPT_ID:
        return {file: root / "zest" / "depth" / file for file in tiny.TINY[model_id]}
    return {file: root / model_id / file for file in tiny.TINY[model_id]}


@pytest.fixture(scope="module")
def standins(tmp_path_factory):
    root = tmp_path_factory.mktemp("standins")
    save_tiny_zest(root / "zest")
    tiny.save_tiny_clip(root / tiny.CLIP_ID)
    for model_id in (tiny.SD15_ID, tiny.SD21_ID):
        tiny.save_tiny_stable_diffusion(root / model_id, model_id=model_id)
    for model_id in (tiny.RESNET_ID, tiny.SDXL_VAE_FP16_ID):
        tiny.save_tiny_model(root / model_id, model_id)
    return root


def test_every_default_model_id_has_a_kept_config_and_a_source_note():
    for model_id in tiny.TINY:
        folder = hub.model_dir(model_id)
        source = (folder / "SOURCE.md").read_text(encoding="utf-8")
        for file in tiny.TINY[model_id]:
            assert (folder / file).is_file(), f"{model_id}: {file} not kept"
            assert file in source, f"{model_id}: SOURCE.md does not name {file}"


def test_the_shrink_table_names_size_fields_only():
    for model_id, files in tiny.TINY.items():
        for file, fields in files.items():
            assert {key.split(".")[-1] for key in fields} <= hub.SIZE_FIELDS, (model_id, file)


@pytest.mark.parametrize("model_id", sorted(tiny.TINY))
def test_standin_differs_from_the_real_config_in_size_fields_only(standins, model_id):
    for file, path in _saved_files(model_id, standins).items():
        real = hub.real_config(model_id, file)
        kind = hub.kind_of(file, real)
        cls = hub.image_processor_class(real) if kind == "image_processor" else None
        diff = hub.config_diff(hub.real_effective(model_id, file), hub.saved_effective(path, kind, cls))
        allowed = (set(tiny.TINY[model_id][file])
                   | set(tiny.OMITTED_COMPONENTS.get(model_id, ()) if kind == "pipeline" else ()))
        # a size field kept in a legacy section the library folds into another one (CLIP's vision_config_dict)
        allowed_effective = {key for key in allowed if not key.startswith("vision_config_dict.")}
        assert set(diff) <= allowed_effective, f"{model_id} {file}: non-size fields differ: " \
                                               f"{ {k: v for k, v in diff.items() if k not in allowed_effective} }"
        saved = hub.leaves(hub.saved_effective(path, kind, cls))
        for key in allowed_effective & set(tiny.TINY[model_id][file]) - hub.SIZE_DICT_FIELDS:
            assert saved[key] == hub.plain(tiny.TINY[model_id][file][key]), \
                f"{model_id} {file}: {key} is not the listed tiny value"


def test_clip_standin_keeps_openai_token_id_quirk(standins):
    """Like the real checkpoint: config eos 2 / bos 0 / pad 1, the tokenizer's end-of-text id is its last id."""
    from transformers import CLIPConfig, CLIPTokenizer

    folder = standins / tiny.CLIP_ID
    text = CLIPConfig.from_pretrained(folder).text_config
    tokenizer = CLIPTokenizer.from_pretrained(folder)
    assert (text.bos_token_id, text.eos_token_id, text.pad_token_id) == (0, 2, 1)
    assert tokenizer.eos_token_id == len(tokenizer) - 1 != text.eos_token_id
    assert tokenizer.convert_ids_to_tokens(2) == "#"  # as in the real vocabulary: '#' is id 2


def test_sdxl_standin_tokenizer_2_pads_with_exclamation_mark(standins):
    from transformers import CLIPTokenizer

    first = CLIPTokenizer.from_pretrained(standins / "zest" / "sdxl" / "tokenizer")
    second = CLIPTokenizer.from_pretrained(standins / "zest" / "sdxl" / "tokenizer_2")
    assert (first.pad_token, second.pad_token) == ("<|endoftext|>", "!")


def test_diff_reports_a_changed_quirk():
    """The check is not vacuous: a stand-in with CLIP's eos id 'fixed' to the tokenizer's fails it."""
    real = hub.real_effective(tiny.CLIP_ID, "config.json")
    changed = json.loads(json.dumps(real))
    changed["text_config"]["eos_token_id"] = 49407
    assert set(hub.config_diff(real, changed)) == {"text_config.eos_token_id"}


def test_standin_fingerprint_follows_the_shrink_table(monkeypatch):
    before = tiny.standin_fingerprint()
    assert before == tiny.standin_fingerprint() and len(before) == 16
    monkeypatch.setitem(tiny.TINY[tiny.CLIP_ID]["config.json"], "projection_dim", 8)
    assert tiny.standin_fingerprint() != before
