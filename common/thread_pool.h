// common/thread_pool.h — a fixed set of threads that run submitted calls in order, each
// returning a future. For fan-out of blocking calls (the operator asking every worker of a
// job at once): a thread per call costs a clone, a stack mapping and, when it goes, a TLB
// shootdown on every core, which at 2,000 pods was most of the operator's CPU.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace tidal {

class ThreadPool {
 public:
  // `finish_queued`: whether the destructor runs what is still queued (else it is dropped, its
  // futures broken; the calls already running finish either way).
  explicit ThreadPool(int threads, bool finish_queued = true) : finish_queued_(finish_queued) {
    for (int i = 0; i < std::max(1, threads); ++i) threads_.emplace_back([this] { Run(); });
  }
  // Runs what was submitted (with finish_queued), then joins.
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
      if (!finish_queued_) queue_.clear();
    }
    ready_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // The call's result (or its exception) comes back through the future. A call must not
  // wait on another call of the same pool: with every thread waiting, none would run it.
  template <typename F>
  std::future<std::invoke_result_t<F>> Submit(F&& f) {
    auto task = std::make_shared<std::packaged_task<std::invoke_result_t<F>()>>(std::forward<F>(f));
    auto future = task->get_future();
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.emplace_back([task] { (*task)(); });
    }
    ready_.notify_one();
    return future;
  }

 private:
  void Run() {
    while (true) {
      std::function<void()> call;
      {
        std::unique_lock<std::mutex> lock(mu_);
        ready_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, and nothing left
        call = std::move(queue_.front());
        queue_.pop_front();
      }
      call();
    }
  }

  std::mutex mu_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  const bool finish_queued_;
  std::vector<std::thread> threads_;
};

}  // namespace tidal
