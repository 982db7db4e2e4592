// The batch seam: what the hot-row batcher hands a store (Store::apply_batch), one
// BatchItem per request. The batcher assigns each request (BatchRequest) to a preallocated
// record; the store fills the outcome.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "stockade/errors.hpp"
#include "stockade/hash.hpp"
#include "stockade/types.hpp"

namespace stockade {

// The outcome is a reservation (reserve, confirm, release), a stock level (sell), or a
// per-request error such as OutOfStock.
enum class BatchOp : std::uint8_t { reserve, sell, confirm, release };

inline bool is_transition(BatchOp op) {
  return op == BatchOp::confirm || op == BatchOp::release;
}

// What one request asks, as the engine makes it and the batcher carries it to a store. It
// travels whole (BatchItem::assign), so that a field added here reaches every copy.
struct BatchRequest {
  BatchOp op = BatchOp::reserve;
  SkuKey key;               // reserve and sell
  Quantity qty = 0;         // reserve and sell; confirm and release: held units (0: all)
  std::int64_t ttl_us = 0;  // reserve only
  std::optional<std::string> idempotency_key;  // any: reserve, sell, confirm, release
  std::optional<std::string> buyer;            // reserve only: purchase limits apply
  std::optional<std::string> ref;              // reserve only: kept with the reservation
  std::optional<std::string> metadata;         // reserve only: a JSON object, checked
  std::optional<Uuid> order_id;  // reserve only: the order it is a line of (an allocation's)
  Uuid id;                       // confirm and release
  std::optional<Version> expected_version;  // confirm and release: the reservation's
  // The strategy the caller asked for, under which telemetry counts the outcome (reserve
  // and sell); transitions are not counted per strategy.
  std::optional<Strategy> counted_as;
  // The engine counted the request in flight in the contention tracker; the batcher
  // leaves the tracker for it when it finishes.
  bool in_flight = false;
  // When the engine made the request (steady clock, microseconds): its latency is
  // recorded when it finishes.
  std::int64_t started_us = 0;
  // As WriteOptions: whether the store counts the request per SKU, and whether an
  // OutOfStock is the call's outcome. If not, the engine may still run the call again on
  // another of the SKU's rows, and records its outcome itself: the batcher records
  // nothing of such a refusal.
  bool count_request = true;
  bool count_refusal = true;
  // confirm: release what is still held after qty units (TransitionRequest::release_rest).
  bool release_rest = false;
};

// One request in a batch: what it asks, and its outcome, which the store writes.
struct BatchItem : BatchRequest {
  // Outcome, written by the store.
  bool ok = false;
  // Requests in the batch it ran in (its last, if it ran again on another slot row);
  // written by the batcher, for tracing.
  std::uint32_t batch_size = 0;
  Reservation reservation;
  StockLevel level;
  std::optional<Error> error;
  // The version of the request's stock row as its batch found it and as it left it
  // (once the batch committed; a transition's row is its reservation's, reported when it
  // went through; 0 when the store does not say, as the memory store does not: it has no
  // commit to amortize). The batcher compares a row's found version with the one its
  // previous batch left to see another writer between its batches.
  Version row_found = 0;
  Version row_left = 0;

  // The stock row whose versions row_found and row_left give.
  const SkuKey& row_key() const { return is_transition(op) ? reservation.key : key; }

  void clear_outcome() {
    ok = false;
    error.reset();
    row_found = row_left = 0;
  }
  // Takes `request` whole, with a clean outcome (the batcher reuses its records: the
  // strings keep their capacity).
  void assign(const BatchRequest& request) {
    static_cast<BatchRequest&>(*this) = request;
    clear_outcome();
  }

  // The 16-bit shard key of the row this request is about: from its SKU, or from the
  // reservation id, which carries it.
  std::uint16_t shard_key() const {
    return is_transition(op) ? id.shard_key() : row_shard_key(key.sku, key.location);
  }
};

// How a batch may wait for its locks.
struct BatchOptions {
  std::int64_t lock_timeout_ms = 10000;
};

}  // namespace stockade
