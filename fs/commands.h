// Commands written to gpuckptfs's control files: parsing (split into words
// as a shell would, quotes and backslashes included, then options by CLI11,
// so that quoting and errors behave like a command line) and dispatch to
// the Engine.
//
//   <pid>/ctl   checkpoint [--kill] [--name NAME] [--lock-timeout MS] [--no-space-check]
//                          [--every DURATION|off] [--keep-last N] [--keep-within DURATION]
//                          [--owner-keep-last N] [--owner-keep-within DURATION]
//   ctl         track PID | import PATH [NAME] | gc
//   restore     PATH [--gpu-map OLD_UUID=NEW_UUID,...] [--root DIR] [--join-cgroup]
//               [--lazy | --eager]
//
// Every input is untrusted: anything unknown (an unterminated quote, an
// unknown option) is kInvalidArgument with a line saying what was
// expected, recorded where the caller reads results (<pid>/status,
// restore). So is --help, which records the synopsis: a write to a control
// file has no other way to answer.
//
// Stateless; thread-safe as far as the Engine is.
#ifndef GPUCKPT_FS_COMMANDS_H_
#define GPUCKPT_FS_COMMANDS_H_

#include <string>

#include "core/engine/engine.h"
#include "fs/node_id.h"

namespace gpuckpt {

Status RunCommand(Engine& engine, NodeKind file, int pid, const std::string& line,
                  const Caller& caller);

// Records a command written to `file` that was refused before it ran (its
// caller runs too many already, or no thread could be started) as a
// failed command is: in the log, and where the caller reads results,
// <pid>/status's `last:` line (and metrics) or `cat restore`.
void RecordRefusedCommand(Engine& engine, NodeKind file, int pid, const Status& refusal,
                          const Caller& caller);

}  // namespace gpuckpt

#endif  // GPUCKPT_FS_COMMANDS_H_
