// Reading the few CRIU image records gpuckpt must understand: the process
// tree (pstree.img) and the credentials of a task (core-<pid>.img), plus a
// cheap "is this a CRIU image?" test on a file's first bytes.
//
// A CRIU image file is: a u32 head magic (IMG_COMMON_MAGIC, or
// IMG_SERVICE_MAGIC for service files; absent in inventory.img), a u32 magic
// naming the image type, then records, each a u32 length (host byte order)
// followed by that many bytes of a protobuf message (criu/include/magic.h,
// criu/image.c, criu/protobuf.c, images/*.proto in CRIU 4.1).
//
// Image bytes are untrusted (a user can hand us any directory): every length
// and field is checked against the bytes present, nothing is allocated beyond
// the input's size, and anything malformed is kCorruption naming the file
// and offset. The protobuf decoding is a small hand-written subset (varints,
// length-delimited fields, skipping unknown fields).
//
// Thread-safety: free functions over caller-owned bytes; reentrant.
#ifndef GPUCKPT_CORE_CRIU_IMAGES_H_
#define GPUCKPT_CORE_CRIU_IMAGES_H_

#include <cstdint>
#include <string_view>
#include <vector>

#include "gpuckpt/status.h"

namespace gpuckpt {

// Magic numbers from criu/include/magic.h (CRIU 4.1).
inline constexpr uint32_t kCriuImgCommonMagic = 0x54564319;
inline constexpr uint32_t kCriuImgServiceMagic = 0x55105940;
inline constexpr uint32_t kCriuInventoryMagic = 0x58313116;
inline constexpr uint32_t kCriuPstreeMagic = 0x50273030;
inline constexpr uint32_t kCriuCoreMagic = 0x55053847;
inline constexpr uint32_t kCriuPagemapMagic = 0x56084025;
inline constexpr uint32_t kCriuStatsMagic = 0x57093306;

// One pstree_entry (images/pstree.proto).
struct CriuTask {
  uint32_t pid = 0, ppid = 0, pgid = 0, sid = 0;
  std::vector<uint32_t> threads;
};

// A creds_entry (images/creds.proto); lsm and apparmor fields are skipped.
struct CriuCreds {
  uint32_t uid = 0, gid = 0, euid = 0, egid = 0, suid = 0, sgid = 0, fsuid = 0, fsgid = 0;
  std::vector<uint32_t> groups, cap_inh, cap_prm, cap_eff, cap_bnd, cap_amb;
  uint32_t secbits = 0;
};

// The tasks of pstree.img, in image order (the root task first). kCorruption
// when the bytes are not a well-formed pstree image. `file_name` only names
// the file in error messages.
Result<std::vector<CriuTask>> ParsePstreeImage(std::string_view bytes,
                                               std::string_view file_name = "pstree.img");

// core_entry.thread_core.creds of a core-<pid>.img. kCorruption when the
// bytes are malformed; kNotFound when the (optional) creds are absent.
Result<CriuCreds> ParseCoreCreds(std::string_view bytes, std::string_view file_name = "core.img");

// One pagemap_entry (images/pagemap.proto): `nr_pages` pages from `vaddr`.
// Only entries with PE_PRESENT have their bytes in the pages image, one
// after the other in pagemap order; the others are in a parent image or
// lazy (never written by gpuckpt's dumps).
struct CriuPagemapEntry {
  uint64_t vaddr = 0;
  uint32_t nr_pages = 0;
  uint32_t flags = 0;
  bool present() const { return (flags & kPresent) != 0; }
  static constexpr uint32_t kParent = 1u << 0;
  static constexpr uint32_t kLazy = 1u << 1;
  static constexpr uint32_t kPresent = 1u << 2;
};
struct CriuPagemap {
  uint32_t pages_id = 0;  // the pages image is pages-<pages_id>.img
  std::vector<CriuPagemapEntry> entries;
};
// pagemap-<pid>.img. kCorruption when malformed. Entries written by CRIU
// before flags existed (in_parent only) get kParent or kPresent.
Result<CriuPagemap> ParsePagemapImage(std::string_view bytes,
                                      std::string_view file_name = "pagemap.img");

// What CRIU measured of one dump (dump_stats_entry, images/stats.proto),
// from the service file `stats-dump` that `criu dump` writes into its work
// directory (-W) once the tree is resumed or left stopped. Times are in
// microseconds.
struct CriuDumpStats {
  uint32_t freezing_us = 0;  // seizing and freezing the tree
  uint32_t frozen_us = 0;    // from frozen to resumed (or left stopped)
  uint32_t memdump_us = 0;   // draining memory out of the tasks
  uint32_t memwrite_us = 0;  // writing it into the pages images
  uint64_t pages_scanned = 0;
  uint64_t pages_written = 0;
};
// kCorruption when the bytes are not a stats image with a dump entry.
Result<CriuDumpStats> ParseDumpStatsImage(std::string_view bytes,
                                          std::string_view file_name = "stats-dump");

// Whether `first_bytes` start with a CRIU image magic: the common or service
// head magic, or the inventory magic. Raw images (pages-*.img) have none and
// give false; so does anything shorter than 4 bytes.
bool LooksLikeCriuImage(std::string_view first_bytes);

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_CRIU_IMAGES_H_
