// <directory>/stats.jsonl: one JSON line per committed save, appended by rank 0 through
// the FileSystem (so faults can be injected), fsynced, owner-only.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "distckpt/comm.h"
#include "distckpt/filesystem.h"
#include "distckpt/manager.h"

namespace distckpt::internal_manager {

// Appends `record` as one JSON line to the directory's statistics file. A last line that
// a crash left torn (no newline) is ended first, so that the new line stays whole.
// Invalid UTF-8 in a string (a directory named in Latin-1) is written as U+FFFD, never
// thrown: rank 0 writes these between collectives. Failures are returned for the caller
// to report: statistics never fail a save.
Status append_stats_line(FileSystem& fs, const std::string& directory, const nlohmann::ordered_json& record);

// Appends `lines` (whole JSON lines, each ending in '\n') to the statistics file, as
// append_stats_line does: a torn last line is ended first, then one synced append.
Status append_stats_text(FileSystem& fs, const std::string& directory, std::string lines);

// {"event": "metrics", "step", "epoch", "metrics": {...}, "unix_ms"} and a newline: the line
// for the metrics a step_end, end or save_now call was given (NaN and infinities as null).
std::string metrics_line(int64_t step, int64_t epoch, const std::map<std::string, double>& metrics);

// The metrics as a JSON object (NaN and infinities as null, which JSON lacks).
nlohmann::ordered_json metrics_json(const std::map<std::string, double>& metrics);

// Milliseconds since the Unix epoch: every line's "unix_ms".
int64_t unix_ms_now();

// What every resume line records besides its source: the checkpoints passed over and the
// tensors missing from the one resumed, unexpected in it and left out by the filters.
void add_resume_lists(nlohmann::ordered_json& line, const ResumeResult& resumed);

// The lines of a statistics file that parse as JSON objects; a torn or damaged line
// (a crash mid-append) is skipped, not an error.
Result<std::vector<std::string>> read_stats_lines(FileSystem& fs, const std::string& directory);

// The writers of one save: the fastest and slowest rank's write time, and per host
// (in node order) {"host", "ranks", "bytes" written, "write_s" of its slowest rank}.
struct WriterStats {
  double fastest_s = 0, slowest_s = 0;
  nlohmann::ordered_json hosts = nlohmann::ordered_json::array();
};
// `per_rank[r]` is rank r's "<write time in microseconds> <bytes written>", as gathered
// on the root; lines that do not parse count as zero.
WriterStats writer_stats(const Comm& comm, const std::vector<std::string>& per_rank);

}  // namespace distckpt::internal_manager
