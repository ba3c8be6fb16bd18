#include "manager/stats.h"

#include <cstdio>

#include "catalog/names.h"

namespace distckpt::internal_manager {

void append_stats_line(const std::string& directory, const std::string& line) {
  const std::string text = line + "\n";
  // Appended with O_APPEND semantics through a plain stream: one line per save.
  if (FILE* f = std::fopen((directory + "/" + internal_catalog::kStatsFileName).c_str(), "a")) {
    std::fwrite(text.data(), 1, text.size(), f);
    std::fclose(f);
  }
}

}  // namespace distckpt::internal_manager
