// GPU UUIDs as the CUDA driver and nvidia-smi write them
// ("GPU-1a2b3c4d-...") and the device maps that say which GPU a restored
// process moves to ("OLD=NEW,OLD=NEW", what `cuda-checkpoint --device-map`
// and $GPUCKPT_GPU_MAP take).
//
// Everything parsed here may come from a user or an environment variable:
// parsers reject anything but the exact forms below, with a kInvalidArgument
// message that quotes the bad part.
//
// Thread-safety: free functions on values; safe to call concurrently.
#ifndef GPUCKPT_CORE_GPU_GPU_UUID_H_
#define GPUCKPT_CORE_GPU_GPU_UUID_H_

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "gpuckpt/status.h"

namespace gpuckpt {

// The 16 bytes of a CUuuid, in the order the driver gives them.
using GpuUuid = std::array<uint8_t, 16>;

// One entry of a device map: the process was checkpointed on `old_uuid` and
// is restored onto `new_uuid`.
struct GpuUuidPair {
  GpuUuid old_uuid{};
  GpuUuid new_uuid{};
  bool operator==(const GpuUuidPair&) const = default;
};

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (8-4-4-4-12 hex digits, any
// case; the "GPU-" prefix, any case, may be left out).
Result<GpuUuid> ParseGpuUuid(std::string_view text);

// "GPU-" and lowercase hex in the 8-4-4-4-12 groups: the form nvidia-smi
// prints and ParseGpuUuid() takes.
std::string FormatGpuUuid(const GpuUuid& uuid);

// "OLD=NEW[,OLD=NEW...]"; blanks around entries and around '=' are allowed.
// Rejected, each with its own message: an empty map, an empty entry, an entry
// without exactly one '=', a bad UUID, an old GPU named twice, two old GPUs
// mapped onto the same new one. A GPU mapped onto itself is allowed.
Result<std::vector<GpuUuidPair>> ParseGpuMap(std::string_view text);

// The inverse of ParseGpuMap(): "GPU-..=GPU-..,GPU-..=GPU-..", "" when empty.
std::string FormatGpuMap(const std::vector<GpuUuidPair>& map);

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_GPU_GPU_UUID_H_
