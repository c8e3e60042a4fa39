"""The training dry run's estimate (pipelines.training.cost): its arithmetic against a hand computation, the rates it
reads from each benchmark record, the choice among them, and the lines it prints when no record is present."""
import json
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

from pipelines.data import make_row, write_manifest
from pipelines.training import cost
from pipelines.training.cost import LoaderRate


def test_estimate_matches_a_hand_computation():
    rate = LoaderRate(50.0, 0.1, True, "hand")
    found = cost.estimate(train_rows=1000, val_rows=100, epochs=3, workers=4, rate=rate, steps_images_per_s=500.0,
                          steps_source="assumed", weights=400)
    # 3 epochs x 1,100 rows = 3,300 samples; 4 cores x 50 img/s = 200 img/s -> 16.5 s; GPU 3,300 / 500 = 6.6 s
    assert found.samples == 3300 and found.cores == 4
    assert found.loading_s == pytest.approx(16.5) and found.steps_s == pytest.approx(6.6)
    assert found.disk_bytes == 6 * 400  # last + best folders, checkpoint (weights + 2 AdamW moments), best checkpoint


def test_no_workers_loads_on_one_core_and_nothing_known_is_said_so():
    found = cost.estimate(train_rows=10, val_rows=0, epochs=2, workers=0, rate=LoaderRate(5.0, 1.0, None, "x"))
    assert (found.cores == 1 and found.loading_s == pytest.approx(4.0) and found.steps_s is None
            and found.disk_bytes is None)
    lines = cost.describe(cost.estimate(train_rows=10, val_rows=0, epochs=2, workers=0, rate=None), 0)
    assert "at a rate not measured here" in lines[0] and "python -m benchmarks.scale_data" in lines[0]
    assert "not included" in lines[1] and "not known" in lines[2]


def test_rates_from_each_record_and_the_nearest_size_wins(tmp_path):
    (tmp_path / "decode.json").write_text(json.dumps({"workers": 0, "settings": {"megapixels": 3.0},
                                                      "stages": {"train": {"ours_img_s": 36.0,
                                                                           "ours_draft_img_s": 78.0}}}))
    (tmp_path / "train.json").write_text(json.dumps({"settings": {"side": 100, "workers": 0},
                                                     "loader_images_per_s": 580.0}))
    (tmp_path / "scale_data.json").write_text(json.dumps({"loader_rates": [
        {"what": "fetched", "images_per_s_per_core": 500.0, "megapixels": 0.067, "draft": True}, {"what": "broken"}]}))
    rates = cost.read_rates(tmp_path)
    assert [(r.images_per_s, r.megapixels, r.draft) for r in rates] == [
        (500.0, 0.067, True), (36.0, 3.0, False), (78.0, 3.0, True), (580.0, 0.01, None)]
    assert cost.pick_rate(rates, 2.5, draft=True).images_per_s == 78.0
    assert cost.pick_rate(rates, 2.5, draft=False).images_per_s == 36.0
    assert cost.pick_rate(rates, 0.05, draft=True).images_per_s == 500.0  # log distance: 0.067 is nearer than 0.01
    assert cost.pick_rate(rates, None, draft=True).images_per_s == 78.0  # no size known: the slowest that matches
    assert cost.pick_rate([], 1.0, draft=True) is None


def test_gpu_rate_is_the_records_scaled_by_pixels_and_absent_without_one(tmp_path):
    assert cost.gpu_rate(tmp_path) == (None, "no GPU rate recorded in benchmarks/scale_data.json")
    (tmp_path / "scale_data.json").write_text(json.dumps({
        "gpu": {"images_per_s": 1000.0, "image_size": 100, "source": "assumed"},
        "gpu_fp32_protocol": {"images_per_s": 400.0, "image_size": 100, "source": "assumed fp32"}}))
    assert cost.gpu_rate(tmp_path, 100, "bf16") == (1000.0, "assumed")
    rate, source = cost.gpu_rate(tmp_path, 200, "fp32")
    assert rate == pytest.approx(100.0) and source.startswith("assumed fp32; scaled to 200 px")


def test_weights_of_resnet50_and_of_a_local_folder(tmp_path):
    assert cost.weights_bytes("microsoft/resnet-50", 10) == 4 * (23_508_032 + 2048 * 10 + 10)
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 1234)
    assert cost.weights_bytes(str(tmp_path), 10) == 1234
    assert cost.weights_bytes("someone/vit-tiny", 10) is None


def test_training_cost_reads_the_manifests_images_and_the_records(tmp_path, monkeypatch):
    monkeypatch.setattr(cost, "cpu_rate", lambda model, classes, size: (None, "stand-in: no CPU rate"))
    images = tmp_path / "id"
    images.mkdir()
    rows = []
    for i in range(4):
        Image.fromarray(np.full((300, 400, 3), 40 * i, np.uint8)).save(images / f"{i}.jpg")
        rows.append(make_row(f"{i}.jpg", split="train", label=i % 2))
    train = write_manifest(images, rows)
    bench = tmp_path / "benchmarks"
    bench.mkdir()
    (bench / "scale_data.json").write_text(json.dumps({"loader_rates": [
        {"what": "a", "images_per_s_per_core": 100.0, "megapixels": 0.12, "draft": True},
        {"what": "b", "images_per_s_per_core": 10.0, "megapixels": 3.0, "draft": True}]}))
    config = SimpleNamespace(epochs=5, draft=True, model="microsoft/resnet-50", image_size=None, precision="auto",
                             workers=lambda: 2)
    plan = SimpleNamespace(train=train, val=None, class_names=["a", "b"])
    text = cost.training_cost(config, plan, bench).splitlines()
    # 5 epochs x 4 rows = 20 images on 2 cores at 100 img/s (the 0.12 MP rate: the images are 400 x 300) = 0.1 s
    assert text[0].startswith("estimate: data loading 0 s for 20 images") and "2 core(s) at 100 images/s" in text[0]
    assert text[1] == "estimate: the model's own steps are not included (stand-in: no CPU rate)"
    assert f"{6 * 4 * (23_508_032 + 2048 * 2 + 2) / 1e9:.2f} GB" in text[2]
    empty = tmp_path / "none"
    empty.mkdir()
    assert "at a rate not measured here" in cost.training_cost(config, plan, empty)


@pytest.mark.slow
def test_the_model_steps_are_estimated_for_the_device_the_run_uses(tmp_path, monkeypatch):
    """On the CPU the step rate is measured here (never the GPU's: a CPU-only run
    would be told "model steps 0 s"); on a GPU it is the recorded one."""
    from pipelines import runtime
    from tests.helpers.models import tiny_resnet_classifier

    model = tmp_path / "model"
    tiny_resnet_classifier(model, classes=3)
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "scale_data.json").write_text(json.dumps({"gpu": {"images_per_s": 1e6, "source": "H200"}}))
    config = SimpleNamespace(model=str(model), image_size=32, precision="auto")
    rate, source = cost.step_rate(config, 3, tmp_path / "bench")
    assert rate > 0 and source.startswith("measured here: one training step of 4 images at 32 px on the CPU")
    samples = cost.estimate(train_rows=1000, val_rows=0, epochs=1, workers=0, rate=None, steps_images_per_s=rate,
                            steps_source=source)
    assert samples.steps_s == pytest.approx(1000 / rate)
    assert "on the CPU" in cost.describe(samples, 0)[1]
    big, _ = cost.cpu_rate(str(model), 3, 128, probe_size=32)
    assert big > 0  # measured at 32 px, scaled to 128 px by the pixels: 16x fewer images a second than measured
    assert cost.cpu_rate(str(tmp_path / "missing"), 3, 32)[0] is None
    monkeypatch.setattr(runtime, "resolve_device", lambda device=None: runtime.torch.device("cuda"))
    assert cost.step_rate(config, 3, tmp_path / "bench") == (1e6, "H200")
