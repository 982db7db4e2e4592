"""Helpers the benchmark scripts share (each script imports this as a sibling module)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Dict, Sequence

import stockade
from stockade.tools import drive_load


def measure(eng: stockade.Engine, skus: Sequence[str], **kw: Any) -> Dict[str, Any]:
    """One drive_load run (keyword arguments as drive_load's), as a dict with its "rate":
    granted reservations per second."""
    out: Dict[str, Any] = asdict(drive_load(eng, skus, **kw))
    out["rate"] = out["granted"] / out["seconds"]
    return out


def rss_mb() -> float:
    """This process's resident memory (VmRSS), in MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")
