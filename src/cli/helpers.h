// Helpers the subcommands share (commands.cc, layout.cc).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "distckpt/layout.h"
#include "distckpt/status.h"

namespace distckpt::internal_cli {

using json = nlohmann::ordered_json;

// JSON text that never throws: invalid UTF-8 (names from a hostile file) is replaced.
std::string dump(const json& j);
// "32,16" -> {32,16}; also accepts "[32, 16]". kInvalidArgument naming `what`.
Result<Shape> parse_list(const std::string& text, const std::string& what);
// Prints the error on stderr, escaped (messages name what files hold), and returns `code`.
int fail(const Status& st, int code = 1);

}  // namespace distckpt::internal_cli
