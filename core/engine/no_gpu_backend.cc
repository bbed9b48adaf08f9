// The backend for processes without a GPU: CRIU runs with no plugin.
#include "gpuckpt/gpu_backend.h"

namespace gpuckpt {
namespace {

class NoGpuBackend final : public GpuBackend {
 public:
  GpuStacks stacks() const override { return GpuStacks::kNone; }
  std::string unavailable_reason() const override { return ""; }
  Result<GpuProcessState> Describe(int) override { return GpuProcessState{}; }
  Result<CriuGpuSetup> SetupForCheckpoint(const std::vector<int>&,
                                          const GpuCheckpointOptions&) override {
    return CriuGpuSetup{};
  }
  Result<std::vector<DeviceRange>> DeviceRanges(const GpuCheckpointOptions&) override {
    return std::vector<DeviceRange>{};
  }
  Result<CriuGpuSetup> SetupForRestore(const GpuRestoreOptions& options) override {
    if (!options.gpu_map.empty())
      return Status::InvalidArgument("--gpu-map: this gpuckptfs runs without a GPU backend");
    if (options.checkpoint_stacks.value_or(GpuStacks::kNone) != GpuStacks::kNone)
      return Status::Unavailable("the checkpoint holds " +
                                 std::string(GpuStacksName(*options.checkpoint_stacks)) +
                                 " GPU state and this gpuckptfs runs without a GPU backend");
    return CriuGpuSetup{};
  }
  Status Release(const std::vector<int>&) override { return Status::Ok(); }
  std::string driver_version() const override { return ""; }
};

}  // namespace

std::unique_ptr<GpuBackend> MakeNoGpuBackend() { return std::make_unique<NoGpuBackend>(); }

}  // namespace gpuckpt
