#include "tools/gpuckpt/progress.h"

#include <unistd.h>

#include <cstdio>

namespace gpuckpt {

std::string HumanBytes(uint64_t bytes) {
  static const char* kUnits[] = {"B", "kB", "MB", "GB", "TB", "PB"};
  double v = static_cast<double>(bytes);
  int unit = 0;
  while (v >= 1000 && unit < 5) {
    v /= 1000;
    ++unit;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), unit == 0 ? "%.0f %s" : "%.2f %s", v, kUnits[unit]);
  return buf;
}

ProgressBar::ProgressBar(std::string label)
    : label_(std::move(label)),
      enabled_(isatty(STDERR_FILENO) == 1),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

ProgressBar::~ProgressBar() {
  if (drawn_) std::fprintf(stderr, "\r\033[K");
}

void ProgressBar::Update(uint64_t done, uint64_t total) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  if (drawn_ && now - last_draw_ < std::chrono::milliseconds(100) && done < total) return;
  last_draw_ = now;
  drawn_ = true;
  const double secs = std::chrono::duration<double>(now - start_).count();
  const std::string rate = secs > 0 ? HumanBytes(static_cast<uint64_t>(done / secs)) + "/s" : "";
  constexpr int kWidth = 30;
  if (total > 0) {
    const double frac =
        done >= total ? 1.0 : static_cast<double>(done) / static_cast<double>(total);
    const int filled = static_cast<int>(frac * kWidth);
    std::string bar(static_cast<size_t>(filled), '=');
    bar.resize(kWidth, ' ');
    std::fprintf(stderr, "\r\033[K%s [%s] %3.0f%% %s / %s %s", label_.c_str(), bar.c_str(),
                 frac * 100, HumanBytes(done).c_str(), HumanBytes(total).c_str(), rate.c_str());
  } else {
    std::fprintf(stderr, "\r\033[K%s %s %s", label_.c_str(), HumanBytes(done).c_str(),
                 rate.c_str());
  }
  std::fflush(stderr);
}

}  // namespace gpuckpt
