// The memory store's movement journal and its feed consumers (docs/journal.md).
//
// Entries are appended under the changed row's latch (RowLatch::publish), so per row they
// follow the versions, and under the journal's mutex, which hands out positions: an entry
// is visible from the moment it has its position, so `position > last` skips nothing
// here (the memory store has no transaction that commits after another took a later
// position). The journal keeps at most `capacity` entries, dropping the oldest; a
// consumer whose next change was dropped is overrun, and its poll says so (FeedOverrun).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "memory/row_cell.hpp"
#include "stockade/clock.hpp"
#include "stockade/journal.hpp"

namespace stockade::detail {

class MemoryJournal final : public RowJournal {
 public:
  MemoryJournal(std::shared_ptr<Clock> clock, std::size_t capacity);

  void record(const SkuKey& key, const RowValues* before, const RowValues& after) override;

  std::vector<Movement> read(const MovementQuery& query) const;
  // Makes the consumer if it is new (at the start of the journal, or at its end when
  // `from_start` is false) and returns its committed position.
  FeedPosition open(const std::string& consumer, bool from_start);
  FeedBatch poll(const std::string& consumer, const FeedPosition& from, std::size_t limit) const;
  void commit(const std::string& consumer, const FeedPosition& at);
  bool drop(const std::string& consumer);
  // Drops entries older than `older_than_us` that every consumer has passed, or older
  // than `lag_max_us` whatever the consumers (those it passes are overrun); at most
  // `limit`. Returns how many went.
  std::uint64_t purge(std::int64_t older_than_us, std::int64_t lag_max_us, std::uint64_t limit);
  std::uint64_t size() const;
  // Waits up to `timeout_us` for an entry to be appended.
  FeedWake wait(std::int64_t timeout_us) const;

 private:
  struct Consumer {
    std::int64_t committed = 0;
    bool overrun = false;
  };
  std::int64_t first_position() const { return next_ - static_cast<std::int64_t>(entries_.size()); }
  void drop_front_locked();

  std::shared_ptr<Clock> clock_;
  const std::size_t capacity_;
  mutable std::mutex mutex_;
  mutable std::condition_variable appended_;
  std::deque<Movement> entries_;
  std::int64_t next_ = 1;
  std::map<std::string, Consumer> consumers_;
};

}  // namespace stockade::detail
