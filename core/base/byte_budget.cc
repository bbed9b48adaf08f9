#include "gpuckpt/byte_budget.h"

namespace gpuckpt {

bool ByteBudget::TryAcquire(uint64_t bytes) {
  MutexLock lock(&mu_);
  if (!Fits(bytes)) return false;
  used_ += bytes;
  return true;
}

void ByteBudget::Acquire(uint64_t bytes) {
  MutexLock lock(&mu_);
  while (!Fits(bytes)) released_.Wait(mu_);
  used_ += bytes;
}

void ByteBudget::Release(uint64_t bytes) {
  {
    MutexLock lock(&mu_);
    used_ -= bytes < used_ ? bytes : used_;
  }
  released_.NotifyAll();
}

uint64_t ByteBudget::used() const {
  MutexLock lock(&mu_);
  return used_;
}

}  // namespace gpuckpt
