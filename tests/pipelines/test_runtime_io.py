"""Runtime policy (dtype, seeds, clear loading errors) and atomic writes (umask kept, orphans of killed writers
removed, a full disk or a refused write one line naming the file)."""
import errno
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import pipelines.io as io
from pipelines.io import atomic_path, atomic_write_json, atomic_write_text, remove_orphan_temps
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


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o077])
def test_atomic_writes_keep_the_umask(tmp_path, umask):
    """0666 minus the umask, as `open` gives: 0644 under 022 (readable by other accounts), not mkstemp's 0600."""
    old = os.umask(umask)
    try:
        atomic_write_text(tmp_path / "a.txt", "x")
        with atomic_path(tmp_path / "b.bin") as tmp:
            assert stat.S_IMODE(tmp.stat().st_mode) == 0o666 & ~umask  # the temp file already has the final mode
            tmp.write_bytes(b"y")
        plain = tmp_path / "plain.txt"
        plain.write_text("z")
    finally:
        os.umask(old)
    for name in ("a.txt", "b.bin"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == stat.S_IMODE(plain.stat().st_mode) == 0o666 & ~umask


def _dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)


def test_only_orphaned_temp_files_are_removed(tmp_path, monkeypatch):
    host = io._host()
    (tmp_path / "sub").mkdir()
    dead = _dead_pid()
    orphans = [tmp_path / f".r.csv.ab12cd34.{host}-{dead}.tmp.csv",  # its writer is gone
               tmp_path / "sub" / f".c.safetensors.00ff00ff.{host}-{dead}.tmp.safetensors",
               tmp_path / ".m.json.k2x9_q7z.tmp.json",  # the older name, which recorded no writer
               tmp_path / f".old.png.ab12cd34.0badf00d-{os.getpid()}.tmp.png"]  # another host's, a day old
    kept = [tmp_path / f".live.csv.ab12cd34.{host}-{os.getpid()}.tmp.csv",  # a writer still running (this process)
            tmp_path / f".new.png.ab12cd34.0badf00d-{dead}.tmp.png",  # another host's, recent: it may still run
            tmp_path / ".tmp", tmp_path / ".notes.tmp", tmp_path / "data.tmp.csv", tmp_path / "x.csv"]  # not ours
    for path in orphans + kept:
        path.write_text("partial")
    day = time.time() - io.FOREIGN_TEMP_SECONDS - 60
    os.utime(orphans[-1], (day, day))
    (tmp_path / f".link.csv.ab12cd34.{host}-{dead}.tmp.csv").symlink_to(tmp_path / "x.csv")
    assert remove_orphan_temps(tmp_path / "missing") == 0
    assert remove_orphan_temps(tmp_path, recursive=False) == 3
    assert remove_orphan_temps(tmp_path) == 1
    assert all(not p.exists() for p in orphans) and all(p.exists() for p in kept)
    assert (tmp_path / "x.csv").read_text() == "partial"  # the symlink's target is untouched


WRITER = """
import sys, time
from pipelines.io import atomic_path
with atomic_path(sys.argv[1]) as tmp:
    with open(tmp, "wb") as fh:
        fh.write(b"half of the bytes")
        fh.flush()
        print(tmp, flush=True)
        time.sleep(120)
"""


def test_a_temp_file_of_a_writer_killed_mid_write_is_removed(tmp_path):
    """SIGKILL while writing: the temp file stays (nothing can clean up), the target is untouched, and the next
    sweep removes exactly that temp file."""
    target = tmp_path / "out.parquet"
    target.write_bytes(b"previous complete file")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(target)], stdout=subprocess.PIPE, text=True, env=env)
    temp = Path(proc.stdout.readline().strip())
    assert temp.is_file() and temp.parent == tmp_path
    assert remove_orphan_temps(tmp_path) == 0  # its writer still runs: left alone
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert temp.is_file()
    assert remove_orphan_temps(tmp_path) == 1
    assert sorted(os.listdir(tmp_path)) == ["out.parquet"] and target.read_bytes() == b"previous complete file"


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EACCES, errno.EROFS, errno.EDQUOT])
def test_a_full_disk_or_refused_write_is_one_line_naming_the_file(tmp_path, monkeypatch, capsys, code):
    from pipelines import cli

    target = tmp_path / "run" / "results.csv"

    def full(self, data):
        raise OSError(code, os.strerror(code))  # what a write() gives: no file name

    monkeypatch.setattr(Path, "write_bytes", full)
    assert cli.run_main(lambda argv: atomic_write_text(target, "a,b\n"), []) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"{target}: {os.strerror(code)}" in err and "rerun" in err
    assert not [p for p in target.parent.iterdir()]  # the temp file went with the error


def test_other_os_errors_keep_their_traceback(monkeypatch):
    from pipelines import cli

    def broken(argv):
        raise OSError(errno.EIO, "Input/output error")

    with pytest.raises(OSError, match="Input/output"):
        cli.run_main(broken, [])


def test_a_refused_replace_names_the_target(tmp_path, monkeypatch, capsys):
    from pipelines import cli

    def refuse(src, dst):
        raise PermissionError(errno.EACCES, "Permission denied", str(src), None, str(dst))

    monkeypatch.setattr(io.os, "replace", refuse)
    assert cli.run_main(lambda argv: atomic_write_text(tmp_path / "report.html", "<p>"), []) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'report.html'}: Permission denied" in err and ".tmp" not in err


SDXL_FILES = [  # the layout of stabilityai/stable-diffusion-xl-base-1.0 (abridged)
    "model_index.json", "sd_xl_base_1.0.safetensors", "unet/config.json", "unet/diffusion_pytorch_model.safetensors",
    "unet/diffusion_pytorch_model.fp16.safetensors", "vae/diffusion_pytorch_model.safetensors",
    "vae/diffusion_pytorch_model.fp16.safetensors", "text_encoder/model.safetensors",
    "text_encoder/model.fp16.safetensors",
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


def test_a_hub_id_shaped_path_under_a_local_folder_is_a_missing_local_folder(monkeypatch, tmp_path):
    from pipelines.errors import ConfigError
    from pipelines.runtime import check_model_ref, looks_local

    monkeypatch.chdir(tmp_path)
    _fake_hub_cache(monkeypatch, tmp_path / "cache", "runs/cached", ["config.json"], "0" * 40)
    (tmp_path / "runs").mkdir()
    assert looks_local("runs/x") and not looks_local("org/x")  # `runs` is a folder here; `org` is not
    assert not looks_local("runs/cached")  # a hub model of that name is in the cache: the hub id wins
    with pytest.raises(ConfigError, match=r"^model: the local model folder 'runs/x' does not exist \(read as a path: "
                                          r"the folder 'runs' is here; a hub model of that name is read as one once"):
        check_model_ref("runs/x", "model")
    check_model_ref("org/x", "model")  # a hub id is looked up when loaded

    def loader(name, **kwargs):
        raise OSError("no such folder")

    with pytest.raises(ConfigError) as err:  # never hub advice for a local path
        load_pretrained(loader, "runs/x", "classifier")
    assert "local folder 'runs/x'" in str(err.value) and "huggingface-cli" not in str(err.value)
