// Helpers the subcommands share (helpers.cc; each command is a file of its own:
// ls.cc, inspect.cc, verify.cc, convert.cc, publish.cc, rm.cc, gc.cc, layout.cc).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "distckpt/catalog.h"
#include "distckpt/encryption.h"
#include "distckpt/layout.h"
#include "distckpt/state_dict.h"
#include "distckpt/status.h"

namespace distckpt::internal_cli {

using json = nlohmann::ordered_json;

// JSON text that never throws: invalid UTF-8 (names from a hostile file) is replaced.
std::string dump(const json& j);
// "32,16" -> {32,16}; also accepts "[32, 16]". kInvalidArgument naming `what`.
Result<Shape> parse_list(const std::string& text, const std::string& what);
// Prints the error on stderr, escaped (messages name what files hold), and returns `code`.
int fail(const Status& st, int code = 1);

struct KeyArgs;
// The key --key-file or --key-env names; null when neither was given. kInvalidArgument
// for both; the key's own errors.
Result<std::shared_ptr<const EncryptionKey>> load_key(const KeyArgs& args);
// A root whose newest checkpoint is at the local tier only: this tool reads the global
// root, so it says which checkpoint it uses instead (on stderr).
void note_newer_local(const std::string& root, const std::string& resolved);

// Presentation: an info value as JSON; "3.50 MiB"; "; references 3.50 MiB in step-5" (an
// incremental checkpoint's unchanged data, "" for none); "committed", "in-flight", ...;
// "-" for a step or epoch not recorded (-1); "1 file", "3 files".
json info_json(const InfoValue& v);
std::string human_bytes(uint64_t b);
std::string references_text(const CheckpointEntry& e);
const char* state_name(EntryState s);
std::string counter_text(int64_t value);
std::string count_text(uint64_t n, const std::string& noun);

}  // namespace distckpt::internal_cli
