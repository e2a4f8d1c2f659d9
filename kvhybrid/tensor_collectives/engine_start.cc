// The start of the store's engine operations (engine.py), without Python on MXNet's threads.
//
// MXNet's engine starts an operation pushed with MXEnginePushAsyncND by calling its function
// on one of its priority threads. A Python function there must take the GIL: when the
// operation's inputs are ready at push time, that happens while the pushing caller's thread
// is inside the push, which then waits for the GIL on its way back. Here the engine calls kvhybrid_engine_started,
// which copies the completion callback into the operation's slot, notes the time and wakes
// the communication thread sleeping on the slot's futex (kvhybrid_engine_wait_started). That
// thread completes the operation with kvhybrid_engine_complete once its collective is done.
// Needs nothing of MXNet but the layout of the completion it hands over (three pointers,
// include/mxnet/engine.h's CallbackOnComplete).
#include <atomic>
#include <cstdint>
#include <ctime>

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace {

struct Slot {                       // one operation's start (engine.py's _Slot)
  std::atomic<uint32_t> started;    // 0, then 1 once the engine started the operation
  uint32_t padding;
  void* callback;                   // the engine's CallbackOnComplete, copied out
  void* engine;
  void* param;
  double ready_at;                  // CLOCK_MONOTONIC seconds: Python's time.perf_counter
};

struct OnComplete {                 // what the engine's pointer points to (on its stack)
  void* callback;
  void* engine;
  void* param;
};

double now() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

}  // namespace

extern "C" {

// MXNet's EngineAsyncFunc: (RunContext*, CallbackOnComplete*, param), param the slot.
void kvhybrid_engine_started(void* /*rctx*/, void* on_complete, void* param) {
  Slot* slot = static_cast<Slot*>(param);
  const OnComplete* done = static_cast<const OnComplete*>(on_complete);
  slot->callback = done->callback;
  slot->engine = done->engine;
  slot->param = done->param;
  slot->ready_at = now();
  slot->started.store(1, std::memory_order_release);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&slot->started), FUTEX_WAKE_PRIVATE, INT32_MAX,
          nullptr, nullptr, 0);
}

// Sleep until the engine started the slot's operation: 1, or 0 after timeout_us (the caller
// loops, its watchdog naming the wait).
int kvhybrid_engine_wait_started(void* param, int64_t timeout_us) {
  Slot* slot = static_cast<Slot*>(param);
  if (slot->started.load(std::memory_order_acquire)) return 1;
  timespec timeout{static_cast<time_t>(timeout_us / 1000000),
                   static_cast<long>(timeout_us % 1000000) * 1000};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&slot->started), FUTEX_WAIT_PRIVATE, 0u,
          &timeout, nullptr, 0);
  return slot->started.load(std::memory_order_acquire) ? 1 : 0;
}

// Tell the engine the slot's operation is done (its writes visible to what waits for it).
void kvhybrid_engine_complete(void* param) {
  Slot* slot = static_cast<Slot*>(param);
  using Callback = void (*)(void*, void*, void*);
  reinterpret_cast<Callback>(slot->callback)(slot->engine, slot->param, nullptr);
}

}  // extern "C"
