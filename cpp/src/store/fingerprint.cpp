#include "store/fingerprint.hpp"

#include <algorithm>
#include <cstdio>

#include "stockade/hash.hpp"

namespace stockade::detail {
namespace {

std::string hex64(std::uint64_t value) {
  char out[17];
  std::snprintf(out, sizeof(out), "%016llx", static_cast<unsigned long long>(value));
  return out;
}

}  // namespace

std::string fingerprint(const ReserveRequest& request) {
  const std::string qty = std::to_string(request.qty);
  const std::string ttl = std::to_string(request.ttl_us);
  // A hot-row slot's row prints as its SKU: a replay may reach another slot than the
  // first request did, and is the same request.
  const SkuKey key = base_key(request.key);
  std::uint64_t h = stable_hash64({"reserve", key.sku, key.location, qty, ttl});
  // A buyer joins the print only when there is one, so keys made without one still replay.
  if (request.options.buyer) h = stable_hash64({hex64(h), "buyer", *request.options.buyer});
  return "r1:" + hex64(h);
}

std::string fingerprint(const OrderRequest& request) {
  std::vector<const OrderLine*> lines;
  lines.reserve(request.lines.size());
  for (const auto& line : request.lines) lines.push_back(&line);
  std::sort(lines.begin(), lines.end(), [](auto* a, auto* b) { return a->key < b->key; });
  std::uint64_t h = stable_hash64({"order", std::to_string(request.ttl_us)});
  for (const auto* line : lines) {
    const std::string qty = std::to_string(line->qty);
    const std::string prev = hex64(h);
    const SkuKey key = base_key(line->key);
    h = stable_hash64({prev, key.sku, key.location, qty});
  }
  if (request.options.buyer) h = stable_hash64({hex64(h), "buyer", *request.options.buyer});
  return "o1:" + hex64(h);
}

}  // namespace stockade::detail
