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

namespace {

bool AllDigits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

std::optional<std::pair<std::string, uint64_t>> NumberedName(const std::string& id) {
  const size_t dash = id.find('-');
  if (dash == std::string::npos) return std::nullopt;
  std::string head = id.substr(0, dash);
  const std::string rest = id.substr(dash + 1);
  if (!AllDigits(head) || !AllDigits(rest) || rest.size() > 18) return std::nullopt;
  return std::make_pair(std::move(head), static_cast<uint64_t>(std::stoull(rest)));
}

bool IsSeriesName(const std::string& id, int pid) {
  const auto numbered = NumberedName(id);
  return numbered && numbered->first == std::to_string(pid);
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
