"""Cache-key fingerprints change exactly when what decides a cache's content changes."""
import hashlib
import os

import torch

from pipelines.data import make_row, write_manifest
from pipelines.fingerprint import combine, file_identity, images_fingerprint, source_identity, weights_fingerprint


def test_weights_fingerprint_follows_the_tensors():
    torch.manual_seed(0)
    a = torch.nn.Linear(4, 3)
    b = torch.nn.Linear(4, 3)
    b.load_state_dict(a.state_dict())
    assert weights_fingerprint(a) == weights_fingerprint(b)  # same values, other object
    with torch.no_grad():
        b.bias[1] += 1e-7
    assert weights_fingerprint(a) != weights_fingerprint(b)
    assert weights_fingerprint(a) != weights_fingerprint(a.to(torch.float64))  # dtype is part of the identity
    # an independent sha256 over the same bytes in state-dict order
    h = hashlib.sha256()
    for name, t in a.state_dict().items():
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}\0".encode())
        h.update(t.contiguous().reshape(-1).numpy().tobytes())
    assert weights_fingerprint(a) == h.hexdigest()


def test_image_identity_stat_and_content(tmp_path):
    write_manifest(tmp_path, [make_row("a.bin"), make_row("b.bin")])
    (tmp_path / "a.bin").write_bytes(b"one")
    (tmp_path / "b.bin").write_bytes(b"two")
    from pipelines.data import read_manifest

    manifest = read_manifest(tmp_path)
    stat, content = images_fingerprint(manifest, "stat"), images_fingerprint(manifest, "content")
    assert file_identity(tmp_path / "a.bin", "content") == hashlib.sha256(b"one").hexdigest()
    os.utime(tmp_path / "a.bin", ns=(5, 5))  # touched: stat identity changes, content identity does not
    assert images_fingerprint(manifest, "stat") != stat and images_fingerprint(manifest, "content") == content
    (tmp_path / "b.bin").write_bytes(b"TWO")
    assert images_fingerprint(manifest, "content") != content
    (tmp_path / "b.bin").unlink()
    assert file_identity(tmp_path / "b.bin") is None


def test_source_identity_of_a_folder(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    first = source_identity(tmp_path)
    assert source_identity("org/model") == "org/model"
    (tmp_path / "model.safetensors").write_bytes(b"w")
    assert source_identity(tmp_path) != first
    assert combine("x", 1) == combine("x", 1) != combine("x", 2)
