#include "catalog/names.h"

#include <chrono>
#include <cstdio>
#include <random>
#include <regex>

#include "base/text.h"
#include "format/format.h"
#include "format/native/index_codec.h"

namespace distckpt::internal_catalog {

namespace {

std::string random_hex() {
  std::random_device rd;
  const uint64_t id = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^
                      static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(id));
  return hex;
}

}  // namespace

std::string local_records_dir(const std::string& root) { return root + "/" + kMetaDir + "/tier"; }
std::string local_record_path(const std::string& root, const std::string& name) {
  return local_records_dir(root) + "/" + name;
}

Status validate_checkpoint_name(const std::string& name) {
  if (!internal_format::valid_file_name(name) || name == kLatestFileName || name.rfind(kMetaDir, 0) == 0 ||
      name.find(kTmpMarker) != std::string::npos || !internal_base::is_printable_utf8(name))
    return invalid_argument("checkpoint name '" + internal_base::printable(name) +
                            "' is not allowed (must be printable UTF-8, non-empty, <= 255 bytes, without "
                            "'/', not 'latest', '.', '..', not starting with '.distckpt', and without '.tmp-')");
  return Status();
}

std::string make_tmp_name(const std::string& root, const std::string& name) {
  return root + "/" + name + kTmpMarker + random_hex();
}

std::string make_save_dir() { return "s-" + random_hex(); }

std::string make_trash_name(const std::string& root, const std::string& name) {
  return root + "/" + name + kTrashMarker + random_hex();
}

std::optional<std::string> trashed_name(const std::string& entry) {
  // Checkpoint names cannot contain ".tmp-" and saves use ".tmp-<16 hex>", so only
  // retirement makes these.
  static const std::regex trash_re(R"((.+)\.tmp-deleting-[0-9a-f]{16}(\.owner-[0-9a-f]{8}-[0-9]+-[0-9]+)?)");
  std::smatch m;
  if (!std::regex_match(entry, m, trash_re)) return std::nullopt;
  return m[1].str();
}

bool is_in_flight_name(const std::string& entry) { return entry.find(kTmpMarker) != std::string::npos; }

bool is_checkpoint_file_name(const std::string& entry) {
  return entry != kLatestFileName && internal_format::driver_for_file_name(entry) != nullptr;
}

}  // namespace distckpt::internal_catalog
