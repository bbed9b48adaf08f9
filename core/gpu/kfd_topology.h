// AMD GPUs as the amdgpu driver's KFD (the compute side of amdgpu) lists them
// in sysfs: one directory per HSA node under
// <sysfs_root>/class/kfd/kfd/topology/nodes/<N>/, holding "gpu_id", "name",
// "properties" ("key value" lines, decimal) and mem_banks/<M>/properties.
// CPU nodes (gpu_id 0) are listed there too and are skipped here. The ROCm
// backend uses this to describe a process's GPUs (name, VRAM, uuid) for
// status and the manifest; CRIU's amdgpu_plugin does the checkpointing.
//
// Everything read is untrusted input: files are read up to 64 KiB (sysfs
// gives at most one page, and pages are 64 KiB on some arm64 and ppc64
// kernels), a value that is not a decimal number or does not fit its field
// is an error naming the file and line, unknown keys and missing optional
// keys are tolerated.
//
// Nodes that cannot be described are skipped, not errors:
//  - a node whose gpu_id, name or properties read fails with EPERM/EACCES:
//    the device cgroup hides that GPU from this process (KFD answers EPERM,
//    as libhsakmt also assumes), so it is not one of ours;
//  - a node directory without a gpu_id or properties file: KFD creates the
//    directory before its files and removes the files first on hot-unplug,
//    so a reader racing with hotplug sees exactly that.
//
// Thread-safety: free functions without shared state; safe to call
// concurrently.
#ifndef GPUCKPT_CORE_GPU_KFD_TOPOLOGY_H_
#define GPUCKPT_CORE_GPU_KFD_TOPOLOGY_H_

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "gpuckpt/status.h"

namespace gpuckpt {

struct KfdGpu {
  int node = 0;         // topology node number (the directory name)
  uint32_t gpu_id = 0;  // nodes/N/gpu_id: KFD's id of the GPU, never 0 here
  // The marketing name when there is one, else kfd_name. Use
  // KfdGpuDisplayName() for people.
  std::string name;
  // nodes/N/name as KFD gives it, trailing whitespace removed and bytes that
  // are not printable ASCII replaced by '?'. The kernel writes the lower-case
  // ASIC name ("aldebaran" on an MI250), not the gfx target; "" is allowed.
  std::string kfd_name;
  // The LLVM target ("gfx90a", "gfx942", "gfx1100") from properties
  // "gfx_target_version"; "" when the key is missing or 0.
  std::string gfx_target;
  // <sysfs_root>/class/drm/renderD<drm_render_minor>/device/product_name,
  // which amdgpu fills from the board's FRU EEPROM on server boards
  // ("AMD Instinct MI210"); "" when missing, unreadable or empty.
  std::string marketing_name;
  // Sum of size_in_bytes over mem_banks/*/properties whose heap_type is 1
  // (frame buffer, public) or 2 (frame buffer, private). 0 on an APU, whose
  // banks are system memory (heap_type 0).
  uint64_t vram_bytes = 0;
  uint32_t vendor_id = 0, device_id = 0;  // PCI ids, from properties
  // "GPU-" and 16 lower-case hex digits of properties "unique_id" (the form
  // ROCr's HSA_AMD_AGENT_INFO_UUID and ROCR_VISIBLE_DEVICES use); "" when the
  // key is missing or 0 (GPUs without a serial, e.g. gfx8).
  std::string uuid;
  uint32_t drm_render_minor = 0;  // properties "drm_render_minor" (/dev/dri/renderD<minor>)
};

// The GPU nodes of <sysfs_root>/class/kfd/kfd/topology/nodes, sorted by node
// number. sysfs_root is "/sys" in production, a fabricated tree in tests.
// Errors: kNotFound ("no KFD topology at ...") when the topology directory
// is missing (no amdgpu driver loaded); kCorruption naming the file (and the
// line) when a gpu_id or properties file is malformed, a value overflows its
// field, or a file exceeds 64 KiB; kIOError/kPermissionDenied when the nodes
// directory itself cannot be read.
Result<std::vector<KfdGpu>> ReadKfdTopology(const std::string& sysfs_root = "/sys");

// Parses one KFD "properties" file: "key value\n" lines, key made of
// [A-Za-z0-9_], value a decimal uint64. Blank lines and trailing whitespace
// are allowed. kInvalidArgument with "line N: ..." for anything else,
// including a repeated key (the kernel never writes one). Exposed for tests.
Result<std::map<std::string, uint64_t>> ParseKfdProperties(std::string_view text);

// "gfx90a (AMD 1002:740f)" without a marketing name, "AMD Instinct MI210
// (gfx90a, 1002:740f)" with one. The architecture is gfx_target, else
// kfd_name, else "AMD GPU"; "AMD" before the ids only when vendor_id is
// AMD's (0x1002).
std::string KfdGpuDisplayName(const KfdGpu& gpu);

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_GPU_KFD_TOPOLOGY_H_
