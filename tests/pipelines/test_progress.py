"""pipelines.progress: a tqdm bar on a terminal; off a terminal, a line per interval and one at the end, never the
carriage-return updates of a bar; `OODFORGE_PROGRESS` forces a style."""
import io

import pytest

from pipelines.progress import PROGRESS_ENV, LineProgress, progress, progress_style


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_lines_every_interval_and_a_final_line():
    out, clock = io.StringIO(), Clock()
    bar = LineProgress(range(10), "features", unit="img", interval=30.0, stream=out, clock=clock)
    seen = []
    for i in bar:
        seen.append(i)
        clock.now += 10.0  # 10 s per item: a line after items 3, 6 and 9 (30 s apart)
    assert seen == list(range(10))
    lines = out.getvalue().splitlines()
    assert lines == ["features: 3/10 img (30%), 30 s, 0.1 img/s", "features: 6/10 img (60%), 60 s, 0.1 img/s",
                     "features: 9/10 img (90%), 90 s, 0.1 img/s", "features: 10 img in 100 s, 0.1 img/s"]
    assert "\r" not in out.getvalue()


def test_manual_updates_leave_false_and_disable():
    out, clock = io.StringIO(), Clock()
    with LineProgress(desc="inner", total=None, leave=False, interval=5, stream=out, clock=clock) as bar:
        clock.now = 6
        bar.update(4)
    assert out.getvalue() == "inner: 4 it, 6 s, 0.667 it/s\n"  # no final line when leave=False
    quiet = io.StringIO()
    with LineProgress(desc="x", total=3, disable=True, interval=0, stream=quiet, clock=clock) as bar:
        bar.update(3)
    assert quiet.getvalue() == ""


def test_style_follows_the_stream_and_the_environment(monkeypatch):
    monkeypatch.delenv(PROGRESS_ENV, raising=False)
    assert progress_style(Terminal()) == "bar" and progress_style(io.StringIO()) == "lines"
    from tqdm.auto import tqdm

    bar = progress([1, 2], "t", stream=Terminal())
    assert isinstance(bar, tqdm) and list(bar) == [1, 2]
    assert isinstance(progress([1], "t", stream=io.StringIO()), LineProgress)
    monkeypatch.setenv(PROGRESS_ENV, "lines")
    assert isinstance(progress([1], "t", stream=Terminal()), LineProgress)
    monkeypatch.setenv(PROGRESS_ENV, "off")
    out = io.StringIO()
    assert list(progress([1, 2, 3], "t", stream=out, interval=0)) == [1, 2, 3] and out.getvalue() == ""


def test_iterating_without_an_iterable_is_an_error():
    with pytest.raises(TypeError, match="update"):
        list(LineProgress(desc="x", stream=io.StringIO()))


def test_every_bar_of_the_project_goes_through_pipelines_progress():
    """A bar made with tqdm directly ignores OODFORGE_PROGRESS and writes carriage returns into logs: only
    pipelines/progress.py may import tqdm."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    direct = [str(p.relative_to(root)) for folder in ("pipelines", "gen", "detectors", "oodforge", "scripts")
              for p in sorted((root / folder).rglob("*.py"))
              if re.search(r"^\s*(from tqdm|import tqdm)", p.read_text(encoding="utf-8"), re.M)]
    assert direct == ["pipelines/progress.py"]


@pytest.mark.parametrize("style", ["lines", "off"])
def test_the_clip_feature_bar_honours_the_environment(monkeypatch, capsys, style):
    """The CLIP-feature loop (once a raw tqdm bar) prints no carriage return under lines / off."""
    import torch
    from PIL import Image

    from detectors.base import ImageSet
    from detectors.clip.features import compute_image_features

    class Backbone:
        def autocast(self):
            return torch.autocast("cpu", enabled=False)

        def preprocess(self, pils):
            return torch.zeros(len(pils), 3)

        def image_embeddings(self, x, local=True):
            return torch.ones(len(x), 2), None

    monkeypatch.setenv(PROGRESS_ENV, style)
    images = ImageSet(images=[Image.new("RGB", (4, 4))] * 5)
    feats = compute_image_features(Backbone(), images, batch_size=2, local=False)
    assert feats.global_.shape == (5, 2)
    err = capsys.readouterr().err
    assert "\r" not in err and (err == "" if style == "off" else True)
