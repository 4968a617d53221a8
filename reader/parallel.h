// reader/parallel.h — split [0, n) into contiguous blocks over
// threads (reader-private).
//
// Block t covers [n*t/T, n*(t+1)/T): each thread writes its own part of an
// output, so results do not depend on the thread count. The calling thread
// runs block 0. Threads are started per call: the callers' batches take
// milliseconds, thread start-up microseconds.
#pragma once

#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

namespace patchstore {

template <typename Fn>  // Fn(int64_t begin, int64_t end)
void ParallelBlocks(int64_t n, int num_threads, Fn&& fn) {
  const int threads = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(num_threads, n)));
  if (threads <= 1) {
    fn(int64_t{0}, n);
    return;
  }
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(threads - 1));
  for (int t = 1; t < threads; ++t)
    pool.emplace_back([&fn, n, t, threads] { fn(n * t / threads, n * (t + 1) / threads); });
  fn(0, n / threads);
  for (auto& th : pool) th.join();
}

}  // namespace patchstore
