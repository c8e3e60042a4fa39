"""Progress of long loops: a tqdm bar on a terminal, a line every `interval` seconds (and one at the end) otherwise, so
logs and CI output get a few readable lines instead of thousands of carriage-return updates.

    for batch in progress(loader, "features", total=len(loader), unit="batch"):
        ...
    with progress(desc="generate", total=n, unit="img") as bar:
        bar.update(k)

`OODFORGE_PROGRESS=bar|lines|off` forces a style (default: `bar` when the stream is a terminal, else `lines`).
"""
from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TextIO

PROGRESS_ENV = "OODFORGE_PROGRESS"
STYLES = ("bar", "lines", "off")
DEFAULT_INTERVAL_S = 30.0


def duration_text(seconds: float) -> str:
    """A duration as people say it in an estimate: seconds below 2 minutes, minutes below 2 hours, hours below 2 days,
    else days."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} minutes"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} hours"
    return f"{seconds / 86400:.1f} days"


def progress_style(stream: TextIO | None = None) -> str:
    """`$OODFORGE_PROGRESS` when set (bar, lines or off), else `bar` on a terminal and `lines` elsewhere."""
    forced = os.environ.get(PROGRESS_ENV, "").strip().lower()
    if forced in STYLES:
        return forced
    stream = stream if stream is not None else sys.stderr
    isatty = getattr(stream, "isatty", None)
    return "bar" if isatty is not None and isatty() else "lines"


class LineProgress:
    """tqdm's iterate / `update` / `close` / `write` surface, writing one line per `interval` seconds and, when
    `leave`, a last line with the count, time and rate."""

    def __init__(self, iterable: Iterable[Any] | None = None, desc: str = "", total: int | None = None, *,
                 unit: str = "it", leave: bool = True, disable: bool = False, interval: float = DEFAULT_INTERVAL_S,
                 stream: TextIO | None = None, clock: Callable[[], float] = time.monotonic):
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)  # type: ignore[arg-type]
        self.iterable, self.desc, self.total, self.unit = iterable, desc, total, unit
        self.leave, self.disable, self.interval = leave, disable, interval
        self.stream, self.clock = stream if stream is not None else sys.stderr, clock
        self.n, self.closed, self.postfix = 0, False, ""
        self.start = self.last = clock()

    def __iter__(self) -> Iterator[Any]:
        if self.iterable is None:
            raise TypeError("this progress has no iterable; call update(n) instead")
        try:
            for item in self.iterable:
                yield item
                self.update(1)
        finally:
            self.close()

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def update(self, n: int = 1) -> None:
        """Count `n` more; print a line when `interval` seconds passed since the last one."""
        self.n += n
        now = self.clock()
        if not self.disable and now - self.last >= self.interval:
            self.last = now
            self._print(now)

    def close(self) -> None:
        """The final line (when `leave` and anything was counted); later calls do nothing."""
        if self.closed:
            return
        self.closed = True
        if not self.disable and self.leave and self.n:
            self._print(self.clock(), final=True)

    def write(self, text: str) -> None:
        self._emit(text)

    def set_description(self, desc: str) -> None:
        self.desc = desc

    def set_postfix(self, **values: Any) -> None:
        """Values shown at the end of the next line (e.g. the running loss), as tqdm's `set_postfix`."""
        self.postfix = ", ".join(f"{k}={v}" for k, v in values.items())

    def line(self, now: float, final: bool = False) -> str:
        """`desc: 120/500 img (24%), 12 s, 10.0 img/s` (final: `desc: 500 img in 50 s, 10.0 img/s`: the count is of
        units processed, not succeeded; a caller with failures says so in `set_postfix`, e.g. `done=467, failed=33`)."""
        elapsed = max(now - self.start, 0.0)
        rate = f"{self.n / elapsed:.3g} {self.unit}/s" if elapsed > 0 else f"- {self.unit}/s"
        label = f"{self.desc}: " if self.desc else ""
        postfix = f", {self.postfix}" if self.postfix else ""
        if final:
            return f"{label}{self.n} {self.unit} in {elapsed:.0f} s, {rate}{postfix}"
        count = f"{self.n}/{self.total}" if self.total else str(self.n)
        share = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
        return f"{label}{count} {self.unit}{share}, {elapsed:.0f} s, {rate}{postfix}"

    def _print(self, now: float, final: bool = False) -> None:
        self._emit(self.line(now, final))

    def _emit(self, text: str) -> None:
        """One line on the bar's own stream, as tqdm writes (a progress display, not a log record)."""
        self.stream.write(text + "\n")
        self.stream.flush()


def progress(iterable: Iterable[Any] | None = None, desc: str = "", total: int | None = None, *, unit: str = "it",
             leave: bool = True, disable: bool = False, interval: float = DEFAULT_INTERVAL_S,
             stream: TextIO | None = None) -> Any:
    """Wrap `iterable` (or, without one, count `update(n)` calls) with progress reporting in the style of
    `progress_style`: a `tqdm` bar, a `LineProgress`, or a silent `LineProgress` for `off` / `disable`."""
    style = progress_style(stream)
    if style == "bar" and not disable:
        from tqdm.auto import tqdm

        return tqdm(iterable, desc=desc, total=total, unit=unit, leave=leave, file=stream)
    return LineProgress(iterable, desc, total, unit=unit, leave=leave, disable=disable or style == "off",
                        interval=interval, stream=stream)
