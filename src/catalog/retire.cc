#include "catalog/retire.h"

#include "base/kill_point.h"
#include "catalog/names.h"

namespace distckpt::internal_catalog {

Status retire_checkpoint(FileSystem& fs, const std::string& root, const std::string& name) {
  const std::string trash = make_trash_name(root, name);
  DISTCKPT_RETURN_IF_ERROR(fs.rename_no_replace(root + "/" + name, trash));
  DISTCKPT_RETURN_IF_ERROR(fs.sync_dir(root));
  internal_base::kill_point("retire-remove");
  return fs.remove_all(trash);
}

void sweep_trash(FileSystem& fs, const std::string& root, const std::function<bool(const std::string&)>& mine) {
  auto entries = fs.list_dir(root);
  if (!entries.ok()) return;
  for (const auto& e : *entries) {
    const auto original = trashed_name(e.name);
    if (original && mine(*original)) (void)fs.remove_all(root + "/" + e.name);
  }
}

}  // namespace distckpt::internal_catalog
