// <directory>/stats.jsonl: one JSON line per committed save (rank 0).
#pragma once

#include <string>

namespace distckpt::internal_manager {

// Appends `line` and a newline to the directory's statistics file. Best effort: a
// failure to write statistics never fails a save.
void append_stats_line(const std::string& directory, const std::string& line);

}  // namespace distckpt::internal_manager
