#include "manager/stats.h"

#include <nlohmann/json.hpp>

#include "base/strings.h"
#include "catalog/names.h"

namespace distckpt::internal_manager {

namespace {
std::string stats_path(const std::string& directory) { return directory + "/" + internal_catalog::kStatsFileName; }
}  // namespace

Status append_stats_line(FileSystem& fs, const std::string& directory, const std::string& line) {
  const std::string path = stats_path(directory);
  std::string text = line + "\n";
  // A crash mid-append leaves a last line without its newline: end it, so that this
  // line is not glued to it (readers skip the torn one).
  if (auto size = fs.file_size(path); size.ok() && *size > 0) {
    if (auto file = fs.open_readable(path); file.ok()) {
      char last = '\n';
      if ((*file)->read_at(&last, 1, *size - 1).ok() && last != '\n') text.insert(0, "\n");
    }
  }
  return fs.append_synced(path, text);
}

Result<std::vector<std::string>> read_stats_lines(FileSystem& fs, const std::string& directory) {
  DISTCKPT_ASSIGN_OR_RETURN(std::string text, read_whole_file(fs, stats_path(directory), uint64_t{1} << 30));
  std::vector<std::string> lines;
  for (auto& line : internal_base::split(text, '\n')) {
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_discarded() && j.is_object()) lines.push_back(std::move(line));
  }
  return lines;
}

}  // namespace distckpt::internal_manager
