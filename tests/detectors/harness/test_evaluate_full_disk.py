"""A full disk while evaluate saves a feature cache (safetensors words the system's error in its own exception type,
`SafetensorError ... No space left on device`) is one line naming the cache file, exit 2, with nothing partial left;
the rerun finishes."""
from __future__ import annotations

import os
import re

import pytest
import yaml
from runner_helpers import eval_config, evaluate_main

from pipelines.cli import run_main


@pytest.mark.slow
def test_a_full_disk_while_saving_a_feature_cache_is_one_line_naming_it(digits, tmp_path, capsys, monkeypatch):
    import safetensors.numpy
    from safetensors import SafetensorError

    real = safetensors.numpy.save_file
    tried = []

    def full(tensors, filename, metadata=None):
        tried.append(filename)
        with open(filename, "wb") as fh:  # a partial file, as a write cut short by the disk leaves
            fh.write(b"\0" * 100)
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(safetensors.numpy, "save_file", full)
    out = tmp_path / "run"
    config = tmp_path / "eval.yaml"
    config.write_text(yaml.safe_dump(eval_config(digits, out, detectors=["msp"],
                                                 ood=[{"manifest": str(digits[1]), "sets": ["texture"]}])))
    assert run_main(evaluate_main().main, ["--config", str(config)]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error")]
    assert "Traceback" not in err and len(errors) == 1, err
    named = re.match(r"error: (\S+\.safetensors): No space left on device; free some disk space", errors[0])
    assert named, errors[0]
    assert os.path.basename(tried[0]).startswith("." + os.path.basename(named[1]) + ".")  # the cache its temp was for
    leftovers = [p for p in out.rglob("*") if p.is_file() and (".tmp" in p.name or p.suffix == ".safetensors")]
    assert leftovers == []  # nothing partial: neither the temp file nor a cache
    monkeypatch.setattr(safetensors.numpy, "save_file", real)
    assert run_main(evaluate_main().main, ["--config", str(config)]) == 0
    assert (out / "results.csv").is_file()


def test_a_library_error_that_carries_no_system_error_keeps_its_type(tmp_path):
    from safetensors import SafetensorError

    from pipelines.io import atomic_path, os_error_code

    assert os_error_code(SafetensorError("I/O error: No space left on device (os error 28)")) == 28
    assert os_error_code(ValueError('IoError(Os { code: 122, kind: FilesystemQuotaExceeded, message: "x" })')) == 122
    with pytest.raises(SafetensorError, match="header too large"):
        with atomic_path(tmp_path / "x.safetensors"):
            raise SafetensorError("header too large")
    assert list(tmp_path.iterdir()) == []
