"""Per-process snapshots of stockade's Prometheus figures, for pre-fork servers.

Under gunicorn (or any pre-fork server) each scrape reaches one worker, and each worker's
engine counts only its own calls. So each worker writes its figures, as collected, to
``stockade_<pid>_<n>.json`` in a directory the workers share (``PROMETHEUS_MULTIPROC_DIR``),
and a scrape merges every file there:

- counters and histograms are summed over every file, live or dead, so the service's
  totals never go down when a worker dies or is replaced;
- gauges count only the processes still alive: summed (``livesum``), except where the
  figure is the same database seen from each process (``max``) or a health flag
  (``min``: one worker that cannot read its stats shows).

:func:`mark_process_dead` (gunicorn's ``child_exit`` hook) folds a dead worker's counters
and histograms into ``stockade_archive.json`` and removes its file, so the directory holds
one file per live worker and one archive, whatever the number of restarts. A file is
replaced whole (written aside, then renamed); readers and the archive take a lock file.
"""

from __future__ import annotations

import fcntl
import itertools
import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Optional, Tuple

from prometheus_client.core import Metric

ARCHIVE = "stockade_archive.json"
_LOCK = "stockade_snapshots.lock"
_PREFIX = "stockade_"

# How a gauge is merged over live processes; any other gauge is summed.
GAUGE_MODES = {
    "stockade_up": "min",
    "stockade_rows": "max",  # statistics estimates of one database, read by each process
    "stockade_sweeper_leader": "max",  # of all engines on one database, one leads
    "stockade_audit_violations": "max",  # one database, audited by whichever process ran it
}

Family = Dict[str, object]
_Key = Tuple[str, Tuple[Tuple[str, str], ...]]


_collectors = itertools.count(1)


def new_path(directory: Path) -> Path:
    """The file of a new collector in this process: ``stockade_<pid>_<n>.json`` (a process
    may hold several engines, one after another or at once, each with its collector)."""
    return directory / f"{_PREFIX}{os.getpid()}_{next(_collectors)}.json"


def _pid_of(path: Path) -> Optional[int]:
    parts = path.stem.split("_")
    if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
        return int(parts[1])
    return None


def _encode(families: Iterable[Metric], gauges: bool = True) -> List[Family]:
    return [
        {
            "name": f.name,
            "type": f.type,
            "documentation": f.documentation,
            "samples": [[s.name, dict(s.labels), s.value] for s in f.samples],
        }
        for f in families
        if gauges or f.type != "gauge"
    ]


def _write(path: Path, families: List[Family]) -> None:
    aside = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    aside.write_text(json.dumps({"families": families}))
    os.replace(aside, path)


def write(path: Path, families: Iterable[Metric], *, gauges: bool = True) -> None:
    """Replaces a collector's snapshot with ``families`` (without gauges: its last one,
    when it closes, for its engine no longer measures anything)."""
    _write(path, _encode(families, gauges))


@contextmanager
def _locked(directory: Path, exclusive: bool) -> Iterator[None]:
    with open(directory / _LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _read(path: Path) -> List[Family]:
    try:
        families: List[Family] = json.loads(path.read_text())["families"]
        return families
    except FileNotFoundError:
        return []
    except (ValueError, KeyError, TypeError):  # a file of another program, or damaged
        return []


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def _snapshots(directory: Path) -> Iterator[Tuple[Optional[int], List[Family]]]:
    """(pid, families) of each process's file, and (None, ...) of the archive."""
    yield None, _read(directory / ARCHIVE)
    for path in sorted(directory.glob(f"{_PREFIX}*.json")):
        pid = _pid_of(path)
        if pid is not None:
            yield pid, _read(path)


class _Merge:
    def __init__(self) -> None:
        self.heads: Dict[str, Tuple[str, str]] = {}  # name -> (type, documentation)
        self.values: Dict[str, Dict[_Key, float]] = {}

    def add(self, families: List[Family], live: bool) -> None:
        for family in families:
            name, kind = str(family["name"]), str(family["type"])
            if kind == "gauge" and not live:
                continue
            self.heads.setdefault(name, (kind, str(family["documentation"])))
            values = self.values.setdefault(name, {})
            mode = GAUGE_MODES.get(name, "sum") if kind == "gauge" else "sum"
            for sample, labels, value in family["samples"]:  # type: ignore[attr-defined]
                key = (sample, tuple(sorted(labels.items())))
                old = values.get(key)
                if old is None:
                    values[key] = float(value)
                elif mode == "min":
                    values[key] = min(old, float(value))
                elif mode == "max":
                    values[key] = max(old, float(value))
                else:
                    values[key] = old + float(value)

    def metrics(self) -> List[Metric]:
        out = []
        for name, (kind, doc) in self.heads.items():
            metric = Metric(name, doc, kind)
            for (sample, labels), value in self.values[name].items():
                metric.add_sample(sample, dict(labels), value)
            out.append(metric)
        return out


def merged(directory: Path) -> List[Metric]:
    """Every process's figures in ``directory``, merged as the module says."""
    merge = _Merge()
    with _locked(directory, exclusive=False):
        for pid, families in _snapshots(directory):
            merge.add(families, live=pid is not None and _alive(pid))
    return merge.metrics()


def mark_process_dead(pid: int, directory: Path) -> None:
    """Folds the counters and histograms of dead process ``pid`` into the archive and
    removes its snapshot (its gauges go with it)."""
    with _locked(directory, exclusive=True):
        files = [p for p in directory.glob(f"{_PREFIX}{pid}_*.json") if _pid_of(p) == pid]
        if files:
            merge = _Merge()
            merge.add(_read(directory / ARCHIVE), live=False)
            for path in files:
                merge.add(_read(path), live=False)
            _write(directory / ARCHIVE, _encode(merge.metrics()))
        for path in files:
            path.unlink(missing_ok=True)
        for aside in directory.glob(f".{_PREFIX}{pid}_*.json.*.tmp"):
            aside.unlink(missing_ok=True)
