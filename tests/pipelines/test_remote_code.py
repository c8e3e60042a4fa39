"""No remote code, ever (a model folder whose config.json has an `auto_map` and an unknown `model_type` makes
transformers ask on stdin, and "y" piped in would run the folder's Python). Every load
goes through `pipelines.runtime.load_pretrained`: the folder is refused in one line before the library sees it, and
the library is told `trust_remote_code=False` all the same (the second lock, tested on its own here). The command
run with "y" on stdin is in tests/pipelines/test_untrusted_files.py."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pipelines.runtime import CustomCodeRefused, _remote_code_flag, custom_code_reason, load_pretrained

ROOT = Path(__file__).resolve().parents[2]


def evil_folder(folder: Path, marker: Path, config: dict | None = None, file: str = "config.json") -> Path:
    """A model folder whose config maps its classes to `evil.py`, which creates `marker` when it is imported."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "evil.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n"
        "from transformers import PretrainedConfig, PreTrainedModel\n"
        "class EvilConfig(PretrainedConfig):\n    model_type = 'evilnet'\n"
        "class EvilModel(PreTrainedModel):\n    config_class = EvilConfig\n")
    config = config if config is not None else {
        "model_type": "evilnet", "num_labels": 2,
        "auto_map": {"AutoConfig": "evil.EvilConfig", "AutoModelForImageClassification": "evil.EvilModel"}}
    (folder / file).parent.mkdir(parents=True, exist_ok=True)
    (folder / file).write_text(json.dumps(config))
    return folder


def test_the_issues_folder_is_refused_before_transformers_reads_it(tmp_path):
    from transformers import AutoConfig, AutoImageProcessor, AutoModelForImageClassification

    marker = tmp_path / "ran"
    folder = evil_folder(tmp_path / "evil", marker)
    for loader in (AutoConfig.from_pretrained, AutoModelForImageClassification.from_pretrained,
                   AutoImageProcessor.from_pretrained):
        with pytest.raises(CustomCodeRefused) as err:
            load_pretrained(loader, folder, "image classifier")
        message = str(err.value)
        assert "config.json maps its model_type 'evilnet' to Python code in the folder" in message
        assert "never runs a model folder's own code" in message and "\n" not in message
        assert "trust_remote_code=True" not in message  # no advice to turn the safety off
    assert not marker.exists()


def test_transformers_is_told_trust_remote_code_false_too(tmp_path, monkeypatch):
    """With the folder check switched off, transformers itself refuses (no prompt: stdin is never read)."""
    from transformers import AutoConfig, AutoModelForImageClassification

    import pipelines.runtime as runtime

    marker = tmp_path / "ran"
    folder = evil_folder(tmp_path / "evil", marker)
    monkeypatch.setattr(runtime, "custom_code_reason", lambda folder: None)
    monkeypatch.setattr("builtins.input", lambda *a: pytest.fail("transformers asked on stdin"))
    for loader in (AutoConfig.from_pretrained, AutoModelForImageClassification.from_pretrained):
        with pytest.raises(CustomCodeRefused, match="needs Python code of its own") as err:
            load_pretrained(loader, folder, "image classifier")
        assert "trust_remote_code=True" not in str(err.value) and "\n" not in str(err.value)
    assert not marker.exists()


def test_every_config_kind_that_names_code_is_found(tmp_path):
    marker = tmp_path / "ran"
    processor = evil_folder(tmp_path / "p", marker, {"image_processor_type": "EvilProcessor",
                                                      "auto_map": {"AutoImageProcessor": "evil.EvilProcessor"}},
                            "preprocessor_config.json")
    assert "preprocessor_config.json maps its classes to Python code" in custom_code_reason(processor)
    tokenizer = evil_folder(tmp_path / "t", marker, {"tokenizer_class": "EvilTokenizer",
                                                      "auto_map": {"AutoTokenizer": ["evil.EvilTokenizer", None]}},
                            "tokenizer_config.json")
    assert "tokenizer_config.json maps its classes" in custom_code_reason(tokenizer)
    pipeline = evil_folder(tmp_path / "d", marker, {"_class_name": "StableDiffusionPipeline",
                                                     "unet": ["evil_unet", "EvilUNet"],
                                                     "vae": ["diffusers", "AutoencoderKL"]},
                           "model_index.json")
    assert "component 'unet' comes from 'evil_unet'" in custom_code_reason(pipeline)
    custom_pipeline = evil_folder(tmp_path / "c", marker, {"_class_name": "EvilPipeline"}, "model_index.json")
    assert "the pipeline class 'EvilPipeline' is not one of diffusers'" in custom_code_reason(custom_pipeline)
    component = evil_folder(tmp_path / "u", marker,
                            {"_class_name": "EvilUNet", "auto_map": {"AutoModel": "evil.EvilUNet"}}, "unet/config.json")
    assert "unet/config.json maps its classes" in custom_code_reason(component)
    assert not marker.exists()


def test_an_auto_map_beside_a_native_model_type_is_refused_and_loads_once_removed(tmp_path):
    """An `auto_map` beside a model_type transformers implements (resnet) would load as transformers' ResNet,
    another model than the folder's author meant; the README promises such a folder is refused. Nothing
    runs either way, and the message says how to load it as the library's own."""
    from pipelines.classifier import ImageClassifier
    from pipelines.tiny import RESNET_ID, save_tiny_model

    folder = save_tiny_model(tmp_path / "resnet", RESNET_ID)
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoModelForImageClassification": "evil.EvilModel"}
    (folder / "config.json").write_text(json.dumps(config))
    marker = tmp_path / "ran"
    evil_folder(tmp_path / "code", marker)  # the code module, copied beside the config
    (folder / "evil.py").write_text((tmp_path / "code" / "evil.py").read_text())
    with pytest.raises(CustomCodeRefused) as err:
        ImageClassifier.from_pretrained(folder)
    message = str(err.value)
    assert "config.json maps its model_type 'resnet' to Python code in the folder" in message and "\n" not in message
    assert "remove `auto_map` from config.json to load it as the library's own" in message
    del config["auto_map"]
    (folder / "config.json").write_text(json.dumps(config))
    assert custom_code_reason(folder) is None
    clf = ImageClassifier.from_pretrained(folder)
    assert type(clf.model).__name__ == "ResNetForImageClassification" and not marker.exists()


def test_the_libraries_loaders_are_given_the_flag_and_no_source_turns_it_on():
    from diffusers import DiffusionPipeline, UNet2DModel
    from transformers import AutoConfig, CLIPModel, CLIPProcessor

    for loader in (AutoConfig.from_pretrained, CLIPModel.from_pretrained, CLIPProcessor.from_pretrained,
                   UNet2DModel.from_pretrained, DiffusionPipeline.from_pretrained):
        assert _remote_code_flag(loader) == {"trust_remote_code": False}, loader
    assert _remote_code_flag(print) == {}
    turned_on = [f"{path.relative_to(ROOT)}:{n}" for folder in ("pipelines", "detectors", "gen", "oodforge", "scripts")
                 for path in sorted((ROOT / folder).rglob("*.py"))
                 for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
                 if re.search(r"trust_remote_code\s*=\s*True", line)]
    assert turned_on == []
