#include "core/engine/retention.h"

#include <fmt/format.h>

#include <algorithm>

namespace gpuckpt {

std::string RetentionRule::ToString() const {
  if (empty()) return "keep all";
  std::string out = "keep";
  if (keep_last) out += " last " + std::to_string(*keep_last);
  if (keep_last && keep_within) out += ",";
  if (keep_within) out += " within " + DurationText(*keep_within);
  return out;
}

bool IsSeriesName(const std::string& id, int pid) {
  const std::string prefix = std::to_string(pid) + "-";
  if (id.size() <= prefix.size() || id.compare(0, prefix.size(), prefix) != 0) return false;
  return std::all_of(id.begin() + static_cast<std::ptrdiff_t>(prefix.size()), id.end(),
                     [](char c) { return c >= '0' && c <= '9'; });
}

std::vector<std::string> NotKept(const std::vector<SeriesMember>& series, const RetentionRule& rule,
                                 int64_t now_ns) {
  std::vector<std::string> out;
  if (rule.empty() || series.empty()) return out;
  // Newest first: rank 0 is the newest, always kept.
  std::vector<const SeriesMember*> newest_first;
  for (const SeriesMember& m : series) newest_first.push_back(&m);
  std::stable_sort(
      newest_first.begin(), newest_first.end(),
      [](const SeriesMember* a, const SeriesMember* b) { return a->created_ns > b->created_ns; });
  const uint32_t last = std::max<uint32_t>(1, rule.keep_last.value_or(1));
  for (size_t rank = 0; rank < newest_first.size(); ++rank) {
    const SeriesMember& m = *newest_first[rank];
    bool keep = rank == 0;
    if (rule.keep_last && rank < last) keep = true;
    if (rule.keep_within &&
        now_ns - m.created_ns <=
            std::chrono::duration_cast<std::chrono::nanoseconds>(*rule.keep_within).count())
      keep = true;
    if (!keep) out.push_back(m.id);
  }
  std::reverse(out.begin(), out.end());
  return out;
}

std::string DurationText(std::chrono::seconds s) {
  const int64_t n = s.count();
  if (n != 0 && n % 86400 == 0) return fmt::format("{}d", n / 86400);
  if (n != 0 && n % 3600 == 0) return fmt::format("{}h", n / 3600);
  if (n != 0 && n % 60 == 0) return fmt::format("{}m", n / 60);
  return fmt::format("{}s", n);
}

}  // namespace gpuckpt
