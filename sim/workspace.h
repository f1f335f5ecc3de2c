// Working storage a caller reuses from one simulator call to the next (the hot paths keep their
// vectors' capacity instead of allocating them again), owned by whoever makes the calls: a Simulator
// (sim/simulator.h) holds one, a planner thread holds its own Simulator. Nothing in sim/ keeps state
// between calls on its own (no thread_local, no global): a call without a Workspace gets fresh storage.
//
// A Workspace holds one object per type, created on first use. with<T>(f) calls f(T&) with that object,
// or with a fresh T when the object is already in use (a nested call on the same Workspace). A
// Workspace is not thread-safe: one thread uses it at a time.
#pragma once
#include <memory>
#include <utility>
#include <vector>

namespace fsdpsim::sim {

class Workspace {
 public:
  Workspace() = default;
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  Workspace(Workspace&&) noexcept = default;
  Workspace& operator=(Workspace&&) noexcept = default;

  template <class T, class F>
  decltype(auto) with(F&& f) {
    Slot& s = slot<T>();
    if (s.in_use) {
      T local{};
      return f(local);
    }
    s.in_use = true;
    struct Release {
      bool& flag;
      ~Release() { flag = false; }
    } release{s.in_use};
    return f(*static_cast<T*>(s.object.get()));
  }

 private:
  struct Slot {
    const void* key = nullptr;
    std::unique_ptr<void, void (*)(void*)> object{nullptr, [](void*) {}};
    bool in_use = false;
  };
  template <class T>
  static const void* key_of() {
    static const char k = 0;   // one address per type: an identity, never written
    return &k;
  }
  template <class T>
  Slot& slot() {
    const void* k = key_of<T>();
    for (auto& s : slots_)
      if (s->key == k) return *s;
    auto s = std::make_unique<Slot>();
    s->key = k;
    s->object = std::unique_ptr<void, void (*)(void*)>(new T{}, [](void* p) { delete static_cast<T*>(p); });
    slots_.push_back(std::move(s));
    return *slots_.back();
  }
  std::vector<std::unique_ptr<Slot>> slots_;   // a handful of types: a linear search is the fastest lookup
};

// f(T&) with `ws`'s T, or with a fresh T when there is no workspace.
template <class T, class F>
decltype(auto) with_storage(Workspace* ws, F&& f) {
  if (ws) return ws->with<T>(std::forward<F>(f));
  T local{};
  return f(local);
}

}  // namespace fsdpsim::sim
