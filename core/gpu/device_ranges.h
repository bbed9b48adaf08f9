// Device ranges: the parts of a CUDA process's address space that the driver
// filled with the contents of GPU memory at the checkpoint step.
//
// `cuCheckpointProcessCheckpoint` copies every device allocation into host
// memory of the process and releases the GPU; CRIU then dumps that memory
// like any other. Which mappings hold it is found by reading /proc/PID/maps
// just before and just after the call (NewMappings()), and written next to
// the images as cuda-ranges-<pid>.json, so that the engine can tell GPU
// memory from the rest of the image (accounting, placement in the store).
//
// File format, version 1 (fields are only ever added; readers ignore fields
// they do not know):
//   {"version":1,"pid":P,
//    "ranges":[{"start":N,"end":N,"perms":"rw-p","offset":N,"path":""}, ...]}
// start/end are addresses ([start,end), page-aligned, start < end), perms
// the four characters of /proc/PID/maps, offset the file offset of `start`,
// path the mapped file ("" for anonymous memory).
//
// Thread-safety: free functions; safe to call concurrently (two writers of
// the same file both succeed, the last rename wins).
#ifndef GPUCKPT_CORE_GPU_DEVICE_RANGES_H_
#define GPUCKPT_CORE_GPU_DEVICE_RANGES_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "gpuckpt/status.h"

namespace gpuckpt {

// One line of /proc/PID/maps (device and inode are not kept).
struct Mapping {
  uint64_t start = 0;
  uint64_t end = 0;   // exclusive
  std::string perms;  // "rw-p", "r-xs", ...
  uint64_t offset = 0;
  std::string path;  // "" for anonymous memory; "[heap]", "/dev/nvidia-uvm", ...
  bool operator==(const Mapping&) const = default;
};

// Parses the text of a /proc/PID/maps file. A line that does not parse is a
// kIOError naming the line number.
Result<std::vector<Mapping>> ParseMappings(std::string_view maps_text);

// Reads /proc/PID/maps: kNoSuchProcess when the process is gone,
// kPermissionDenied when not allowed (ptrace read access is needed).
Result<std::vector<Mapping>> ReadMappings(int pid);

// What is in `after` and was not in `before`: every part of a mapping of
// `after` that no mapping of `before` with the same path and the same
// permissions covered. So a new mapping is reported whole; one that grew
// (e.g. a new anonymous mapping the kernel merged with its neighbour) only by
// its new part; one split by mprotect() not at all unless its permissions
// changed; and memory that changed backing at the same address (device
// memory replaced by anonymous host memory) or became accessible (a
// PROT_NONE reservation now "rw-p") is reported. Both inputs sorted by start
// and not overlapping, as /proc gives them; the result is too.
std::vector<Mapping> NewMappings(const std::vector<Mapping>& before,
                                 const std::vector<Mapping>& after);

struct DeviceRanges {
  int pid = 0;
  std::vector<Mapping> ranges;
};

// "cuda-ranges-<pid>.json": one file per process, so the processes of one
// tree do not overwrite each other.
std::string DeviceRangesFileName(int pid);

// Writes `ranges` to `path` atomically: a temporary file in the same
// directory, fsync, rename, then fsync of the directory. Mode 0644.
Status WriteDeviceRangesFile(const std::string& path, const DeviceRanges& ranges);

// Reads and validates a file written by WriteDeviceRangesFile(). The file is
// untrusted input: kNotFound when absent, kCorruption naming the file and
// the field for anything malformed (bad JSON, wrong types, unknown version,
// pid <= 0, start >= end, bad perms, ranges not sorted or overlapping).
Result<DeviceRanges> ReadDeviceRangesFile(const std::string& path);

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_GPU_DEVICE_RANGES_H_
