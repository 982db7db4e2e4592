"""Constants and helpers shared by the pytest modules (imported as a plain module)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Callable

# The strategies that serve a request on their own (batched and auto need the hot-row
# layer, which has not landed).
PER_REQUEST_STRATEGIES = ["atomic", "pessimistic", "advisory", "optimistic"]

# Every API test runs on each store.
BACKENDS = ["memory", "postgres"]

# Where every ManualClock of the suite starts.
START = datetime(2027, 1, 1, 12, 0, tzinfo=timezone.utc)

# The store's current time, and a way to let store time pass (see conftest).
Now = Callable[[], datetime]
Wait = Callable[[float], None]
