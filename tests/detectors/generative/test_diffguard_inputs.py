"""DIFFGUARD's model files are checked at plan time: the ShiftedBronzes config's placeholders fail with one line naming
them while absent, and pass once the files exist."""
from __future__ import annotations

from pathlib import Path

import pytest

from detectors.generative.diffguard import DiffGuard
from detectors.harness.evaluate import EvalConfig

CONFIG = Path(__file__).resolve().parents[3] / "configs" / "shiftedbronzes.yaml"
HUB_MODEL = ["model=org/bronze-classifier"]  # the config's local model folder does not exist here (checked at load)


def _diffguard_params() -> dict:
    (spec,) = [s for s in EvalConfig.from_yaml(CONFIG, HUB_MODEL).detectors if s.name == "diffguard"]
    return dict(spec.params)


def test_shiftedbronzes_config_names_diffguard_inputs_and_the_check_names_the_absent_ones(tmp_path, monkeypatch):
    params = _diffguard_params()
    assert params["unet_id"].endswith("256x256_diffusion_uncond.pt")
    assert [Path(p).name for p in params["perceptual_weights"]] == ["vgg16-397923af.pth", "DISTS_weights.pt"]
    monkeypatch.chdir(tmp_path)  # the relative placeholders resolve here, where nothing exists yet
    with pytest.raises(ValueError) as err:
        DiffGuard.check_files(params)
    message = str(err.value)
    assert "unet_id: weights/256x256_diffusion_uncond.pt does not exist" in message
    assert "weights/vgg16-397923af.pth, weights/DISTS_weights.pt" in message and "\n" not in message
    for name in [params["unet_id"], *params["perceptual_weights"]]:
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    DiffGuard.check_files(params)


@pytest.mark.parametrize("params, names", [
    ({}, ["unet_id: none given", "perceptual_weights: none given"]),
    ({"unet_id": "org/adm-256"}, ["perceptual_weights: none given"]),  # a folder or hub id is left to the loader
    ({"distance": "logit_l1", "early_stop_similarity": None}, ["unet_id: none given"]),
    ({"backend": "latent", "distance": "ssim"}, []),
    ({"backend": "latent", "distance": "lpips"}, ["perceptual_weights: none given; LPIPS"]),
])
def test_check_names_what_each_configuration_needs(params, names):
    if not names:
        DiffGuard.check_files(params)
        return
    with pytest.raises(ValueError) as err:
        DiffGuard.check_files(params)
    assert all(name in str(err.value) for name in names), str(err.value)


def test_plan_stops_on_absent_diffguard_inputs_before_running(tmp_path, monkeypatch):
    from detectors.harness import plan
    from pipelines.errors import ConfigError

    (spec,) = [s for s in EvalConfig.from_yaml(CONFIG, HUB_MODEL).detectors if s.name == "diffguard"]
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="unet_id.*256x256_diffusion_uncond.pt"):
        plan.check_spec(DiffGuard, spec.params, None, "detectors[17]")
