// Bytes as lower-case hex, and back: how gpuckpt writes hashes, seeds and
// byte strings in text (JSON records, object names, messages). Pure
// functions; thread-safe.
#ifndef GPUCKPT_CORE_BASE_HEX_H_
#define GPUCKPT_CORE_BASE_HEX_H_

#include <optional>
#include <string>
#include <string_view>

namespace gpuckpt {

// Two lower-case hex digits per byte.
std::string LowerHex(std::string_view bytes);

// The bytes `hex` spells; nullopt when its length is odd or it holds
// anything but lower-case hex digits (a writer of ours never makes those).
std::optional<std::string> ParseLowerHex(std::string_view hex);

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_BASE_HEX_H_
