// Working storage reused from one call to the next on the same thread (the hot paths keep their
// vectors' capacity instead of allocating them again), safe against re-entry: a call made while the
// thread's object is in use (a nested call) gets a fresh one.
#pragma once

namespace fsdpsim::sim {

template <class T>
struct ThreadStorage {
  T object;
  bool in_use = false;
};

template <class T>
ThreadStorage<T>& thread_storage() {
  thread_local ThreadStorage<T> s;
  return s;
}

// f(T&) with this thread's T, or with a fresh T when it is in use.
template <class T, class F>
decltype(auto) with_thread_storage(F&& f) {
  ThreadStorage<T>& s = thread_storage<T>();
  if (s.in_use) {
    T local;
    return f(local);
  }
  s.in_use = true;
  struct Release {
    bool& flag;
    ~Release() { flag = false; }
  } release{s.in_use};
  return f(s.object);
}

}  // namespace fsdpsim::sim
