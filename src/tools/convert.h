// The conversion engine behind convert_checkpoint and publish_checkpoint.
#pragma once

#include <string>
#include <vector>

#include "catalog/commit.h"
#include "distckpt/convert.h"

namespace distckpt::internal_tools {

struct ConvertControl {
  // false: write and fsync the destination under a temporary name and return that name
  // in ConvertResult::path, uncommitted (the caller renames it; single files only).
  bool commit = true;
  // true: no creation time and no commit sequence in the bytes, so equal tensors and
  // info give byte-identical files (content-addressed publishing).
  bool reproducible = false;
  std::string meta_name;  // the name stored inside the file; "" : the destination's
  // With commit = false: the temporary entry written (ConvertResult::path is its file),
  // for the caller to install and then discard.
  internal_catalog::Entry* written = nullptr;
};

// Whether `name` is selected by `only` (empty: everything; else starting with one entry,
// or an entry "x." names "x" itself too: a key whose value is a single tensor).
bool name_selected(const std::string& name, const std::vector<std::string>& only);

// An export's modes (ConvertOptions::owner_only false): `path` (a file, or a directory
// and what it holds) takes 0666 / 0777 less the process's umask, read from
// /proc/self/status (umask(2) would change it for every thread). kIoError naming the path.
Status share_by_umask(const std::string& path);

Result<ConvertResult> convert_to(const std::string& src, const std::string& dst, Format to,
                                 const ConvertOptions& options, const ConvertControl& control);

}  // namespace distckpt::internal_tools
