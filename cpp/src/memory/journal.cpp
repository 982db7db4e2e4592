#include "memory/journal.hpp"

#include <algorithm>

#include "stockade/errors.hpp"

namespace stockade::detail {

namespace {

RowChange change_of(const RowValues* v) {
  RowChange c;
  if (v == nullptr) return c;
  c.on_hand = v->on_hand;
  c.reserved = v->reserved;
  c.backorder_limit = v->backorder_limit;
  c.safety_stock = v->safety_stock;
  c.damaged = v->damaged;
  c.quality_control = v->quality_control;
  c.incoming = v->incoming;
  c.discontinued = v->discontinued != 0;
  if (v->low_stock != RowValues::no_low_stock) c.low_stock = v->low_stock;
  c.lease_token = v->lease_token;
  c.lease_expires_us = v->lease_expires_us;
  c.version = v->version;
  return c;
}

[[noreturn]] void throw_overrun(const std::string& consumer) {
  throw Error(ErrorCode::feed_overrun,
              "feed consumer " + shown(consumer) +
                  " fell behind what the journal keeps: changes it had not read were dropped "
                  "(feed_lag_max, or the memory store's journal_max); reset it with "
                  "Feed.reset() to go on from the journal's start");
}

bool matches(const Movement& m, const MovementQuery& q) {
  if (q.sku && m.key.sku != *q.sku) return false;
  if (q.location && m.key.location != *q.location) return false;
  return m.position > q.after && m.at_us >= q.since_us;
}

}  // namespace

MemoryJournal::MemoryJournal(std::shared_ptr<Clock> clock, std::size_t capacity)
    : clock_(std::move(clock)), capacity_(capacity) {}

void MemoryJournal::record(const SkuKey& key, const RowValues* before, const RowValues& after) {
  if (capacity_ == 0) return;
  RowChange was = change_of(before);
  RowChange now = change_of(&after);
  now.created = before == nullptr;
  const JournalNote* note = current_note();
  Movement m;
  m.key = key;
  m.version_before = before == nullptr ? 0 : before->version;
  m.version_after = after.version;
  m.on_hand_delta = after.on_hand - was.on_hand;
  m.reserved_delta = after.reserved - was.reserved;
  m.on_hand = after.on_hand;
  m.reserved = after.reserved;
  m.available = available_of(now);
  m.cause = cause_of(was, now, note != nullptr ? note->cause : std::string());
  if (note != nullptr) {
    m.reason = note->reason;
    m.actor = note->actor;
    m.ref = note->ref;
  }
  m.requests = std::max<std::int64_t>(after.version - m.version_before, 1);
  m.alerts = alerts_of(was, now);
  m.at_us = after.updated_at_us != 0 ? after.updated_at_us : clock_->now_us();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    m.position = next_++;
    entries_.push_back(std::move(m));
    if (entries_.size() > capacity_) drop_front_locked();
  }
  appended_.notify_all();  // no waiter: an atomic load, no system call
}

FeedWake MemoryJournal::wait(std::int64_t timeout_us) const {
  std::unique_lock<std::mutex> lock(mutex_);
  const std::int64_t seen = next_;
  const bool changed = appended_.wait_for(lock, std::chrono::microseconds(timeout_us),
                                          [&] { return next_ != seen; });
  return changed ? FeedWake::changed : FeedWake::timeout;
}

void MemoryJournal::drop_front_locked() {
  const std::int64_t dropped = entries_.front().position;
  entries_.pop_front();
  for (auto& [name, consumer] : consumers_) {
    if (consumer.committed < dropped) consumer.overrun = true;
  }
}

std::vector<Movement> MemoryJournal::read(const MovementQuery& query) const {
  std::vector<Movement> out;
  std::lock_guard<std::mutex> lock(mutex_);
  const std::int64_t first = first_position();
  std::size_t i = query.after >= first ? static_cast<std::size_t>(query.after - first + 1) : 0;
  for (; i < entries_.size() && out.size() < query.limit; ++i) {
    if (matches(entries_[i], query)) out.push_back(entries_[i]);
  }
  return out;
}

FeedPosition MemoryJournal::open(const std::string& consumer, bool from_start) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto [it, made] = consumers_.try_emplace(consumer);
  if (made) it->second.committed = from_start ? first_position() - 1 : next_ - 1;
  if (it->second.overrun) throw_overrun(consumer);
  return FeedPosition{"", "", it->second.committed};
}

FeedBatch MemoryJournal::poll(const std::string& consumer, const FeedPosition& from,
                              std::size_t limit) const {
  FeedBatch batch;
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = consumers_.find(consumer);
  if (it == consumers_.end()) {
    throw Error(ErrorCode::not_found, "no feed consumer " + shown(consumer) + " (it was dropped)");
  }
  const std::int64_t first = first_position();
  if (it->second.overrun || from.after < first - 1) throw_overrun(consumer);
  std::size_t i = static_cast<std::size_t>(from.after - first + 1);
  for (; i < entries_.size() && batch.changes.size() < limit; ++i) {
    batch.changes.push_back(entries_[i]);
  }
  batch.next = from;
  if (!batch.changes.empty()) batch.next.after = batch.changes.back().position;
  return batch;
}

void MemoryJournal::commit(const std::string& consumer, const FeedPosition& at) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = consumers_.find(consumer);
  if (it == consumers_.end()) {
    throw Error(ErrorCode::not_found, "no feed consumer " + shown(consumer) + " (it was dropped)");
  }
  if (it->second.overrun) throw_overrun(consumer);
  it->second.committed = std::max(it->second.committed, at.after);
}

bool MemoryJournal::drop(const std::string& consumer) {
  std::lock_guard<std::mutex> lock(mutex_);
  return consumers_.erase(consumer) > 0;
}

std::uint64_t MemoryJournal::purge(std::int64_t older_than_us, std::int64_t lag_max_us,
                                   std::uint64_t limit) {
  const TimestampUs now = clock_->now_us();
  std::lock_guard<std::mutex> lock(mutex_);
  std::int64_t passed = next_ - 1;  // the lowest position every consumer has committed
  for (const auto& [name, consumer] : consumers_) {
    if (!consumer.overrun) passed = std::min(passed, consumer.committed);
  }
  std::uint64_t gone = 0;
  while (!entries_.empty() && gone < limit) {
    const Movement& m = entries_.front();
    const bool old = m.at_us < now - older_than_us;
    const bool too_old = m.at_us < now - lag_max_us;
    if (!old || (m.position > passed && !too_old)) break;
    drop_front_locked();
    ++gone;
  }
  return gone;
}

std::uint64_t MemoryJournal::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_.size();
}

}  // namespace stockade::detail
