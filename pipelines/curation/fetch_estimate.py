"""What a fetch will cost, before it starts: hours and disk at measured rates.

The rates come from this `--out`'s own ledger when it holds finished images (images a second per host, over the
stretches a run was working: gaps over `SESSION_GAP` seconds split them; bytes an image as stored), else from
`benchmarks/fetch.json` (`estimate_inputs`: a loopback host allowing 50 requests a second, resized images). Hosts
are fetched side by side, so the time is the slowest host's: its URLs left over its rate.
"""
from __future__ import annotations

import json
import statistics
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from pipelines.curation.fetch_client import host_of
from pipelines.progress import duration_text

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "fetch.json"
SESSION_GAP = 60.0
MIN_RECORDS = 20  # finished images a ledger needs before its rates are used


def ledger_rates(records: dict[str, dict[str, Any]]) -> tuple[dict[str, float], float | None, int]:
    """(images a second per host, mean stored bytes an image, finished images) from a ledger's ok records."""
    times: dict[str, list[float]] = defaultdict(list)
    sizes = []
    for record in records.values():
        if record.get("status") == "ok" and isinstance(record.get("t"), (int, float)):
            times[host_of(record["url"])].append(float(record["t"]))
            if isinstance(record.get("bytes"), int):
                sizes.append(record["bytes"])
    rates = {}
    for host, stamps in times.items():
        stamps.sort()
        gaps = [b - a for a, b in zip(stamps, stamps[1:]) if b - a <= SESSION_GAP]
        count, span = len(gaps), sum(gaps)
        if span > 0 and count > 0:
            rates[host] = count / span
    return rates, (statistics.fmean(sizes) if sizes else None), sum(len(s) for s in times.values())


def estimate(left: Counter, records: dict[str, dict[str, Any]], bench: Path = BENCH) -> dict[str, Any]:
    """The estimate for `left` (host -> URLs left to fetch): source, hours, disk, the slowest host and its rate, and
    one line of text."""
    rates, per_image, finished = ledger_rates(records)
    if rates and finished >= MIN_RECORDS:
        source = f"this --out's ledger ({finished} finished images)"
        default = statistics.median(rates.values())
    else:
        try:
            inputs = json.loads(bench.read_text())["estimate_inputs"]
            default, per_image = float(inputs["images_per_s_per_host"]), float(inputs["bytes_per_image"])
        except (OSError, ValueError, KeyError, TypeError):
            return {"source": None, "text": "no measured rate: neither this --out's ledger nor benchmarks/fetch.json "
                                            "has one (run benchmarks/fetch.py)"}
        rates = {}
        source = (f"benchmarks/fetch.json (a loopback host allowing {inputs.get('host_allows_rps', '?')} requests a "
                  "second)")
    if not left:
        return {"source": source, "seconds": 0.0, "hours": 0.0, "disk_bytes": 0, "text": "nothing left to fetch"}
    seconds = {h: n / rates.get(h, default) for h, n in left.items()}
    slowest = max(seconds, key=seconds.get)
    total, disk = max(seconds.values()), int(sum(left.values()) * (per_image or 0))
    text = (f"about {duration_text(total)} and {disk / 1e9:.1f} GB for {sum(left.values())} images "
            f"({per_image / 1e3:.0f} kB an image; slowest host {slowest}: {left[slowest]} images at "
            f"{rates.get(slowest, default):.1f}/s); rates from {source}")
    return {"source": source, "seconds": round(total, 1), "hours": round(total / 3600, 2), "disk_bytes": disk,
            "bytes_per_image": round(per_image or 0), "slowest_host": slowest,
            "images_per_s_slowest_host": round(rates.get(slowest, default), 2), "text": text}


