"""Runtime policy (dtype, seeds, clear loading errors) and atomic writes."""
import os

import pytest
import torch

from pipelines.io import atomic_path, atomic_write_json, atomic_write_text
from pipelines.runtime import item_generator, item_seed, load_pretrained, resolve_dtype


def test_dtype_policy():
    assert resolve_dtype("auto", "cpu") == torch.float32
    assert resolve_dtype("bf16", "cpu") == torch.bfloat16
    assert resolve_dtype("fp16", "cpu") == torch.float16
    with pytest.raises(ValueError, match="precision"):
        resolve_dtype("fp8", "cpu")


def test_item_seed_depends_only_on_seed_and_key():
    assert item_seed(42, 7) == item_seed(42, 7)
    assert len({item_seed(42, i) for i in range(1000)}) == 1000
    assert item_seed(42, 7) != item_seed(43, 7)
    a = torch.randn(3, generator=item_generator(item_seed(1, 5)))
    b = torch.randn(3, generator=item_generator(item_seed(1, 5)))
    assert torch.equal(a, b)


def test_offline_error_names_id_and_folder_hint(monkeypatch):
    def loader(name, **kwargs):
        raise OSError("We couldn't connect to the hub")

    with pytest.raises(OSError) as err:
        load_pretrained(loader, "stabilityai/not-cached", "base model")
    assert "stabilityai/not-cached" in str(err.value) and "local folder" in str(err.value)


def test_atomic_write_leaves_nothing_on_error(tmp_path):
    target = tmp_path / "out.json"
    atomic_write_json(target, {"a": 1})
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("partial")
            raise RuntimeError("crash mid-write")
    assert target.read_text().strip().startswith("{") and '"a": 1' in target.read_text()
    assert sorted(os.listdir(tmp_path)) == ["out.json"]
    atomic_write_text(tmp_path / "sub" / "t.txt", "hi")
    assert (tmp_path / "sub" / "t.txt").read_text() == "hi"


SDXL_FILES = [  # the layout of stabilityai/stable-diffusion-xl-base-1.0 (abridged)
    "model_index.json", "sd_xl_base_1.0.safetensors", "unet/config.json", "unet/diffusion_pytorch_model.safetensors",
    "unet/diffusion_pytorch_model.fp16.safetensors", "vae/diffusion_pytorch_model.safetensors",
    "vae/diffusion_pytorch_model.fp16.safetensors", "text_encoder/model.safetensors", "text_encoder/model.fp16.safetensors",
]


def _fake_hub_cache(monkeypatch, root, repo_id, files, commit="a" * 40):
    """A hub cache holding `files` for `repo_id` at `commit` (refs/main + snapshots/<commit>)."""
    import huggingface_hub.constants

    folder = root / ("models--" + repo_id.replace("/", "--"))
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / "main").write_text(commit)
    for name in files:
        (folder / "snapshots" / commit / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / "snapshots" / commit / name).write_bytes(b"x")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(root))


def test_fp16_variant_is_chosen_for_half_precision_when_the_repo_ships_it(monkeypatch, tmp_path):
    from huggingface_hub import HfApi

    from pipelines.runtime import has_variant, select_variant

    listings = {"stabilityai/stable-diffusion-xl-base-1.0": SDXL_FILES,
                "madebyollin/sdxl-vae-fp16-fix": ["config.json", "diffusion_pytorch_model.safetensors",
                                                  "sdxl_vae.safetensors"]}
    asked = []

    def list_repo_files(self, repo_id, **kwargs):
        asked.append(repo_id)
        return listings[repo_id]

    monkeypatch.setattr(HfApi, "list_repo_files", list_repo_files)
    import huggingface_hub.constants
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty_cache"))
    sdxl = "stabilityai/stable-diffusion-xl-base-1.0"
    assert select_variant(sdxl, torch.float16) == "fp16" and select_variant(sdxl, torch.bfloat16) == "fp16"
    assert select_variant(sdxl, torch.float32) is None
    assert select_variant("madebyollin/sdxl-vae-fp16-fix", torch.float16) is None  # "fp16" in the name is not a variant
    assert asked == [sdxl, sdxl, "madebyollin/sdxl-vae-fp16-fix"]  # fp32 never lists
    assert has_variant(SDXL_FILES, "fp16", "unet") and not has_variant(SDXL_FILES, "fp16", "scheduler")
    assert has_variant(["text_encoder_2/model.fp16-00001-of-00002.safetensors"], "fp16")
    assert not has_variant(["unet/diffusion_pytorch_model.safetensors", "fp16/model.safetensors"], "fp16")

    local = tmp_path / "controlnet"  # a local folder without variant files loads as is; with them, the variant
    local.mkdir()
    (local / "diffusion_pytorch_model.safetensors").write_bytes(b"x")
    assert select_variant(local, torch.float16) is None
    (local / "diffusion_pytorch_model.fp16.safetensors").write_bytes(b"x")
    assert select_variant(local, torch.float16) == "fp16" and len(asked) == 3


def test_variant_listing_prefers_the_cache_and_never_fails_offline(monkeypatch, tmp_path):
    from huggingface_hub import HfApi

    from pipelines.runtime import list_model_files, select_variant

    def offline(self, repo_id, **kwargs):
        raise OSError("offline")

    monkeypatch.setattr(HfApi, "list_repo_files", offline)
    _fake_hub_cache(monkeypatch, tmp_path, "org/cached", ["unet/diffusion_pytorch_model.fp16.safetensors"])
    assert list_model_files("org/cached") == ["unet/diffusion_pytorch_model.fp16.safetensors"]
    assert select_variant("org/cached", torch.bfloat16) == "fp16"
    assert select_variant("org/not-cached", torch.bfloat16) is None


def test_model_revision_is_the_cached_commit_or_a_folder_hash(monkeypatch, tmp_path):
    import shutil

    from pipelines.runtime import folder_hash, model_revision

    commit = "0123456789abcdef0123456789abcdef01234567"
    _fake_hub_cache(monkeypatch, tmp_path / "cache", "org/model", ["config.json"], commit)
    assert model_revision("org/model") == commit
    assert model_revision("org/never-downloaded") is None and model_revision(None) is None
    folder = tmp_path / "local"
    (folder / "sub").mkdir(parents=True)
    (folder / "config.json").write_text('{"a": 1}')
    (folder / "sub" / "weights.bin").write_bytes(bytes(range(256)) * 20_000)  # 5 MB: head and tail hashed
    revision = model_revision(folder)
    assert revision == folder_hash(folder) and revision.startswith("sha256:") and len(revision) == 23
    shutil.copytree(folder, tmp_path / "copy")
    assert folder_hash(tmp_path / "copy") == revision  # content, not location
    (tmp_path / "copy" / "config.json").write_text('{"a": 2}')
    assert folder_hash(tmp_path / "copy") != revision
    shutil.copytree(folder, tmp_path / "tail")
    with open(tmp_path / "tail" / "sub" / "weights.bin", "r+b") as fh:
        fh.seek(-1, 2)
        fh.write(b"\x00")
    assert folder_hash(tmp_path / "tail") != revision
