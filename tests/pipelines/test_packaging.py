"""The stand-ins' real hub configs ship inside the package: pyproject's package-data globs cover every file of
pipelines/hub_configs, and pipelines.hub finds them beside itself, never through the checkout's tests/ folder.
(.ci/run also builds the wheel and checks its file list.)"""
import tomllib
from pathlib import Path

from pipelines import hub

ROOT = Path(__file__).resolve().parents[2]


def test_package_data_globs_cover_every_hub_config():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    globs = pyproject["tool"]["setuptools"]["package-data"]["pipelines"]
    package = ROOT / "pipelines"
    covered = {p for pattern in globs for p in package.glob(pattern) if p.is_file()}
    shipped = {p for p in (package / "hub_configs").rglob("*") if p.is_file()}
    assert shipped and shipped == covered


def test_hub_reads_the_packaged_configs(monkeypatch):
    monkeypatch.delenv(hub.FIXTURES_ENV, raising=False)
    assert hub.fixtures_root() == ROOT / "pipelines" / "hub_configs"
    assert hub.real_config("microsoft/resnet-50")["model_type"] == "resnet"
    assert "parents[" not in Path(hub.__file__).read_text()
