// kvhybrid's sleeping barrier for the ranks of a group that share a host (host_barrier.py).
//
// MPI's waits spin, and the store's patient waits poll a request between short sleeps: on a
// machine with fewer cores than busy threads either takes CPU from the rank being waited
// for. Here a waiting rank sleeps in the kernel (a futex on a word in shared memory) until
// the last rank arrives and wakes it, so a collective posted after this barrier finds every
// rank there and finishes without a wait. Four 32-bit words in memory every rank maps:
// words[0] counts the ranks arrived, words[1] is the generation, bumped by the last one;
// words[2] counts the one-to-many collectives whose root has posted its part (the others
// sleep until it has, and the root does not wait for them); words[3] is padding. After them,
// two rows of one 64-bit number per rank, one row per parity of the generation: what each
// rank brought to the meeting (a digest of the call it makes, 0 for none), so the ranks
// compare their calls in the barrier itself. A rank cannot write a row again before every
// rank has read it: it would have to pass the next generation's barrier, which needs the
// readers to arrive there.
#include <atomic>
#include <climits>
#include <cstdint>
#include <ctime>

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace {

std::atomic<uint32_t>* word(uint32_t* words, int i) {
  static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t), "a futex is 32 bits");
  return reinterpret_cast<std::atomic<uint32_t>*>(words + i);
}

timespec now() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t;
}

int64_t micros_since(const timespec& start) {
  const timespec t = now();
  return (t.tv_sec - start.tv_sec) * 1000000 + (t.tv_nsec - start.tv_nsec) / 1000;
}

// The futex wait for `timeout_us` more microseconds, while `*address` still equals `seen`
// (returns at once if it moved already; EINTR or a spurious wake: the caller loops).
void sleep_on(uint32_t* address, uint32_t seen, int64_t timeout_us) {
  timespec wait{static_cast<time_t>(timeout_us / 1000000),
                static_cast<long>(timeout_us % 1000000) * 1000};
  syscall(SYS_futex, address, FUTEX_WAIT, seen, &wait, nullptr, 0);
}

}  // namespace

extern "C" {

// Count rank `rank` in with `digest` (see the top); returns the generation it arrived in
// (kvhybrid_host_barrier_sleep waits for the next; its parity names the row of digests to
// read then). The last of `parties` ranks resets the count, bumps the generation and wakes
// the others.
uint32_t kvhybrid_host_barrier_arrive(uint32_t* words, uint32_t parties, uint32_t rank,
                                      int64_t digest) {
  std::atomic<uint32_t>* arrived = word(words, 0);
  std::atomic<uint32_t>* generation = word(words, 1);
  // no rank can bump the generation before this one arrives: it is the one waited for
  const uint32_t seen = generation->load(std::memory_order_acquire);
  int64_t* digests = reinterpret_cast<int64_t*>(words + 4);
  digests[(seen & 1) * parties + rank] = digest;   // published by the fetch_add's release
  if (arrived->fetch_add(1, std::memory_order_acq_rel) + 1 == parties) {
    arrived->store(0, std::memory_order_relaxed);
    generation->fetch_add(1, std::memory_order_acq_rel);
    syscall(SYS_futex, words + 1, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
  }
  return seen;
}

// The root of a one-to-many collective has posted its part: count it and wake the others.
void kvhybrid_host_barrier_announce(uint32_t* words) {
  word(words, 2)->fetch_add(1, std::memory_order_acq_rel);
  syscall(SYS_futex, words + 2, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// Sleep until words[index] reaches `count` (the generation one past the one seen at
// arrival; the announcements a rank has counted): 0 when it has, 1 after `timeout_us`
// microseconds without (the caller sleeps again, its watchdog timing the whole wait). Spins
// `spin_us` first: a rank arriving within that costs no sleep and no wake. Counts wrap:
// compared as a signed difference.
int kvhybrid_host_barrier_sleep(uint32_t* words, int index, uint32_t count, int64_t spin_us,
                                int64_t timeout_us) {
  std::atomic<uint32_t>* counter = word(words, index);
  const auto reached = [count](uint32_t value) { return static_cast<int32_t>(value - count) >= 0; };
  const timespec start = now();
  while (micros_since(start) < spin_us) {
    if (reached(counter->load(std::memory_order_acquire))) return 0;
  }
  for (uint32_t current = counter->load(std::memory_order_acquire); !reached(current);
       current = counter->load(std::memory_order_acquire)) {
    const int64_t left = timeout_us - micros_since(start);
    if (left <= 0) return 1;
    sleep_on(words + index, current, left);
  }
  return 0;
}

}  // extern "C"
