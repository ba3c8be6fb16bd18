#include "catalog/retire.h"

#include "base/kill_point.h"
#include "catalog/names.h"

namespace distckpt::internal_catalog {

// retire_checkpoint: references.cc (a retired checkpoint may keep referenced files).

void sweep_trash(FileSystem& fs, const std::string& root, const std::function<bool(const std::string&)>& mine) {
  auto entries = fs.list_dir(root);
  if (!entries.ok()) return;
  for (const auto& e : *entries) {
    const auto original = trashed_name(e.name);
    if (original && mine(*original)) (void)fs.remove_all(root + "/" + e.name);
  }
}

}  // namespace distckpt::internal_catalog
