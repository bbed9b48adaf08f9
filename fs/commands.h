// Commands written to gpuckptfs's control files: parsing (CLI11, so that
// quoting and errors behave like a command line) and dispatch to the Engine.
//
//   <pid>/ctl   checkpoint [--kill] [--name NAME] [--lock-timeout MS]
//   ctl         track PID | import DIR [NAME] | gc
//   restore     PATH [--gpu-map OLD_UUID=NEW_UUID,...]
//
// Every input is untrusted: anything unknown is kInvalidArgument with a line
// saying what was expected, recorded where the caller reads results
// (<pid>/status, restore).
//
// Stateless; thread-safe as far as the Engine is.
#ifndef GPUCKPT_FS_COMMANDS_H_
#define GPUCKPT_FS_COMMANDS_H_

#include <string>

#include "core/engine/engine.h"
#include "fs/store_view.h"

namespace gpuckpt {

Status RunCommand(Engine& engine, NodeKind file, int pid, const std::string& line,
                  const Caller& caller);

}  // namespace gpuckpt

#endif  // GPUCKPT_FS_COMMANDS_H_
