// Request fingerprints for idempotency keys: the same key with the same request replays
// the original reservation; the same key with a different request is a conflict. The
// strategy is not part of the request (it says how, not what), the TTL is.
#pragma once

#include <string>

#include "stockade/store.hpp"

namespace stockade::detail {

std::string fingerprint(const ReserveRequest& request);
std::string fingerprint(const OrderRequest& request);

}  // namespace stockade::detail
