// `distckpt gc`: abandoned saves and stale files of a root removed.
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

int cmd_gc(const GcArgs& args) {
  internal_catalog::GcOptions options;
  options.dry_run = args.dry_run;
  if (!args.lease.empty()) {
    auto lease = internal_catalog::parse_duration_s(args.lease);
    if (!lease.ok()) return fail(lease.status(), 2);
    options.lease_s = *lease;
  }
  if (!args.older_than.empty()) {
    auto older = internal_catalog::parse_duration_s(args.older_than);
    if (!older.ok()) return fail(older.status(), 2);
    options.older_than_s = *older;
  }
  auto report = internal_catalog::collect_garbage(*internal_storage::filesystem_for(args.root, nullptr), args.root, options);
  if (!report.ok()) return fail(report.status());
  const char* verb = args.dry_run ? "would remove" : "removed";
  if (args.json) {
    json removed = json::array(), kept = json::array();
    for (const auto& e : report->removed) removed.push_back({{"name", e.name}, {"reason", e.reason}});
    for (const auto& e : report->kept) kept.push_back({{"name", e.name}, {"reason", e.reason}});
    std::cout << dump(json{{"root", args.root}, {"dry_run", args.dry_run}, {"removed", removed}, {"kept", kept},
                           {"warnings", report->warnings}})
              << "\n";
  } else {
    for (const auto& e : report->removed)
      std::printf("%s %s: %s\n", verb, printable(e.name).c_str(), printable(e.reason).c_str());
    for (const auto& e : report->kept) std::printf("kept %s: %s\n", printable(e.name).c_str(), printable(e.reason).c_str());
    for (const auto& w : report->warnings) std::fprintf(stderr, "distckpt: %s\n", w.c_str());
    std::printf("gc %s: %zu %s, %zu kept\n", args.root.c_str(), report->removed.size(), verb, report->kept.size());
  }
  return report->warnings.empty() ? 0 : 1;
}

}  // namespace distckpt::internal_cli
