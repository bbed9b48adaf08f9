// Retention rules (core/engine/retention.h): which of a process's series
// are kept, what counts as its series, and how rules and durations read.
#include "core/engine/retention.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace gpuckpt {
namespace {

constexpr int64_t kSecond = 1000000000;

// Checkpoints 4242-1 .. 4242-n, one a minute, the newest at `now`.
std::vector<SeriesMember> Minutely(int n, int64_t now) {
  std::vector<SeriesMember> out;
  for (int i = 1; i <= n; ++i)
    out.push_back({"4242-" + std::to_string(i), now - (n - i) * 60 * kSecond});
  return out;
}

TEST(RetentionTest, KeepLastKeepsTheNewestN) {
  const int64_t now = 1000000 * kSecond;
  EXPECT_EQ(NotKept(Minutely(5, now), RetentionRule{3, std::nullopt}, now),
            (std::vector<std::string>{"4242-1", "4242-2"}));
  EXPECT_TRUE(NotKept(Minutely(3, now), RetentionRule{3, std::nullopt}, now).empty());
}

TEST(RetentionTest, KeepWithinKeepsWhatIsRecentAndAlwaysTheNewest) {
  const int64_t now = 1000000 * kSecond;
  // Made 4, 3, 2, 1 and 0 minutes ago: within 2 minutes are the last three.
  EXPECT_EQ(NotKept(Minutely(5, now), RetentionRule{std::nullopt, std::chrono::seconds(120)}, now),
            (std::vector<std::string>{"4242-1", "4242-2"}));
  // Nothing is recent: the newest stays all the same.
  EXPECT_EQ(NotKept(Minutely(3, now), RetentionRule{std::nullopt, std::chrono::seconds(1)},
                    now + 3600 * kSecond),
            (std::vector<std::string>{"4242-1", "4242-2"}));
}

TEST(RetentionTest, BothRulesKeepWhatEitherKeeps) {
  const int64_t now = 1000000 * kSecond;
  // Last 1 keeps 4242-6; within 150 s keeps 4242-4..6.
  EXPECT_EQ(NotKept(Minutely(6, now), RetentionRule{1, std::chrono::seconds(150)}, now),
            (std::vector<std::string>{"4242-1", "4242-2", "4242-3"}));
  // Last 4 keeps more than within 30 s.
  EXPECT_EQ(NotKept(Minutely(6, now), RetentionRule{4, std::chrono::seconds(30)}, now),
            (std::vector<std::string>{"4242-1", "4242-2"}));
}

TEST(RetentionTest, AnEmptyRuleKeepsEverything) {
  const int64_t now = 1000000 * kSecond;
  EXPECT_TRUE(NotKept(Minutely(10, now), RetentionRule{}, now).empty());
  EXPECT_TRUE(NotKept({}, RetentionRule{1, std::nullopt}, now).empty());
}

TEST(RetentionTest, OrderIsByTimeNotByName) {
  // 4242-10 is newer than 4242-9, whatever a sort by name says.
  const int64_t now = 1000000 * kSecond;
  std::vector<SeriesMember> series = {{"4242-10", now}, {"4242-9", now - kSecond}};
  EXPECT_EQ(NotKept(series, RetentionRule{1, std::nullopt}, now),
            (std::vector<std::string>{"4242-9"}));
}

TEST(RetentionTest, TheSeriesIsTheNamesTheEngineGaveThatProcess) {
  EXPECT_TRUE(IsSeriesName("4242-1", 4242));
  EXPECT_TRUE(IsSeriesName("4242-123", 4242));
  EXPECT_FALSE(IsSeriesName("4242-", 4242));
  EXPECT_FALSE(IsSeriesName("4242-1a", 4242));
  EXPECT_FALSE(IsSeriesName("42421-1", 4242));
  EXPECT_FALSE(IsSeriesName("1000.before-upgrade", 4242));
  EXPECT_FALSE(IsSeriesName("before-upgrade", 4242));
}

TEST(RetentionTest, RulesAndDurationsReadAsWritten) {
  EXPECT_EQ(RetentionRule{}.ToString(), "keep all");
  EXPECT_EQ((RetentionRule{3, std::nullopt}.ToString()), "keep last 3");
  EXPECT_EQ((RetentionRule{std::nullopt, std::chrono::seconds(86400)}.ToString()),
            "keep within 1d");
  EXPECT_EQ((RetentionRule{2, std::chrono::seconds(5400)}.ToString()), "keep last 2, within 90m");
  EXPECT_EQ(DurationText(std::chrono::seconds(30)), "30s");
  EXPECT_EQ(DurationText(std::chrono::seconds(7200)), "2h");
  EXPECT_EQ(DurationText(std::chrono::seconds(61)), "61s");
}

}  // namespace
}  // namespace gpuckpt
