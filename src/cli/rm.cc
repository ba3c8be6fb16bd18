// `distckpt rm`: checkpoints removed as retention removes them.
#include "cli/commands.h"
#include "cli/helpers.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "base/strings.h"
#include "base/text.h"
#include "catalog/gc.h"
#include "catalog/names.h"
#include "catalog/references.h"
#include "distckpt/convert.h"
#include "distckpt/inspect.h"
#include "distckpt/layout.h"
#include "distckpt/tier.h"
#include "format/native/file_names.h"
#include "manager/best.h"
#include "transform/crc32c.h"
#include "storage/object_fs.h"

namespace distckpt::internal_cli {

using internal_base::printable;

int cmd_rm(const std::string& root, const std::vector<std::string>& names) {
  int rc = 0;
  FileSystem& fs = *internal_storage::filesystem_for(root, nullptr);
  for (const std::string& name : names) {
    Status st = remove_checkpoint(root, name);
    // A node-local copy of the name (tier.h) would be restored from at the next resume:
    // its record goes too (after the global checkpoint, or alone for a local-only one);
    // each node's files then go at the job's next local retention, as remove_local's.
    const std::string record = internal_catalog::local_record_path(root, name);
    const bool local = (st.ok() || st.code() == StatusCode::kNotFound) &&
                       internal_catalog::validate_checkpoint_name(name).ok() && fs.exists(record);
    // A drain (or save) of the name in flight reads the nodes' files and commits the
    // global copy after this: the record stays (remove the checkpoint when it is done).
    std::string busy;
    if (local)
      if (auto entries = fs.list_dir(root); entries.ok())
        for (const auto& e : *entries)
          if (internal_base::starts_with(e.name, name + ".tmp-")) busy = e.name;
    if (!busy.empty()) {
      rc = fail(Status(StatusCode::kAborted, "rm '" + name + "': '" + busy + "' is in flight in '" + root +
                                                 "' (a drain or save of it): its node-local copy stays; remove it "
                                                 "when that is done (or collected by distckpt gc)"));
      continue;
    }
    if (local) {
      if (Status gone = fs.remove_file(record); !gone.ok()) {
        rc = fail(gone.with_context("rm '" + name + "': its node-local record"));
        continue;
      }
    }
    if (!st.ok() && !(local && st.code() == StatusCode::kNotFound)) {
      rc = fail(st);
      continue;
    }
    const bool kept = st.ok() && internal_catalog::is_retired_entry(fs, root, name);
    std::printf("removed %s%s%s\n", printable(name).c_str(),
                kept ? " (retired: the data files later checkpoints reference stay until none does)" : "",
                !local ? ""
                : st.ok() ? " and its node-local copy (its record: the nodes' files go at the next local "
                            "retention of its series on those nodes)"
                          : " (node-local only, its record: the nodes' files go at the next local retention of "
                            "its series on those nodes)");
  }
  // Retired checkpoints that only the removed ones referenced go now, not at the next gc.
  auto swept = internal_catalog::sweep_retired(*internal_storage::filesystem_for(root, nullptr), root);
  if (!swept.ok()) return fail(swept.status());
  for (const auto& gone : swept->removed) std::printf("freed %s (retired, no longer referenced)\n", printable(gone).c_str());
  for (const auto& w : swept->warnings) std::fprintf(stderr, "distckpt: %s\n", w.c_str());
  return rc != 0 ? rc : swept->warnings.empty() ? 0 : 1;
}

}  // namespace distckpt::internal_cli
