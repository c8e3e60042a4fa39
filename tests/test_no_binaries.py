"""The repository holds source and text only: no wheels, weights, datasets or generated images are committed."""
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BINARY_SUFFIXES = (".whl", ".tar.gz", ".zip", ".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".npz", ".npy",
                   ".parquet", ".png", ".jpg", ".jpeg", ".webp", ".tar", ".so")


def _tracked() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [name for name in out.stdout.decode().split("\0") if name]


def test_no_committed_binaries():
    tracked = _tracked()
    by_name = [n for n in tracked if n.lower().endswith(BINARY_SUFFIXES)]
    with_nul = [n for n in tracked if (ROOT / n).is_file() and b"\0" in (ROOT / n).read_bytes()[:8192]]
    assert not by_name and not with_nul, f"binary files are committed: {sorted(set(by_name + with_nul))}"
