# Type stubs for the compiled module stockade._core (cpp/bindings). Hand-written; the
# test suite runs mypy's stubtest against the built module so they cannot drift.
from typing import Any, List, Optional, Tuple

__version__: str
ERROR_CODES: tuple[str, ...]
QUANTITY_MAX: int
ON_HAND_MAX: int
LIMIT_GROUP_SKUS_MAX: int
SKU_BYTES_MAX: int
LOCATION_BYTES_MAX: int
IDEMPOTENCY_KEY_BYTES_MAX: int
LEASE_OWNER_BYTES_MAX: int
BUYER_BYTES_MAX: int
REF_BYTES_MAX: int
METADATA_BYTES_MAX: int
RESERVATIONS_LIMIT_MAX: int
LIMIT_GROUP_BYTES_MAX: int
ORDER_LINES_MAX: int
ALLOCATE_LOCATIONS_MAX: int
LOCATIONS_LIMIT_MAX: int
TRANSFERS_LIMIT_MAX: int
TTL_US_MAX: int
SLOTS_MAX: int
OPTION_LIMITS: dict[str, int]

def parse_conninfo(dsn: str) -> list[tuple[str, str]]: ...

LOW_CONFLICT_RATE: float
HOT_CONFLICT_RATE: float

class StockLevel:
    """A stock row as committed: raw fields, times in us."""
    @property
    def sku(self) -> str: ...
    @property
    def location(self) -> str: ...
    @property
    def on_hand(self) -> int: ...
    @property
    def reserved(self) -> int: ...
    @property
    def available(self) -> int: ...
    @property
    def version(self) -> int: ...
    @property
    def updated_at_us(self) -> int: ...
    @property
    def backorder_limit(self) -> int: ...
    @property
    def backordered(self) -> int: ...
    @property
    def discontinued(self) -> bool: ...
    @property
    def leased(self) -> bool: ...
    @property
    def lease_expires_at_us(self) -> int: ...
    @property
    def low_stock(self) -> Optional[int]: ...
    @property
    def safety_stock(self) -> int: ...
    @property
    def damaged(self) -> int: ...
    @property
    def quality_control(self) -> int: ...
    @property
    def incoming(self) -> int: ...

class Transfer:
    """A transfer as committed: raw fields, times in us."""
    @property
    def id(self) -> bytes: ...
    @property
    def sku(self) -> str: ...
    @property
    def source(self) -> str: ...
    @property
    def destination(self) -> str: ...
    @property
    def qty(self) -> int: ...
    @property
    def received(self) -> int: ...
    @property
    def rejected(self) -> int: ...
    @property
    def cancelled(self) -> int: ...
    @property
    def in_transit(self) -> int: ...
    @property
    def state(self) -> str: ...
    @property
    def version(self) -> int: ...
    @property
    def created_at_us(self) -> int: ...
    @property
    def updated_at_us(self) -> int: ...
    @property
    def reason(self) -> Optional[str]: ...
    @property
    def actor(self) -> Optional[str]: ...

class Movement:
    """One journal entry: one change of one stock row."""
    @property
    def position(self) -> int: ...
    @property
    def sku(self) -> str: ...
    @property
    def location(self) -> str: ...
    @property
    def slot(self) -> int: ...
    @property
    def version_before(self) -> int: ...
    @property
    def version_after(self) -> int: ...
    @property
    def on_hand_delta(self) -> int: ...
    @property
    def reserved_delta(self) -> int: ...
    @property
    def on_hand(self) -> int: ...
    @property
    def reserved(self) -> int: ...
    @property
    def available(self) -> int: ...
    @property
    def cause(self) -> str: ...
    @property
    def reason(self) -> str: ...
    @property
    def actor(self) -> str: ...
    @property
    def ref(self) -> str: ...
    @property
    def requests(self) -> int: ...
    @property
    def alerts(self) -> int: ...
    @property
    def at_us(self) -> int: ...

class FeedPosition:
    """Where a feed consumer stands (opaque)."""
    def __init__(self) -> None: ...
    @property
    def after(self) -> int: ...

class FeedBatch:
    """The changes of one poll and the position after them."""
    @property
    def changes(self) -> list[Movement]: ...
    @property
    def next(self) -> FeedPosition: ...

class AuditViolation:
    """One broken invariant the audit found."""
    @property
    def check(self) -> str: ...
    @property
    def sku(self) -> str: ...
    @property
    def location(self) -> str: ...
    @property
    def slot(self) -> int: ...
    @property
    def subject(self) -> str: ...
    @property
    def expected(self) -> str: ...
    @property
    def found(self) -> str: ...

class AuditUnchecked:
    """A part of the data a check did not cover."""
    @property
    def check(self) -> str: ...
    @property
    def reason(self) -> str: ...

class AuditReport:
    """What the audit checked and found."""
    @property
    def violations(self) -> list[AuditViolation]: ...
    @property
    def truncated(self) -> bool: ...
    @property
    def rows(self) -> int: ...
    @property
    def reservations(self) -> int: ...
    @property
    def movements(self) -> int: ...
    @property
    def journal_checked(self) -> bool: ...
    @property
    def checks(self) -> list[str]: ...
    @property
    def unchecked(self) -> list[AuditUnchecked]: ...

class Lease:
    """A lease on a stock row, with its fencing token; times in us."""
    @property
    def sku(self) -> str: ...
    @property
    def location(self) -> str: ...
    @property
    def owner(self) -> str: ...
    @property
    def token(self) -> int: ...
    @property
    def expires_at_us(self) -> int: ...

class Reservation:
    """A reservation as committed: raw fields, times in us."""
    @property
    def id(self) -> bytes: ...
    @property
    def sku(self) -> str: ...
    @property
    def location(self) -> str: ...
    @property
    def qty(self) -> int: ...
    @property
    def held(self) -> int: ...
    @property
    def confirmed(self) -> int: ...
    @property
    def released(self) -> int: ...
    @property
    def expired(self) -> int: ...
    @property
    def returned(self) -> int: ...
    @property
    def order_id(self) -> Optional[bytes]: ...
    @property
    def ref(self) -> Optional[str]: ...
    @property
    def metadata(self) -> Optional[str]: ...
    @property
    def state(self) -> str: ...
    @property
    def version(self) -> int: ...
    @property
    def expires_at_us(self) -> int: ...
    @property
    def created_at_us(self) -> int: ...
    @property
    def updated_at_us(self) -> int: ...
    @property
    def idempotency_key(self) -> Optional[str]: ...
    @property
    def buyer(self) -> Optional[str]: ...
    @property
    def limit_group(self) -> Optional[str]: ...

class Clock:
    """Where a memory store reads the time."""

class ManualClock(Clock):
    """A clock that moves only when told to (microseconds since the epoch)."""
    def __init__(self, start_us: int) -> None: ...
    def now_us(self) -> int: ...
    def set_us(self, value_us: int) -> None: ...
    def advance_us(self, delta_us: int) -> int: ...

class LockHandle:
    """A lock held for a test; release() lets it go."""
    def release(self) -> None: ...
    @property
    def held(self) -> bool: ...

class AsyncChannel:
    """Completions of async calls, delivered in bulk: fd becomes readable while some wait;
    drain() takes them all as (token, value, error) tuples."""
    def __init__(self) -> None: ...
    @property
    def fd(self) -> int: ...
    def waiting(self) -> int: ...
    def drain(self) -> list[tuple[int, Any, Optional[BaseException]]]: ...

class BatcherOptions:
    """The hot-row batcher's options."""
    def __init__(self) -> None: ...
    shards: int
    batch_max: int
    queue_capacity: int
    enqueue_timeout_ms: int
    result_timeout_ms: int
    lock_slice_ms: int
    contended_linger_us: int

class AutoOptions:
    """When `auto` switches a SKU between strategies."""
    def __init__(self) -> None: ...
    hot_in_flight: int
    cool_in_flight: int
    cool_windows: int
    window_ms: int
    cells: int

class EngineOptions:
    """The engine's options, whatever its store."""
    def __init__(self) -> None: ...
    default_strategy: str
    retries_max: int
    lock_timeout_ms: int
    default_ttl_us: int
    batcher: BatcherOptions
    automatic: AutoOptions
    sku_entries: int
    async_workers: int
    async_queue_max: int
    home_slot: int
    slot_directory: int
    auto_slots_max: int
    auto_slots_cool_ms: int

class MemoryOptions:
    """The memory store's options."""
    def __init__(self) -> None: ...
    retention_us: int
    journal_max: int
    journal_retention_us: int
    feed_lag_max_us: int
    expire_lapsed: bool

class PostgresOptions:
    """The PostgreSQL store's options."""
    def __init__(self) -> None: ...
    dsn: str
    schema: str
    pool_size: int
    pool_timeout_ms: int
    resolve_timeout_ms: int
    call_timeout_ms: int
    cancel_grace_ms: int
    application_name: str
    pooler: str
    layout: str
    citus_routing: str
    sweeper: bool
    sweep_interval_ms: int
    sweep_batch: int
    retention_ms: int
    purge_batch: int
    journal_retention_ms: int
    feed_lag_max_ms: int
    feed_notify: bool

class Engine:
    """The engine facade over one store."""
    @staticmethod
    def memory(options: EngineOptions, clock: Optional[Clock], memory: MemoryOptions) -> Engine: ...
    @staticmethod
    def postgres(postgres: PostgresOptions, options: EngineOptions) -> Engine: ...
    def recommend(self, sku: str, location: str) -> tuple[str, list[str]]: ...
    def migrate(self, up_to: int) -> list[str]: ...
    def migration_plan(self, up_to: int) -> list[tuple[str, str]]: ...
    def drop_schema(self) -> None: ...
    def purge(self, older_than_us: int, limit: Optional[int]) -> int: ...
    def movements(
        self,
        sku: Optional[str],
        location: Optional[str],
        after: int,
        since_us: int,
        limit: int,
    ) -> list[Movement]: ...
    def set_low_stock(self, sku: str, location: str, threshold: Optional[int]) -> StockLevel: ...
    def audit(self, sku: Optional[str], limit: int, expiry_lag_us: int) -> AuditReport: ...
    def purge_movements(self, older_than_us: int, limit: Optional[int]) -> int: ...
    @property
    def last_audit_violations(self) -> int: ...
    def feed_open(self, consumer: str, from_start: bool) -> FeedPosition: ...
    def feed_poll(self, consumer: str, position: FeedPosition, limit: int) -> FeedBatch: ...
    def feed_commit(self, consumer: str, position: FeedPosition) -> None: ...
    def feed_drop(self, consumer: str) -> bool: ...
    def feed_wait(self, timeout_ms: int) -> str: ...
    def row_counts(self) -> dict[str, int]: ...
    def metrics(self) -> dict[str, Any]: ...
    def close(self) -> None: ...
    @property
    def backend(self) -> str: ...
    @property
    def default_strategy(self) -> str: ...
    def stats(self, sku_limit: int) -> dict[str, Any]: ...
    def restock(
        self,
        sku: str,
        location: str,
        qty: int,
        expected_version: Optional[int],
        fencing_token: Optional[int] = None,
        reason: str = "",
        actor: str = "",
        idempotency_key: Optional[str] = None,
    ) -> StockLevel: ...
    def set_on_hand(
        self,
        sku: str,
        location: str,
        on_hand: int,
        expected_version: Optional[int],
        fencing_token: Optional[int] = None,
        reason: str = "",
        actor: str = "",
        idempotency_key: Optional[str] = None,
    ) -> StockLevel: ...
    def set_backorder_limit(
        self,
        sku: str,
        location: str,
        limit: int,
        expected_version: Optional[int],
        fencing_token: Optional[int],
    ) -> StockLevel: ...
    def set_safety_stock(
        self,
        sku: str,
        location: str,
        units: int,
        expected_version: Optional[int],
        fencing_token: Optional[int],
    ) -> StockLevel: ...
    def move_units(
        self,
        sku: str,
        location: str,
        qty: int,
        from_state: str,
        to_state: str,
        reason: str,
        actor: str,
        idempotency_key: Optional[str],
        expected_version: Optional[int],
        fencing_token: Optional[int],
    ) -> StockLevel: ...
    def transfer(
        self,
        sku: str,
        qty: int,
        source: str,
        destination: str,
        reason: Optional[str],
        actor: Optional[str],
        idempotency_key: Optional[str],
    ) -> Transfer: ...
    def transfer_step(
        self,
        id: bytes,
        cancel: bool,
        accepted: int,
        rejected: int,
        idempotency_key: Optional[str],
    ) -> Transfer: ...
    def get_transfer(self, id: bytes) -> Transfer: ...
    def transfers(
        self,
        sku: Optional[str],
        state: Optional[str],
        after: Optional[bytes],
        limit: int,
    ) -> List[Transfer]: ...
    def set_discontinued(
        self,
        sku: str,
        location: str,
        discontinued: bool,
        expected_version: Optional[int],
        fencing_token: Optional[int],
    ) -> StockLevel: ...
    def set_purchase_limit(self, group: str, per_buyer: int, skus: list[str]) -> None: ...
    def remove_purchase_limit(self, group: str) -> bool: ...
    def buyer_held(self, group: str, buyer: str) -> int: ...
    def acquire_lease(self, sku: str, location: str, ttl_us: int, owner: str) -> Lease: ...
    def renew_lease(self, sku: str, location: str, token: int, ttl_us: int) -> Lease: ...
    def release_lease(self, sku: str, location: str, token: int) -> bool: ...
    def stock(self, sku: str, location: str) -> StockLevel: ...
    def stock_by_location(self, sku: str, after: Optional[str], limit: int) -> list[StockLevel]: ...
    def set_slots(self, sku: str, location: str, slots: int) -> StockLevel: ...
    def slot_count(self, sku: str, location: str) -> int: ...
    def sell(
        self,
        sku: str,
        location: str,
        qty: int,
        strategy: Optional[str],
        nowait: bool,
        lock_timeout_ms: Optional[int],
        expected_version: Optional[int],
        fencing_token: Optional[int] = None,
        idempotency_key: Optional[str] = None,
        ref: Optional[str] = None,
    ) -> StockLevel: ...
    def reserve(
        self,
        sku: str,
        location: str,
        qty: int,
        ttl_us: Optional[int],
        idempotency_key: Optional[str],
        strategy: Optional[str],
        nowait: bool,
        lock_timeout_ms: Optional[int],
        expected_version: Optional[int],
        buyer: Optional[str] = None,
        ref: Optional[str] = None,
        metadata: Optional[str] = None,
    ) -> Reservation: ...
    def reserve_order(
        self,
        lines: list[tuple[str, str, int]],
        ttl_us: Optional[int],
        idempotency_key: Optional[str],
        strategy: Optional[str],
        nowait: bool,
        lock_timeout_ms: Optional[int],
        buyer: Optional[str] = None,
        ref: Optional[str] = None,
        metadata: Optional[str] = None,
    ) -> list[Reservation]: ...
    def allocate(
        self,
        wants: list[tuple[str, int]],
        locations: list[str],
        policy: str,
        split: bool,
        ttl_us: Optional[int],
        idempotency_key: Optional[str],
        strategy: Optional[str],
        nowait: bool,
        lock_timeout_ms: Optional[int],
        buyer: Optional[str] = None,
        ref: Optional[str] = None,
        metadata: Optional[str] = None,
    ) -> list[Reservation]: ...
    def confirm(
        self,
        id: bytes,
        expected_version: Optional[int],
        qty: Optional[int] = None,
        release_rest: bool = False,
        idempotency_key: Optional[str] = None,
    ) -> Reservation: ...
    def release(
        self,
        id: bytes,
        expected_version: Optional[int],
        qty: Optional[int] = None,
        idempotency_key: Optional[str] = None,
    ) -> Reservation: ...
    def extend(
        self,
        id: bytes,
        ttl_us: int,
        expected_version: Optional[int],
        idempotency_key: Optional[str] = None,
    ) -> Reservation: ...
    def resize(
        self,
        id: bytes,
        qty: int,
        expected_version: Optional[int],
        idempotency_key: Optional[str] = None,
    ) -> Reservation: ...
    def return_units(
        self,
        id: bytes,
        qty: int,
        restock: bool,
        location: Optional[str],
        expected_version: Optional[int],
        reason: str,
        actor: str,
        idempotency_key: Optional[str] = None,
    ) -> Reservation: ...
    def get_reservation(self, id: bytes) -> Reservation: ...
    def order_step(
        self,
        kind: str,
        order_id: bytes,
        parts: List[Tuple[bytes, int]],
        ttl_us: int,
        release_rest: bool,
        idempotency_key: Optional[str],
    ) -> List[Reservation]: ...
    def get_order(self, order_id: bytes) -> List[Reservation]: ...
    def order_by_key(self, idempotency_key: str) -> List[Reservation]: ...
    def find_reservations(
        self,
        ref: Optional[str],
        order_id: Optional[bytes],
        buyer: Optional[str],
        sku: Optional[str],
        location: Optional[str],
        state: Optional[str],
        after: Optional[bytes],
        limit: int,
    ) -> List[Reservation]: ...
    def expire_due(self, limit: int) -> int: ...
    def submit_reserve(
        self,
        channel: AsyncChannel,
        token: int,
        sku: str,
        location: str,
        qty: int,
        ttl_us: Optional[int],
        idempotency_key: Optional[str],
        strategy: Optional[str],
        nowait: bool,
        lock_timeout_ms: Optional[int],
        expected_version: Optional[int],
        buyer: Optional[str] = None,
        ref: Optional[str] = None,
        metadata: Optional[str] = None,
    ) -> None: ...
    def submit_sell(
        self,
        channel: AsyncChannel,
        token: int,
        sku: str,
        location: str,
        qty: int,
        strategy: Optional[str],
        nowait: bool,
        lock_timeout_ms: Optional[int],
        expected_version: Optional[int],
        fencing_token: Optional[int] = None,
        idempotency_key: Optional[str] = None,
        ref: Optional[str] = None,
    ) -> None: ...
    def submit_reserve_order(
        self,
        channel: AsyncChannel,
        token: int,
        lines: list[tuple[str, str, int]],
        ttl_us: Optional[int],
        idempotency_key: Optional[str],
        strategy: Optional[str],
        nowait: bool,
        lock_timeout_ms: Optional[int],
        buyer: Optional[str] = None,
        ref: Optional[str] = None,
        metadata: Optional[str] = None,
    ) -> None: ...
    def submit_allocate(
        self,
        channel: AsyncChannel,
        token: int,
        wants: list[tuple[str, int]],
        locations: list[str],
        policy: str,
        split: bool,
        ttl_us: Optional[int],
        idempotency_key: Optional[str],
        strategy: Optional[str],
        nowait: bool,
        lock_timeout_ms: Optional[int],
        buyer: Optional[str] = None,
        ref: Optional[str] = None,
        metadata: Optional[str] = None,
    ) -> None: ...
    def submit_confirm(
        self,
        channel: AsyncChannel,
        token: int,
        id: bytes,
        expected_version: Optional[int],
        qty: Optional[int] = None,
        release_rest: bool = False,
        idempotency_key: Optional[str] = None,
    ) -> None: ...
    def submit_release(
        self,
        channel: AsyncChannel,
        token: int,
        id: bytes,
        expected_version: Optional[int],
        qty: Optional[int] = None,
        release_rest: bool = False,
        idempotency_key: Optional[str] = None,
    ) -> None: ...
    def submit_extend(
        self,
        channel: AsyncChannel,
        token: int,
        id: bytes,
        ttl_us: int,
        expected_version: Optional[int],
        idempotency_key: Optional[str] = None,
    ) -> None: ...

# Test hooks and tooling (register_testing.cpp).
def naive_reserve_unsafe(
    engine: Engine, sku: str, location: str, qty: int, ttl_us: int, window_us: int
) -> Reservation: ...
def limited_reserve_by_check(
    engine: Engine,
    sku: str,
    location: str,
    qty: int,
    buyer: str,
    serializable: bool,
    window_us: int,
) -> Reservation: ...
def hold_lock(
    engine: Engine, sku: str, location: str, kind: str, timeout_ms: int
) -> LockHandle: ...
def drive_load(
    engine: Engine,
    skus: list[tuple[str, str]],
    clients: int,
    window: int,
    duration_ms: int,
    qty: int,
    ttl_us: int,
    strategy: Optional[str],
    keyed: bool = ...,
    confirm: bool = ...,
    buyers: int = ...,
    sell: bool = ...,
    fencing_token: Optional[int] = ...,
    confirm_qty: int = ...,
    release_rest: bool = ...,
    pool: list[str] = ...,
) -> dict[str, Any]: ...
def prepared_statements(schema: str) -> list[dict[str, Any]]: ...
def make_uuid_v7(unix_ms: int, shard_key: int) -> bytes: ...
def uuid_shard_key(id: bytes) -> int: ...
def shard_key_of(sku: str, location: str) -> int: ...
def stable_hash64(sku: str, location: str) -> int: ...
def take_last_batch_size() -> int: ...
def take_logs(max: int, timeout_ms: int) -> tuple[list[tuple[int, str, str, int]], int]: ...
def set_log_level(level: int) -> None: ...
def stop_taking_logs() -> None: ...
def log_for_test(level: int, message: str) -> None: ...
