// The store's patient wait for non-blocking MPI requests (ops.py's wait_all_patiently): test,
// spin a little, then sleep between tests, without the GIL. In Python each wake of the
// communication thread took the GIL back from the caller's thread and ran the interpreter
// to test and sleep again.
//
// It needs no MPI header, so one build serves whichever MPI mpi4py loaded: the caller hands
// the address of that library's MPI_Test and of each request's handle inside its mpi4py
// object, where MPI_Test writes the null handle once the request completes. A status buffer
// larger than any MPI's MPI_Status takes what MPI_Test writes.
#include <cstdint>
#include <ctime>

namespace {

using MpiTest = int (*)(void* request, int* flag, void* status);

int64_t now_ns() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec;
}

void sleep_ns(int64_t ns) {
  timespec t{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  nanosleep(&t, nullptr);
}

// Tests the requests from the first one not complete yet, stopping at one that is not (the
// later ones are tested once it completes). True once all are complete; false while one is
// not, or where MPI_Test failed (its code in `*error`).
bool test_from(MpiTest test, void** requests, int count, int* next, int* error) {
  alignas(16) unsigned char status[256];
  while (*next < count) {
    int flag = 0;
    *error = test(requests[*next], &flag, status);
    if (*error != 0 || !flag) return false;
    ++*next;
  }
  return true;
}

}  // namespace

extern "C" {

// Until every one of `count` requests is complete, or `budget_ns` passed: tests for
// `spin_ns`, then sleeps `first_sleep_ns`, growing by half each time up to
// `longest_sleep_ns`, testing `tests_per_wake` times at each wake (the caller sets this
// thread's timer slack: a sleep may otherwise overrun by as long as itself). Every call
// tests at least `tests_per_wake` times, however late it runs. Returns 0 (all complete), 1
// (the budget passed first: the caller, back in Python, may take a signal and call again)
// or 2 (an MPI_Test failed: its error code in `*error`).
int kvhybrid_wait_requests(void* mpi_test, void** requests, int count, int64_t spin_ns,
                           int64_t first_sleep_ns, int64_t longest_sleep_ns,
                           int tests_per_wake, int64_t budget_ns, int* error) {
  const MpiTest test = reinterpret_cast<MpiTest>(mpi_test);
  int next = 0;
  *error = 0;
  const int64_t start = now_ns();
  while (spin_ns > 0) {
    if (test_from(test, requests, count, &next, error)) return 0;
    if (*error != 0) return 2;
    if (now_ns() - start >= spin_ns) break;
  }
  int64_t delay = first_sleep_ns;
  for (;;) {
    for (int i = 0; i < tests_per_wake; ++i) {
      if (test_from(test, requests, count, &next, error)) return 0;
      if (*error != 0) return 2;
    }
    if (now_ns() - start >= budget_ns) return 1;
    sleep_ns(delay);
    delay = delay + delay / 2 < longest_sleep_ns ? delay + delay / 2 : longest_sleep_ns;
  }
}

}  // extern "C"
