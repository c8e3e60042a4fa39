"""CLIPN's "no" class embeddings are encoded in batches: peak memory stays flat in classes x templates.

Peak resident memory is read from /proc/self/status (VmHWM) after resetting it through /proc/self/clear_refs, so the
peak of one call is measured inside the test process.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from detectors.clip.clipn import NoTextTower, class_no_embeddings
from detectors.clip.templates import CLIPN_TEMPLATES

BOUND_MB = 150.0


def _status_mb(key: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(key)


def peak_growth_mb(call) -> tuple[float, torch.Tensor]:
    """(peak resident memory during `call()` minus resident memory before it, in MiB; its result)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    except OSError:
        pytest.skip("cannot reset the peak RSS (/proc/self/clear_refs) here")
    before = _status_mb("VmRSS")
    result = call()
    return _status_mb("VmHWM") - before, result


@pytest.mark.slow
def test_thousand_classes_stay_under_a_memory_bound_and_match_one_batch(backbone):
    # 1,000 classes x 8 templates = 8,000 texts. Encoded TEXT_BATCH at a time the peak stays under BOUND_MB; all in
    # one batch it exceeds the bound, and grows with classes x templates (about 5.9 GB for the
    # official 128 templates). Both give the same embeddings
    tower = NoTextTower.from_clip(backbone.model, n_prompts=4).eval()
    with torch.no_grad():
        tower.prompt.normal_(std=0.02, generator=torch.Generator().manual_seed(0))
    names, templates = [f"class {i}" for i in range(1000)], CLIPN_TEMPLATES[:8]
    batched_mb, batched = peak_growth_mb(lambda: class_no_embeddings(tower, backbone, names, templates))
    whole_mb, whole = peak_growth_mb(lambda: class_no_embeddings(tower, backbone, names, templates, len(names) * 8))
    print(f"peak growth: batched {batched_mb:.0f} MiB, one batch {whole_mb:.0f} MiB")
    assert batched_mb < BOUND_MB < whole_mb, (batched_mb, whole_mb)
    assert batched.shape == (1000, tower.projection.out_features)
    torch.testing.assert_close(batched, whole, rtol=1e-5, atol=1e-6)


def test_detector_no_text_is_the_template_mean_of_single_text_embeddings(backbone):
    # reference: every text alone through the tower (no padding), normalised, averaged per class, renormalised
    tower = NoTextTower.from_clip(backbone.model, n_prompts=4).eval()
    with torch.no_grad():
        tower.prompt.normal_(std=0.02, generator=torch.Generator().manual_seed(1))
    names, templates = ["red", "green", "blue"], CLIPN_TEMPLATES[:5]
    with torch.no_grad():
        each = torch.stack([torch.stack([tower(backbone, backbone.tokenize([t.format(n)]))[0] for t in templates])
                            for n in names])
    expected = torch.nn.functional.normalize(each.mean(1), dim=-1)
    torch.testing.assert_close(class_no_embeddings(tower, backbone, names, templates, batch_size=4), expected,
                               rtol=1e-5, atol=1e-6)
