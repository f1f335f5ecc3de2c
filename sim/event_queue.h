// The event list of the discrete-event core (style.md lesson 2, after ns-3's scheduler): events are
// ordered by (time, insertion sequence), so events at the same time run first-in first-out and a run
// is deterministic; time never runs backwards (asserted); no singletons — each executor owns one.
// Cancelling is done by the owner (a version number carried in the payload), not by the queue.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "common/units.h"

namespace fsdpsim::sim {

// Payload is a small trivially-copyable struct chosen by the user of the queue.
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
    if (t < now_) throw std::logic_error("EventQueue: event scheduled in the past");
    heap_.push_back(Event{t, next_seq_++, p});
    sift_up(heap_.size() - 1);
  }
  bool empty() const { return heap_.empty(); }
  std::size_t size() const { return heap_.size(); }
  // Time of the earliest pending event (queue must not be empty).
  TimeNs next_time() const { return heap_.front().time; }
  TimeNs now() const { return now_; }

  // Removes and returns the earliest event; advances now() to its time.
  Event pop() {
    Event e = heap_.front();
    heap_.front() = heap_.back();
    heap_.pop_back();
    if (!heap_.empty()) sift_down(0);
    if (e.time < now_) throw std::logic_error("EventQueue: time ran backwards");
    now_ = e.time;
    return e;
  }

  void clear() {
    heap_.clear();
    now_ = 0;
    next_seq_ = 0;
  }
  void reserve(std::size_t n) { heap_.reserve(n); }

 private:
  static bool before(const Event& a, const Event& b) {
    return a.time != b.time ? a.time < b.time : a.seq < b.seq;
  }
  void sift_up(std::size_t i) {
    Event e = heap_[i];
    while (i > 0) {
      std::size_t parent = (i - 1) / 2;
      if (!before(e, heap_[parent])) break;
      heap_[i] = heap_[parent];
      i = parent;
    }
    heap_[i] = e;
  }
  void sift_down(std::size_t i) {
    const std::size_t n = heap_.size();
    Event e = heap_[i];
    for (;;) {
      std::size_t c = 2 * i + 1;
      if (c >= n) break;
      if (c + 1 < n && before(heap_[c + 1], heap_[c])) ++c;
      if (!before(heap_[c], e)) break;
      heap_[i] = heap_[c];
      i = c;
    }
    heap_[i] = e;
  }

  std::vector<Event> heap_;   // binary min-heap on (time, seq)
  TimeNs now_ = 0;
  std::uint64_t next_seq_ = 0;
};

}  // namespace fsdpsim::sim
