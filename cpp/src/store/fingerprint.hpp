// Request fingerprints for idempotency keys: the same key with the same request replays
// the original reservation; the same key with a different request is a conflict. The
// strategy is not part of the request (it says how, not what), the TTL is.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "stockade/store.hpp"

namespace stockade::detail {

std::string fingerprint(const ReserveRequest& request);
std::string fingerprint(const OrderRequest& request);
// An allocation's: its SKUs and quantities, the pool in its order, the policy, split, the
// TTL, the buyer and references.
std::string fingerprint(const AllocateRequest& request);

// What a request asked, as far as an IdempotencyConflict names it: whether it was an
// order, its lines (SKUs at their locations, slots folded, in key order), its TTL, its
// buyer. Read back from the reservations a key made (and the key's stored fingerprint,
// which says reserve or order), the TTL is known only while none of them has changed.
struct Asked {
  bool order = false;
  std::vector<std::pair<SkuKey, Quantity>> lines;
  std::optional<std::int64_t> ttl_us;
  std::optional<std::string> buyer;
  // An allocation (store/allocation.hpp; an order too): its lines are its SKUs' totals,
  // each at location "" (where the units came from is the allocation's to decide).
  bool allocation = false;
};
Asked asked_by(const ReserveRequest& request);
Asked asked_by(const OrderRequest& request);
Asked asked_by(const AllocateRequest& request);
Asked asked_by(const std::vector<Reservation>& made, const std::string& fingerprint);

// The conflict of a key made for `first` and used again for `now` (each as asked_by gives
// it, its lines in key order). The message names the
// fields that differ, and this request's own values where they help ("its ttl differs
// (this request: 900 s ...)"), never the first request's: that may be another caller's.
Error idempotency_conflict(const std::string& key, const Asked& first, const Asked& now);

}  // namespace stockade::detail
