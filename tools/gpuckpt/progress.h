// ProgressBar: a one-line progress display on stderr for long store
// operations, drawn only when stderr is a terminal (so scripts and logs
// never see it). Not thread-safe: call Update() from one thread.
#ifndef GPUCKPT_TOOLS_GPUCKPT_PROGRESS_H_
#define GPUCKPT_TOOLS_GPUCKPT_PROGRESS_H_

#include <chrono>
#include <cstdint>
#include <string>

namespace gpuckpt {

class ProgressBar {
 public:
  explicit ProgressBar(std::string label);
  ~ProgressBar();  // clears the line

  bool enabled() const { return enabled_; }
  void Update(uint64_t done, uint64_t total);

 private:
  std::string label_;
  bool enabled_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
};

// "1.23 GB" (powers of 1000, as `ls -lh --si` and our benchmark tables).
std::string HumanBytes(uint64_t bytes);

}  // namespace gpuckpt

#endif  // GPUCKPT_TOOLS_GPUCKPT_PROGRESS_H_
