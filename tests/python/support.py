"""Constants and helpers shared by the pytest modules (imported as a plain module)."""

from __future__ import annotations

from datetime import datetime, timezone

# The strategies that serve a request on their own (batched and auto need the hot-row
# layer, which has not landed).
PER_REQUEST_STRATEGIES = ["atomic", "pessimistic", "advisory", "optimistic"]

# Where every ManualClock of the suite starts.
START = datetime(2027, 1, 1, 12, 0, tzinfo=timezone.utc)
