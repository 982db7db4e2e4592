"""Helpers the benchmark scripts share (each script imports this as a sibling module)."""

from __future__ import annotations


def rss_mb() -> float:
    """This process's resident memory (VmRSS), in MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")
