// Text for JSON and for people, from bytes that may be anything.
//
// Command lines, paths and file names are bytes on Linux, not text: a
// process's arguments may hold Latin-1, a file name any byte but '/' and
// NUL. JSON strings must be UTF-8, so where such bytes are shown (in a
// manifest, a status file, an error) the bytes that are not valid UTF-8 are
// written as "\xNN", and the rest is kept as it is. Where the bytes
// themselves matter (a file's path in the store), they are kept exactly and
// this is only their display form.
//
// Thread-safety: free functions; reentrant.
#ifndef GPUCKPT_CORE_BASE_DISPLAY_TEXT_H_
#define GPUCKPT_CORE_BASE_DISPLAY_TEXT_H_

#include <string>
#include <string_view>

namespace gpuckpt {

// Whether `bytes` are well-formed UTF-8 (no overlong forms, no surrogates,
// nothing above U+10FFFF).
bool IsValidUtf8(std::string_view bytes);

// `bytes` with every byte that is not part of a well-formed UTF-8 sequence
// written as "\xNN" (two upper-case hex digits): valid UTF-8 whatever the
// input, and equal to the input when it was valid UTF-8 already.
std::string DisplayText(std::string_view bytes);

// Untrusted text (a field of a /proc or sysfs file, a command-line value)
// as an error message shows it: in double quotes, every byte that is not
// printable ASCII (and '"' and '\\') written as "\xNN", cut after
// `max_shown` bytes with "..." so that a garbage file cannot make a
// megabyte-long message or put terminal escapes into one.
std::string QuotedExcerpt(std::string_view bytes, size_t max_shown = 64);

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_BASE_DISPLAY_TEXT_H_
