#include "tests/unit/micro_ceph.h"

#include <sys/wait.h>

#include <cstdlib>

namespace gpuckpt::testing {

namespace {

MicroCeph* running = nullptr;

std::string Script() { return std::string(GPUCKPT_SOURCE_DIR) + "/tools/micro-ceph"; }

}  // namespace

MicroCeph& MicroCeph::Get() {
  if (running == nullptr) {
    ADD_FAILURE() << "no micro-ceph cluster is running (see the environment's failure above)";
    static MicroCeph none;
    return none;
  }
  return *running;
}

Status MicroCeph::Run(const std::string& verb, const std::string& args) const {
  const std::string command = Script() + " " + verb + " '" + dir_ + "' " + args + " > '" + dir_ +
                              "/" + verb + ".out' 2>&1";
  const int rc = std::system(command.c_str());
  if (rc == 0) return Status::Ok();
  std::string out;
  if (FILE* f = std::fopen((dir_ + "/" + verb + ".out").c_str(), "r")) {
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
    std::fclose(f);
  }
  return Status::IOError("tools/micro-ceph " + verb + " failed (" + std::to_string(rc) +
                         "): " + out);
}

void MicroCephEnvironment::SetUp() {
  tmp_ = std::make_unique<TempDir>("gpuckpt-ceph");
  auto* cluster = new MicroCeph();
  cluster->dir_ = tmp_->path();
  cluster->conf_ = tmp_->path() + "/ceph.conf";
  Status started = cluster->Run("start", "--pool gpuckpt --pool gpuckpt-gc");
  if (!started.ok()) {
    cluster->Run("stop").PermitUnchecked();
    delete cluster;
    FAIL() << started.ToString();
  }
  running = cluster;
}

void MicroCephEnvironment::TearDown() {
  if (running != nullptr) {
    Status stopped = running->Run("stop");
    EXPECT_TRUE(stopped.ok()) << stopped.ToString();
    delete running;
    running = nullptr;
  }
  tmp_.reset();
}

}  // namespace gpuckpt::testing
