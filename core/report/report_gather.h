// GatherReport: the data of the report page (report_data.h) from a Store:
// the checkpoints' records and manifests, the store's totals (Stats()) and
// what each owner's checkpoints hold of it (HeldBytes()).
//
// The caller decides whose checkpoints are shown (the mount shows a user
// their own, root all; `gpuckpt report` as root reads all) and hands those
// in; the gatherer only groups and measures them. What it costs: the
// records are in memory already; a whole-store report scans the chunk
// index once (Stats()) and every owner's extents once (HeldBytes(), one
// index lookup per distinct chunk, as a quota does); one owner's scans
// that owner's extents once.
//
// Thread-safety: a free function; safe to call from any number of threads
// on one Store (the Store is thread-safe).
#ifndef GPUCKPT_CORE_REPORT_REPORT_GATHER_H_
#define GPUCKPT_CORE_REPORT_REPORT_GATHER_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "core/report/report_data.h"
#include "gpuckpt/status.h"
#include "gpuckpt/store.h"

namespace gpuckpt {

// Whose report it is.
struct ReportScope {
  // nullopt: the whole store, every owner's checkpoints, with the store's
  // totals and each owner's holdings (root). Otherwise this owner's
  // checkpoints alone, and what they hold: nothing of the store as a whole
  // or of other owners is measured.
  std::optional<uint32_t> owner;
};

// The report of `checkpoints` (as Store::List() gives them, already
// narrowed to what the reader may see) of `store`, gathered at `now_ns`.
// A checkpoint's owner, pid and command are its manifest's; one whose
// manifest cannot be read counts as root's, of no process. Errors: those
// of Stats() and HeldBytes().
Result<ReportData> GatherReport(Store& store, const std::vector<SnapshotInfo>& checkpoints,
                                const ReportScope& scope, int64_t now_ns);

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_REPORT_REPORT_GATHER_H_
