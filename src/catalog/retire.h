// Removing committed checkpoints from a root without a crash ever leaving a listed
// checkpoint half deleted (its index without all its data).
#pragma once

#include <functional>
#include <string>

#include "distckpt/filesystem.h"

namespace distckpt::internal_catalog {

// Retires the checkpoint <root>/<name>: renames it, atomically and durably, to
// "<name>.tmp-deleting-<id>" (listed as in flight, never resumed from), then removes
// that. A crash after the rename leaves trash that sweep_trash removes; before it, the
// checkpoint is untouched.
Status retire_checkpoint(FileSystem& fs, const std::string& root, const std::string& name);

// Removes what crashed retirements left in `root`: trash entries whose original name
// `mine` accepts (a manager sweeps only its own series). Best effort.
void sweep_trash(FileSystem& fs, const std::string& root, const std::function<bool(const std::string&)>& mine);

}  // namespace distckpt::internal_catalog
