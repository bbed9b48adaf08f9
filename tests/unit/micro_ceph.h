// A one-node Ceph cluster for the tests of one binary, started by
// tools/micro-ceph in a temporary directory before the first test and
// stopped after the last (also when a test fails). Its pools "gpuckpt"
// and "gpuckpt-gc" are there from the start.
//
// Register MicroCephEnvironment with ::testing::AddGlobalTestEnvironment();
// tests then find the cluster through MicroCeph::Get(). Such a binary is
// registered with ctest as one test (not one per TEST), so that the
// cluster starts once.
#ifndef GPUCKPT_TESTS_UNIT_MICRO_CEPH_H_
#define GPUCKPT_TESTS_UNIT_MICRO_CEPH_H_

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "tests/unit/test_util.h"

namespace gpuckpt::testing {

class MicroCeph {
 public:
  // The running cluster; fails the test when there is none.
  static MicroCeph& Get();
  // Its ceph.conf, for librados and the rados command.
  const std::string& conf() const { return conf_; }
  // The directory it lives in (logs under log/).
  const std::string& dir() const { return dir_; }
  // Runs `tools/micro-ceph <verb> DIR <args>` (stop-osd, start-osd, ...).
  Status Run(const std::string& verb, const std::string& args = "") const;

 private:
  friend class MicroCephEnvironment;
  std::string dir_;
  std::string conf_;
};

class MicroCephEnvironment : public ::testing::Environment {
 public:
  void SetUp() override;
  void TearDown() override;

 private:
  std::unique_ptr<TempDir> tmp_;
};

}  // namespace gpuckpt::testing

#endif  // GPUCKPT_TESTS_UNIT_MICRO_CEPH_H_
