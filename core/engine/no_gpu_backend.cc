// The backend for processes without a GPU: CRIU runs with no plugin.
#include "gpuckpt/gpu_backend.h"

namespace gpuckpt {
namespace {

class NoGpuBackend final : public GpuBackend {
 public:
  std::string name() const override { return "none"; }
  std::string unavailable_reason() const override { return ""; }
  Result<GpuProcessState> Describe(int) override { return GpuProcessState{}; }
  Result<CriuGpuSetup> SetupFor(const std::vector<int>&) override { return CriuGpuSetup{}; }
  std::string driver_version() const override { return ""; }
};

}  // namespace

std::unique_ptr<GpuBackend> MakeNoGpuBackend() { return std::make_unique<NoGpuBackend>(); }

}  // namespace gpuckpt
