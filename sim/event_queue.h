// The event list of the discrete-event core (style.md lesson 2, after ns-3's scheduler): events are
// ordered by (time, insertion sequence), so events at the same time run first-in first-out and a run
// is deterministic; time never runs backwards (asserted); no singletons — each executor owns one.
// An event can be moved to a new time in place (reschedule): it then takes a fresh sequence number,
// exactly as if it had been cancelled and scheduled anew, but no stale copy is left to pop and skip.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "common/units.h"

namespace fsdpsim::sim {

// Payload is a small trivially-copyable struct chosen by the user of the queue.
//
// Storage: an unsorted array plus the index of its earliest event. The executor keeps only a few
// events pending at a time (one completion per busy stream and the CPU's event), so a linear scan on
// pop beats a heap's sifting; schedule() and next_time() are O(1). The order is exactly
// (time, sequence) either way.
template <class Payload>
class EventQueue {
 public:
  struct Event {
    TimeNs time = 0;
    std::uint64_t seq = 0;
    Payload payload{};
  };

  // Schedules an event at absolute time `t` (>= now()).
  void schedule(TimeNs t, const Payload& p) {
    if (t < now_) [[unlikely]] throw std::logic_error("EventQueue: event scheduled in the past");
    // A new event has the largest sequence number: it is the earliest only if strictly earlier.
    if (events_.empty() || t < events_[min_].time) min_ = events_.size();
    events_.push_back(Event{t, next_seq_++, p});
  }
  // Moves the first pending event whose payload satisfies `match` to time `t` (>= now()) with a fresh
  // sequence number; returns false if there is none. Call refresh_min() after a batch of these.
  template <class Match>
  bool reschedule(TimeNs t, Match&& match) {
    if (t < now_) [[unlikely]] throw std::logic_error("EventQueue: event scheduled in the past");
    for (Event& e : events_) {
      if (match(e.payload)) {
        e.time = t;
        e.seq = next_seq_++;
        return true;
      }
    }
    return false;
  }
  // Recomputes the earliest event (after reschedule).
  void refresh_min() {
    std::size_t m = 0;
    for (std::size_t i = 1; i < events_.size(); ++i)
      if (before(events_[i], events_[m])) m = i;
    min_ = m;
  }
  bool empty() const { return events_.empty(); }
  std::size_t size() const { return events_.size(); }
  // Time of the earliest pending event (queue must not be empty).
  TimeNs next_time() const { return events_[min_].time; }
  TimeNs now() const { return now_; }

  // Removes and returns the earliest event; advances now() to its time.
  Event pop() {
    Event e = events_[min_];
    events_[min_] = events_.back();
    events_.pop_back();
    refresh_min();
    if (e.time < now_) [[unlikely]] throw std::logic_error("EventQueue: time ran backwards");
    now_ = e.time;
    return e;
  }

  // Visits every pending event, in storage order (not time order).
  template <class F>
  void for_each(F&& f) const {
    for (const Event& e : events_) f(e);
  }
  // Moves every pending event, and now(), `dt` (>= 0) later, keeping their sequence numbers (so their
  // order), and lets `f` rewrite each payload. The executor's fast-forward over repeated blocks uses it.
  template <class F>
  void shift(TimeNs dt, F&& f) {
    if (dt < 0) [[unlikely]] throw std::logic_error("EventQueue: shift into the past");
    for (Event& e : events_) {
      e.time += dt;
      f(e.payload);
    }
    now_ += dt;
  }

  void clear() {
    events_.clear();
    min_ = 0;
    now_ = 0;
    next_seq_ = 0;
  }
  void reserve(std::size_t n) { events_.reserve(n); }

 private:
  static bool before(const Event& a, const Event& b) {
    return a.time != b.time ? a.time < b.time : a.seq < b.seq;
  }

  std::vector<Event> events_;   // unordered; events_[min_] is the earliest by (time, seq)
  std::size_t min_ = 0;
  TimeNs now_ = 0;
  std::uint64_t next_seq_ = 0;
};

}  // namespace fsdpsim::sim
