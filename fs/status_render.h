// The files <pid>/status and <pid>/status.json, rendered from the engine's
// ProcessStatusReport (core/engine/process_status.h): `key: value` lines,
// and one JSON object (schema_version 1). The manual's "status and
// status.json" (docs/gpuckptfs.md) says what both show. Both are rendered
// from one report, so that they always say the same; the process's
// checkpoints (`checkpoints:`) are the tree's (<pid>/checkpoints/).
//
// Pure functions: thread-safe.
#ifndef GPUCKPT_FS_STATUS_RENDER_H_
#define GPUCKPT_FS_STATUS_RENDER_H_

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/engine/process_status.h"

namespace gpuckpt {

// The text of <pid>/status up to its `last_ended:` line (or `last: none`).
std::string RenderStatusText(const ProcessStatusReport& report);

// The object of <pid>/status.json, without its "checkpoints".
nlohmann::json RenderStatusJson(const ProcessStatusReport& report);

// The whole files: the above with the process's checkpoints, `checkpoints`
// (ids, oldest first; nullopt where they could not be read, and then not
// shown).
std::string StatusFile(const ProcessStatusReport& report,
                       const std::optional<std::vector<std::string>>& checkpoints);
std::string StatusJsonFile(const ProcessStatusReport& report,
                           const std::optional<std::vector<std::string>>& checkpoints);

}  // namespace gpuckpt

#endif  // GPUCKPT_FS_STATUS_RENDER_H_
