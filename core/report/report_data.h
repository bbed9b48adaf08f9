// ReportData: what the report page (`gpuckpt report --html`, the mount's
// report.html) shows, as plain values: each process's checkpoints over
// time, the store's sizes and what dedup and compression saved, and who
// holds the most of it. Made by GatherReport() (report_gather.h) and drawn
// by RenderReportHtml() (report_html.h), so that what is shown and how it
// is drawn can be tested apart.
//
// The strings here come from manifests and user databases and are
// untrusted (a checkpoint's name, a process's command line may be any
// bytes): the renderer escapes every one of them.
//
// Plain values: copies, safe to use on any thread.
#ifndef GPUCKPT_CORE_REPORT_REPORT_DATA_H_
#define GPUCKPT_CORE_REPORT_REPORT_DATA_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace gpuckpt {

// One checkpoint of a process, as its record and manifest tell.
struct ReportCheckpoint {
  std::string id;
  int64_t created_ns = 0;      // CLOCK_REALTIME, ns since the epoch
  uint64_t logical_bytes = 0;  // the images' size
  uint64_t new_bytes = 0;      // raw bytes of the chunks it added to the store
  uint64_t stored_bytes = 0;   // those, compressed
  // How long the job stood still (the manifest's stages.frozen_s); nullopt
  // where not recorded (imports, older checkpoints).
  std::optional<double> frozen_s;
  // From the start of the checkpoint until it was durable (the record's
  // duration, as `status` says "durable after"); gpuckpt's own dumps only:
  // an import's duration is the time its copy took to read.
  std::optional<double> durable_s;
};

// A process's series of checkpoints: those of one pid and one owner, as
// <pid>/checkpoints/ groups them (the daemon's `<pid>-<n>` and the ones
// given a --name alike). pid 0 gathers an owner's checkpoints of no known
// process (imports of plain image directories).
struct ReportProcess {
  int pid = 0;
  uint32_t owner_uid = 0;
  std::string owner_name;                     // the user's name, or the uid in decimal
  std::string command;                        // of its latest checkpoint; "" where none is recorded
  std::vector<ReportCheckpoint> checkpoints;  // oldest first
};

// The sizes of what the report covers: the whole store (root), or one
// owner's checkpoints (an ordinary user, who learns nothing of others').
struct ReportStoreTotals {
  bool whole_store = false;
  uint64_t checkpoint_count = 0;
  // The checkpoints' sizes added up: what they would take as plain files.
  uint64_t logical_bytes = 0;
  // Whole store: raw bytes of its distinct chunks, what is left once
  // dedup has stored each chunk once. Not known for one owner.
  std::optional<uint64_t> unique_bytes;
  // Whole store: those chunks compressed. One owner: what their
  // checkpoints hold of the store (each chunk they name once, compressed:
  // what a quota charges them).
  uint64_t stored_bytes = 0;
  // Whole store: what its directory takes on disk (index, packs, garbage
  // not yet collected, the reserve).
  std::optional<uint64_t> disk_bytes;
};

// Someone or something holding bytes of the store.
struct ReportHolder {
  std::string name;  // an owner's name, or a checkpoint's id
  uint64_t bytes = 0;
};

struct ReportData {
  int64_t generated_ns = 0;  // when the data was gathered
  // Whose checkpoints these are, in words ("the checkpoints of every owner",
  // "the checkpoints of alice").
  std::string scope;
  std::vector<ReportProcess> processes;  // by owner uid, then pid
  ReportStoreTotals store;
  // Whole store: each owner's checkpoints, by what they hold of the store
  // (each chunk once), largest first. Empty for one owner's report.
  std::vector<ReportHolder> owners;
  // The checkpoints that added the most to the store when they were made
  // (their new chunks, compressed), largest first; at most
  // kReportTopCheckpoints.
  std::vector<ReportHolder> checkpoints;
};

inline constexpr size_t kReportTopCheckpoints = 10;

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_REPORT_REPORT_DATA_H_
