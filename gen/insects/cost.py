"""What a make_splits run will cost, told by its dry run: the dry run reads, builds and encodes every manifest byte
as the run does (its seconds are measured on the user's own input), so only the writing is estimated, at the disk
rate `benchmarks/splits.py` measured (`benchmarks/splits.json`, key `disk_write_mib_per_s`)."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

RATE_KEY = "disk_write_mib_per_s"


def _mib(n: float) -> str:
    if n < 2**20:
        return f"{n / 2**10:,.0f} KiB"
    return f"{n / 2**20:,.1f} MiB" if n < 2**30 else f"{n / 2**30:,.2f} GiB"


def _seconds(s: float) -> str:
    return f"{s:.1f} s" if s < 120 else f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.1f} h"


def write_rate(path: str | os.PathLike) -> tuple[float | None, str]:
    """(MiB/s, where it comes from) of writing to disk, from a benchmark record (None when it has none)."""
    try:
        rate = json.loads(Path(path).read_text()).get(RATE_KEY)
    except (OSError, ValueError, AttributeError):
        rate = None
    return (float(rate), str(path)) if isinstance(rate, (int, float)) and rate > 0 else (None, str(path))


def estimate(timings: dict[str, Any], rate: tuple[float | None, str], extra_bytes: int = 0) -> list[str]:
    """Lines telling the run's time and disk from a dry run's `timings` (`gen.insects.make_splits`)."""
    measured = timings["read"] + timings["build"] + timings["manifests"]
    total_bytes = timings["bytes"] + extra_bytes
    mib_per_s, source = rate
    lines = [f"estimate: read {_seconds(timings['read'])} ({timings['rows']:,} rows, "
             f"{timings['rows'] / max(timings['read'], 1e-9):,.0f} rows/s), build {_seconds(timings['build'])}, "
             f"manifests {_seconds(timings['manifests'])} ({timings['manifest_rows']:,} rows): measured by this dry "
             "run on your input"]
    if mib_per_s is None:
        lines.append(f"estimate: writing {_mib(total_bytes)} at a rate not known here (no {RATE_KEY} in {source}); "
                     f"the run takes {_seconds(measured)} plus that")
    else:
        write = total_bytes / 2**20 / mib_per_s
        lines.append(f"estimate: writing {_mib(total_bytes)} at {mib_per_s:,.0f} MiB/s ({source}) takes "
                     f"{_seconds(write)}; the run takes about {_seconds(measured + write)}")
    lines.append(f"estimate: disk {_mib(total_bytes)} (the manifests{' and the synthetic table' if extra_bytes else ''}"
                 "; the summaries are a few KB)")
    return lines
