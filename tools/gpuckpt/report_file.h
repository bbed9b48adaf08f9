// The file `gpuckpt report --html FILE` writes, and the page it copies from
// a mount for an ordinary user.
//
// FILE is replaced whole or left as it was: the page is written to a new
// file beside it (in the same directory, so on the same filesystem), synced,
// and renamed over it, so that no reader, nor a crash, ever finds half a
// page. A symlink at FILE is replaced, never followed (root writing a
// report must not be led into a file of someone else's choosing). A new
// FILE is private (0600: the page shows command lines and sizes that the
// store keeps from other users); an existing one keeps its permissions.
//
// Thread-safety: free functions with no state.
#ifndef GPUCKPT_TOOLS_GPUCKPT_REPORT_FILE_H_
#define GPUCKPT_TOOLS_GPUCKPT_REPORT_FILE_H_

#include <string>
#include <string_view>

#include "gpuckpt/status.h"

namespace gpuckpt {

// Whether `path` can be written as a report, before anything is gathered:
// kInvalidArgument for an empty path, one that ends in '/' or names a
// directory or something other than a regular file or a symlink (a
// device, a FIFO); kNotFound when its directory does not exist.
Status CheckReportPath(const std::string& path);

// Writes `content` as `path` (CheckReportPath() first), atomically.
Status WriteReportFile(const std::string& path, std::string_view content);

// The report.html of the gpuckptfs mounted at `mount`, read as whoever
// runs this (the mount shows each user their own). kNotFound where the
// mount has none.
Result<std::string> ReadMountReport(const std::string& mount);

}  // namespace gpuckpt

#endif  // GPUCKPT_TOOLS_GPUCKPT_REPORT_FILE_H_
