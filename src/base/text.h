// Checks on names and strings that end up in indexes, file names and JSON.
#pragma once

#include <string>
#include <string_view>

namespace distckpt::internal_base {

// Well-formed UTF-8 (no overlong forms, no surrogates, no code points past U+10FFFF).
bool is_valid_utf8(std::string_view s);
// Valid UTF-8 without control characters (U+0000-U+001F, U+007F, U+0080-U+009F): safe
// to print.
bool is_printable_utf8(std::string_view s);
// `s` with control characters and invalid bytes escaped (\xNN, C1 controls \u00NN), for
// messages and terminal output of names read from untrusted files.
std::string printable(std::string_view s);

}  // namespace distckpt::internal_base
