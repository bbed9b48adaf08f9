// A one-node Ceph cluster (tools/micro-ceph, memstore) for the tests of one
// binary: started before the first test, stopped after the last. Where it
// cannot run (not root, Ceph not installed) it is not started and
// skip_reason() says why; tests then skip with that reason.
//
// Register it with ::testing::AddGlobalTestEnvironment(new
// MicroCephEnvironment({"pool", ...})). Such a binary is one ctest test,
// not one per TEST, so that the cluster starts once. Its daemons are this
// process's orphans (it becomes a subreaper) and are reaped once stopped,
// also where PID 1 reaps nothing; a guard process stops the cluster if this
// one dies without tearing down (a crash, SIGKILL).
#ifndef GPUCKPT_TESTS_UNIT_MICRO_CEPH_H_
#define GPUCKPT_TESTS_UNIT_MICRO_CEPH_H_

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace gpuckpt::testing {

// Runs tools/micro-ceph with `args`; its exit status (-1: it did not run).
int RunMicroCeph(const std::vector<std::string>& args);

class MicroCephEnvironment : public ::testing::Environment {
 public:
  explicit MicroCephEnvironment(std::vector<std::string> pools) : pools_(std::move(pools)) {}
  void SetUp() override;
  void TearDown() override;

  // The running cluster's directory and ceph.conf ("" when none runs).
  static const std::string& dir();
  static const std::string& conf();
  // Why no cluster runs, or "".
  static const std::string& skip_reason();

 private:
  std::vector<std::string> pools_;
};

}  // namespace gpuckpt::testing

// In a test: skips it, with the reason, when no cluster runs.
#define SKIP_WITHOUT_MICRO_CEPH()                                              \
  do {                                                                         \
    if (!::gpuckpt::testing::MicroCephEnvironment::skip_reason().empty())      \
      GTEST_SKIP() << ::gpuckpt::testing::MicroCephEnvironment::skip_reason(); \
  } while (0)

#endif  // GPUCKPT_TESTS_UNIT_MICRO_CEPH_H_
