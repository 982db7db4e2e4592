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

// What a request asked, as far as an IdempotencyConflict names it: its lines (SKUs at
// their locations, slots folded, in key order), its TTL, its buyer. Read back from the
// reservations a key made, the TTL is known only while none of them has changed (an
// extend moves expires_at).
struct Asked {
  std::vector<std::pair<SkuKey, Quantity>> lines;
  std::optional<std::int64_t> ttl_us;
  std::optional<std::string> buyer;
};
Asked asked_by(const ReserveRequest& request);
Asked asked_by(const OrderRequest& request);
Asked asked_by(const std::vector<Reservation>& made);

// The conflict of a key made for `first` and used again for `now`: the message names the
// fields that differ ("qty 2 first, 3 now"), or says which can differ unseen.
Error idempotency_conflict(const std::string& key, const Asked& first, const Asked& now);

}  // namespace stockade::detail
