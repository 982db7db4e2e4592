"""Tooling beside the API: the command line (cli), the benchmarks (bench), the flash-sale
load scenario (loadgen), the C++ load driver (load), a throwaway PostgreSQL server
(pgserver), test helpers (testing, hooks) and the pytest plugin (pytest_plugin).

``stockade`` itself exports the engine's API only; import these by their module path.
"""

from __future__ import annotations

from .load import LoadResult, drive_load

__all__ = ["LoadResult", "drive_load"]
