#include "core/base/task_pool.h"

#include <atomic>

namespace gpuckpt {

// One RunAll() call. Shared with the helpers, which may still hold it after
// the call returned (they then find no index left and never touch fn).
struct TaskPool::Batch {
  Batch(size_t n, const std::function<Status(size_t)>& fn) : n(n), fn(fn) {}

  const size_t n;
  const std::function<Status(size_t)>& fn;  // valid while indices are left
  std::atomic<size_t> next{0};              // the next index to take
  std::atomic<bool> failed{false};

  Mutex mu;
  CondVar finished;
  size_t done GUARDED_BY(mu) = 0;
  size_t failed_index GUARDED_BY(mu) = 0;
  Status error GUARDED_BY(mu);
};

TaskPool::TaskPool(unsigned helpers) {
  threads_.reserve(helpers);
  for (unsigned i = 0; i < helpers; ++i) threads_.emplace_back([this] { Help(); });
}

TaskPool::~TaskPool() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  work_ready_.NotifyAll();
  for (auto& t : threads_) t.join();
}

void TaskPool::Work(Batch& batch) {
  for (;;) {
    const size_t i = batch.next.fetch_add(1);
    if (i >= batch.n) return;
    // After a failure the rest is skipped: the caller returns the error.
    Status s = batch.failed.load() ? Status::Ok() : batch.fn(i);
    if (!s.ok()) batch.failed.store(true);
    MutexLock lock(&batch.mu);
    if (!s.ok() && (batch.error.ok() || i < batch.failed_index)) {
      batch.error = std::move(s);
      batch.failed_index = i;
    }
    if (++batch.done == batch.n) batch.finished.NotifyAll();
  }
}

Status TaskPool::RunAll(size_t n, const std::function<Status(size_t)>& fn) {
  if (threads_.empty() || n <= 1) {
    for (size_t i = 0; i < n; ++i) GPUCKPT_RETURN_IF_ERROR(fn(i));
    return Status::Ok();
  }
  auto batch = std::make_shared<Batch>(n, fn);
  {
    MutexLock lock(&mu_);
    batches_.push_back(batch);
  }
  work_ready_.NotifyAll();
  Work(*batch);
  {
    // Every index is taken: no helper needs to find this call any more.
    MutexLock lock(&mu_);
    for (auto it = batches_.begin(); it != batches_.end(); ++it) {
      if (*it == batch) {
        batches_.erase(it);
        break;
      }
    }
  }
  MutexLock lock(&batch->mu);
  while (batch->done < n) batch->finished.Wait(batch->mu);
  return batch->error;
}

void TaskPool::Help() {
  MutexLock lock(&mu_);
  for (;;) {
    while (!stopping_ && batches_.empty()) work_ready_.Wait(mu_);
    if (stopping_) return;
    std::shared_ptr<Batch> batch = batches_.front();
    if (batch->next.load() >= batch->n) {
      batches_.pop_front();  // all taken; its caller waits for the last ones
      continue;
    }
    lock.Unlock();
    Work(*batch);
    lock.Lock();
  }
}

}  // namespace gpuckpt
