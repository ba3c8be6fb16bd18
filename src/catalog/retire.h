// Removing committed checkpoints from a root without a crash ever leaving a listed
// checkpoint half deleted (its index without all its data).
#pragma once

#include <functional>
#include <string>

#include "distckpt/filesystem.h"

namespace distckpt::internal_catalog {

// Retires the checkpoint <root>/<name> (references.h has the steps): a directory's
// index.pb is renamed to index.retired first, atomically and durably (from then on it is
// not listed, never resumed from, never a base), then every file of it that no
// checkpoint references is removed, and the directory when none is left. A single file
// is renamed to "<name>.tmp-deleting-<id>" and removed. A crash leaves a retired
// directory that sweep_retired finishes, or trash that sweep_trash removes; before the
// first rename the checkpoint is untouched. Local, one process.
Status retire_checkpoint(FileSystem& fs, const std::string& root, const std::string& name);

// Removes what crashed retirements left in `root`: trash entries whose original name
// `mine` accepts (a manager sweeps only its own series). Best effort.
void sweep_trash(FileSystem& fs, const std::string& root, const std::function<bool(const std::string&)>& mine);

}  // namespace distckpt::internal_catalog
