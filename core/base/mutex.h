// Mutex, SharedMutex, their scoped locks and CondVar: std::mutex,
// std::shared_mutex and std::condition_variable with Clang's thread-safety
// attributes (core/base/thread_annotations.h), so that GUARDED_BY members
// and REQUIRES/EXCLUDES functions are checked wherever they are used. Every
// lock of gpuckpt is one of these; std::lock_guard and std::unique_lock do
// not tell the analysis what they hold, so they are not used on them.
//
//   MutexLock lock(&mu_);   // holds mu_ to the end of the scope, or to
//   lock.Unlock();          //   an Unlock() (and Lock() takes it again)
//   while (!ready_) ready_cv_.Wait(mu_);   // mu_ held; wakeups re-checked
#ifndef GPUCKPT_CORE_BASE_MUTEX_H_
#define GPUCKPT_CORE_BASE_MUTEX_H_

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <shared_mutex>

#include "core/base/thread_annotations.h"

namespace gpuckpt {

class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }
  bool TryLock() TRY_ACQUIRE(true) { return mu_.try_lock(); }

  // Tells the analysis that the caller holds this mutex where it cannot see
  // it taken (a callback run under it). Checks nothing at run time.
  void AssertHeld() const ASSERT_CAPABILITY(this) {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Exclusive (writer) or shared (reader) locking.
class CAPABILITY("shared mutex") SharedMutex {
 public:
  SharedMutex() = default;
  SharedMutex(const SharedMutex&) = delete;
  SharedMutex& operator=(const SharedMutex&) = delete;

  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }
  void LockShared() ACQUIRE_SHARED() { mu_.lock_shared(); }
  void UnlockShared() RELEASE_SHARED() { mu_.unlock_shared(); }

  // As Mutex::AssertHeld(), for an exclusive hold.
  void AssertHeld() const ASSERT_CAPABILITY(this) {}

 private:
  std::shared_mutex mu_;
};

// Holds a Mutex from its construction to its destruction; Unlock() and
// Lock() give it up and take it back in between.
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() RELEASE() {
    if (held_) mu_->Unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void Unlock() RELEASE() {
    mu_->Unlock();
    held_ = false;
  }
  void Lock() ACQUIRE() {
    mu_->Lock();
    held_ = true;
  }

 private:
  Mutex* const mu_;
  bool held_ = true;
};

// Holds a SharedMutex exclusively for its scope.
class SCOPED_CAPABILITY WriterMutexLock {
 public:
  explicit WriterMutexLock(SharedMutex* mu) ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~WriterMutexLock() RELEASE() { mu_->Unlock(); }
  WriterMutexLock(const WriterMutexLock&) = delete;
  WriterMutexLock& operator=(const WriterMutexLock&) = delete;

 private:
  SharedMutex* const mu_;
};

// Holds a SharedMutex shared for its scope.
class SCOPED_CAPABILITY ReaderMutexLock {
 public:
  explicit ReaderMutexLock(SharedMutex* mu) ACQUIRE_SHARED(mu) : mu_(mu) { mu_->LockShared(); }
  ~ReaderMutexLock() RELEASE() { mu_->UnlockShared(); }
  ReaderMutexLock(const ReaderMutexLock&) = delete;
  ReaderMutexLock& operator=(const ReaderMutexLock&) = delete;

 private:
  SharedMutex* const mu_;
};

// Holds a SharedMutex shared for the life of the object that owns it, across
// the functions of that object, where the analysis cannot follow a lock: a
// snapshot writer keeps garbage collection out from its start to its end.
// Movable; empty when default-made or moved from.
class SharedMutexHold {
 public:
  SharedMutexHold() = default;
  explicit SharedMutexHold(SharedMutex* mu) NO_THREAD_SAFETY_ANALYSIS : mu_(mu) {
    mu_->LockShared();
  }
  ~SharedMutexHold() NO_THREAD_SAFETY_ANALYSIS {
    if (mu_ != nullptr) mu_->UnlockShared();
  }
  SharedMutexHold(SharedMutexHold&& other) noexcept : mu_(other.mu_) { other.mu_ = nullptr; }
  SharedMutexHold& operator=(SharedMutexHold&&) = delete;
  SharedMutexHold(const SharedMutexHold&) = delete;
  SharedMutexHold& operator=(const SharedMutexHold&) = delete;

 private:
  SharedMutex* mu_ = nullptr;
};

// A condition variable for Mutex. Wait() gives the mutex up while it sleeps
// and holds it again when it returns, spuriously too: callers wait in a loop
// on their condition, which the analysis then checks like any other code
// under the lock.
class CondVar {
 public:
  CondVar() = default;
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  void Wait(Mutex& mu) REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu.mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();  // still held: the caller's lock gives it up
  }
  // As Wait(), for at most `timeout`; false when it ran out.
  bool WaitFor(Mutex& mu, std::chrono::milliseconds timeout) REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu.mu_, std::adopt_lock);
    const bool notified = cv_.wait_for(lock, timeout) == std::cv_status::no_timeout;
    lock.release();
    return notified;
  }
  void NotifyOne() { cv_.notify_one(); }
  void NotifyAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_BASE_MUTEX_H_
