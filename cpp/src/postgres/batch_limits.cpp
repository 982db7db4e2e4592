// The purchase-limit part of a batch (BatchTx, batch_tx.hpp): the (group, buyer) parent
// rows it locks, each reserve's allowance, and the net change written to each row.
#include <algorithm>
#include <limits>

#include "base/invariant.hpp"
#include "postgres/batch_tx.hpp"
#include "stockade/hash.hpp"
#include "store/fingerprint.hpp"

namespace stockade::detail::pg {

// The parent rows of every (group, buyer) the batch touches: those of reserves with a
// buyer on a limited SKU (made if new), and those of the holds it releases or expires.
// Locked in sorted order after the reservation rows and before any stock row.
void BatchTx::lock_allowances(Tx& tx) {
  std::vector<std::string> skus;
  for (std::size_t i = 0; i < items_.size(); ++i) {
    const BatchItem& item = *items_[i];
    if (!decided_[i] && item.op == BatchOp::reserve && item.buyer) skus.push_back(item.key.sku);
  }
  if (!skus.empty()) {
    for (const auto& row : tx.exec(Stmt::limit_lookup, text_array(skus))) {
      limits_.emplace(row[0].as<std::string>(),
                      std::make_pair(row[1].as<std::string>(), row[2].as<std::int64_t>()));
    }
  }
  std::set<std::pair<std::string, std::string>> made, existing;
  for (std::size_t i = 0; i < items_.size(); ++i) {
    const BatchItem& item = *items_[i];
    if (decided_[i] || item.op != BatchOp::reserve || !item.buyer) continue;
    if (auto it = limits_.find(item.key.sku); it != limits_.end()) {
      made.emplace(it->second.first, *item.buyer);
    }
  }
  for (const auto& [id, hold] : holds_) {
    const Reservation& r = hold.reservation;
    if (r.buyer && r.limit_group) existing.emplace(*r.limit_group, *r.buyer);
  }
  if (made.empty() && existing.empty()) return;
  std::vector<std::string> groups, buyers;
  for (const auto& [group, buyer] : made) {
    groups.push_back(group);
    buyers.push_back(buyer);
  }
  if (!groups.empty()) allowance_statement(tx, Stmt::batch_allowance_make, groups, buyers, {});
  for (const auto& [group, buyer] : existing) {
    if (made.count({group, buyer}) != 0) continue;
    groups.push_back(group);
    buyers.push_back(buyer);
  }
  for (const auto& rows : allowance_statement(tx, Stmt::batch_allowance_lock, groups, buyers, {})) {
    for (const auto& row : rows) {
      allowances_[{row[0].as<std::string>(), row[1].as<std::string>()}].held =
          row[2].as<std::int64_t>();
    }
  }
}

// Runs a batch_allowance_* statement on the pairs (groups[i], buyers[i]) (and `deltas`,
// if given): once for all of them on one server; on Citus, where each pair's row lies on
// the shard of its own shard key, once per pair, in (group, buyer) order, which is the
// order every path locks them in.
std::vector<pqxx::result> BatchTx::allowance_statement(Tx& tx, Stmt statement,
                                                       const std::vector<std::string>& groups,
                                                       const std::vector<std::string>& buyers,
                                                       const std::vector<std::int64_t>& deltas) {
  std::vector<pqxx::result> out;
  const auto run_on = [&](std::uint16_t shard, const std::vector<std::string>& g,
                          const std::vector<std::string>& b, const std::vector<std::int64_t>& d) {
    out.push_back(d.empty()
                      ? tx.exec_on(shard, statement, text_array(g), text_array(b))
                      : tx.exec_on(shard, statement, text_array(g), text_array(b), int_array(d)));
  };
  if (!tx.conn.statements().citus()) {
    run_on(0, groups, buyers, deltas);
    return out;
  }
  std::vector<std::size_t> order(groups.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return std::tie(groups[a], buyers[a]) < std::tie(groups[b], buyers[b]);
  });
  for (const std::size_t i : order) {
    const std::uint16_t shard = shard_key_of(groups[i], buyers[i]);
    if (statement == Stmt::batch_allowance_make) {  // VALUES: see allowance_make_one
      out.push_back(tx.exec_on(shard, Stmt::allowance_make_one, groups[i], buyers[i]));
      continue;
    }
    run_on(shard, {groups[i]}, {buyers[i]},
           deltas.empty() ? std::vector<std::int64_t>{} : std::vector<std::int64_t>{deltas[i]});
  }
  return out;
}

bool BatchTx::limit_refuses(BatchItem& item) {
  auto limit = limits_.find(item.key.sku);
  if (limit == limits_.end()) return false;
  const auto& [group, per_buyer] = limit->second;
  const Allowance& a = allowances_[{group, *item.buyer}];
  if (a.held + a.delta + item.qty <= per_buyer) return false;
  fail(item, limit_exceeded(item.key, group, *item.buyer, a.held + a.delta, per_buyer, item.qty));
  return true;
}

void BatchTx::write_allowances(Tx& tx) {
  std::vector<std::string> groups, buyers;
  std::vector<std::int64_t> deltas;
  for (const auto& [pair, a] : allowances_) {
    if (a.delta == 0) continue;
    groups.push_back(pair.first);
    buyers.push_back(pair.second);
    deltas.push_back(a.delta);
  }
  if (groups.empty()) return;
  allowance_statement(tx, Stmt::batch_allowance_write, groups, buyers, deltas);
}

}  // namespace stockade::detail::pg
