// The --help layout of gpuckpt's commands: CLI11's, without what its parser
// shows of itself. Each option reads "--name TYPE=DEFAULT", never a
// validator's inner description ("INT:INT in [-100 - 22]", "ENUM:value in
// {...}") nor a flag's stored value ("--no-page-aware{false}"): the
// option's own help text says its range and choices in words.
//
// Thread-safety: the formatter is immutable once made; share it freely.
#ifndef GPUCKPT_TOOLS_COMMON_HELP_FORMAT_H_
#define GPUCKPT_TOOLS_COMMON_HELP_FORMAT_H_

#include <CLI/CLI.hpp>
#include <memory>

namespace gpuckpt {

// Set on an App before its subcommands are added, so that they inherit it.
std::shared_ptr<CLI::Formatter> PlainHelpFormatter();

}  // namespace gpuckpt

#endif  // GPUCKPT_TOOLS_COMMON_HELP_FORMAT_H_
