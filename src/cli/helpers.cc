// Helpers the subcommands share (helpers.h).
#include "cli/helpers.h"

#include "cli/commands.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "base/strings.h"
#include "base/text.h"
#include "catalog/gc.h"
#include "catalog/names.h"
#include "catalog/references.h"
#include "distckpt/convert.h"
#include "distckpt/inspect.h"
#include "distckpt/layout.h"
#include "distckpt/tier.h"
#include "format/native/file_names.h"
#include "manager/best.h"
#include "transform/crc32c.h"

namespace distckpt::internal_cli {

// JSON text that never throws: invalid UTF-8 (names from a hostile file) is replaced.
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// "32,16" -> {32,16}; also accepts "[32, 16]".
Result<Shape> parse_list(const std::string& text, const std::string& what) {
  Shape out;
  std::string cleaned;
  for (char c : text)
    if (c != '[' && c != ']' && c != ' ') cleaned += c;
  if (cleaned.empty()) return out;
  if (cleaned.back() == ',') return invalid_argument(what + ": '" + text + "' ends with a comma");
  std::stringstream ss(cleaned);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) return invalid_argument(what + ": '" + text + "' has an empty entry");
    try {
      std::size_t used = 0;
      const long long v = std::stoll(item, &used);
      if (used != item.size()) throw std::invalid_argument(item);
      out.push_back(v);
    } catch (const std::exception&) {
      return invalid_argument(what + ": '" + item + "' is not an integer");
    }
  }
  return out;
}

int fail(const Status& st, int code) {
  // Messages name what files hold (tensor names, dtypes): escaped line by line, so that a
  // hostile file cannot drive the terminal.
  std::cerr << "distckpt: ";
  const std::string text = st.to_string();
  for (std::size_t begin = 0; begin <= text.size();) {
    const std::size_t end = std::min(text.find('\n', begin), text.size());
    std::cerr << (begin > 0 ? "\n" : "") << internal_base::printable(std::string_view(text).substr(begin, end - begin));
    begin = end + 1;
  }
  std::cerr << "\n";
  return code;
}

using internal_base::printable;

json info_json(const InfoValue& v) {
  return std::visit([](const auto& x) -> json { return x; }, v);
}

std::string human_bytes(uint64_t b) {
  char buf[32];
  if (b >= (1ull << 30)) std::snprintf(buf, sizeof(buf), "%.2f GiB", b / double(1ull << 30));
  else if (b >= (1ull << 20)) std::snprintf(buf, sizeof(buf), "%.2f MiB", b / double(1ull << 20));
  else if (b >= 1024) std::snprintf(buf, sizeof(buf), "%.2f KiB", b / 1024.0);
  else std::snprintf(buf, sizeof(buf), "%llu B", static_cast<unsigned long long>(b));
  return buf;
}

// ", references 3.50 MiB in step-5, step-10": an incremental checkpoint's unchanged data.
std::string references_text(const CheckpointEntry& e) {
  if (e.references.empty()) return "";
  std::string names;
  for (const auto& r : e.references) names += (names.empty() ? "" : ", ") + printable(r);
  return "; references " + human_bytes(e.referenced_bytes) + " in " + names;
}

const char* state_name(EntryState s) {
  switch (s) {
    case EntryState::kCommitted: return "committed";
    case EntryState::kInFlight: return "in-flight";
    case EntryState::kBroken: return "broken";
    case EntryState::kForeign: return "foreign";
    case EntryState::kRetired: return "retired";
  }
  return "?";
}

// A step or epoch for a table: "-" when not recorded (-1).
std::string counter_text(int64_t value) { return value < 0 ? "-" : std::to_string(value); }
// "1 file", "3 files".
std::string count_text(uint64_t n, const std::string& noun) {
  return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
}

// Null when neither --key-file nor --key-env was given.
Result<std::shared_ptr<const EncryptionKey>> load_key(const KeyArgs& args) {
  if (!args.file.empty() && !args.env.empty()) return invalid_argument("give --key-file or --key-env, not both");
  if (!args.file.empty()) {
    DISTCKPT_ASSIGN_OR_RETURN(EncryptionKey key, EncryptionKey::from_file(args.file));
    return std::make_shared<const EncryptionKey>(std::move(key));
  }
  if (!args.env.empty()) {
    DISTCKPT_ASSIGN_OR_RETURN(EncryptionKey key, EncryptionKey::from_env(args.env));
    return std::make_shared<const EncryptionKey>(std::move(key));
  }
  return std::shared_ptr<const EncryptionKey>();
}

// A root whose newest checkpoint is at the local tier only: this tool reads the global
// root, so it says which checkpoint it uses instead (on stderr).
void note_newer_local(const std::string& root, const std::string& resolved) {
  if (resolved == root) return;  // a checkpoint was named
  auto records = list_local_records(root);
  if (!records.ok() || records->empty()) return;
  auto listing = list_checkpoints(root);
  uint64_t seq = 0;
  if (listing.ok())
    for (const auto& e : listing->entries)
      if (e.state == EntryState::kCommitted && internal_base::trim_trailing_slashes(root) + "/" + e.name == resolved)
        seq = e.commit_seq;
  const TierRecordInfo& newest = records->front();
  if (newest.global || newest.commit_seq <= seq) return;
  std::fprintf(stderr,
               "note: the newest checkpoint, %s (step %lld), is at the local tier only (its files are on the nodes "
               "that saved it); using the newest global checkpoint, %s\n",
               printable(newest.name).c_str(), static_cast<long long>(newest.step), printable(resolved).c_str());
}

}  // namespace distckpt::internal_cli
