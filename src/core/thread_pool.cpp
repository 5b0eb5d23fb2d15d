#include "core/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <exception>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace klein {

namespace {
// Spins until done() or `micros` µs passed; true when done() held.
template <class Done>
bool spin_until(Done done, int micros) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::microseconds(micros);
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (done()) return true;
#if defined(__x86_64__) || defined(__i386__)
      _mm_pause();
#endif
    }
    if (std::chrono::steady_clock::now() >= end) return done();
  }
}
}  // namespace

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  n_threads_ = n_threads;
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::worker(int index) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int, int)>* job;
    if (spin_until([&] { return generation_.load(std::memory_order_acquire) != seen; }, kSpinMicros)) {
      seen = generation_.load(std::memory_order_acquire);
      std::lock_guard<std::mutex> lk(mu_);  // job_ is cleared under mu_ once every share is done
      if (stop_) return;
      job = job_;
    } else {
      std::unique_lock<std::mutex> lk(mu_);
      start_cv_.wait(lk, [&] { return stop_ || generation_.load(std::memory_order_relaxed) != seen; });
      if (stop_) return;
      seen = generation_.load(std::memory_order_relaxed);
      job = job_;
    }
    std::exception_ptr err;
    try {
      (*job)(index, n_threads_);
    } catch (...) {
      err = std::current_exception();
    }
    std::lock_guard<std::mutex> lk(mu_);
    if (err && !error_) error_ = err;
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) done_cv_.notify_one();
  }
}

void ThreadPool::run(const std::function<void(int, int)>& fn) {
  if (n_threads_ == 1) {
    fn(0, 1);
    return;
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    job_ = &fn;
    pending_.store(n_threads_ - 1, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
  }
  start_cv_.notify_all();
  // The caller's share may throw too: the workers still use `fn`, so wait for them before the
  // exception unwinds the caller's frame.
  std::exception_ptr err;
  try {
    fn(0, n_threads_);
  } catch (...) {
    err = std::current_exception();
  }
  spin_until([&] { return pending_.load(std::memory_order_acquire) == 0; }, kSpinMicros);
  std::unique_lock<std::mutex> lk(mu_);
  done_cv_.wait(lk, [&] { return pending_.load(std::memory_order_relaxed) == 0; });
  job_ = nullptr;
  if (!err) err = error_;
  error_ = nullptr;
  lk.unlock();
  if (err) std::rethrow_exception(err);
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn,
                              int64_t grain) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t max_chunks = (n + grain - 1) / grain;
  const int64_t chunks = std::min<int64_t>(n_threads_, max_chunks);
  if (chunks <= 1) {
    fn(0, n);
    return;
  }
  run([&](int t, int) {
    if (t >= chunks) return;
    const int64_t b = n * t / chunks, e = n * (t + 1) / chunks;
    if (b < e) fn(b, e);
  });
}

}  // namespace klein
