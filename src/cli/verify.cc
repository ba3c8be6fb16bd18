// `distckpt verify`: a checkpoint's (or a root's) integrity.
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

namespace distckpt::internal_cli {

using internal_base::printable;

int cmd_verify(const std::string& path, bool as_json, bool deep, std::optional<bool> allow_unchecked,
               const KeyArgs& key_args) {
  auto key = load_key(key_args);
  if (!key.ok()) return fail(key.status(), 2);
  auto dir = resolve_checkpoint(path, {.key = *key});
  if (!dir.ok()) {  // the same shape as any failed verify, for scripts reading stdout
    if (as_json) std::cout << dump(json{{"path", path}, {"ok", false}, {"error", dir.status().to_string()}}) << "\n";
    return fail(dir.status());
  }
  note_newer_local(path, *dir);
  VerifyOptions options;
  options.deep = deep;
  options.key = *key;
  options.allow_unchecked = allow_unchecked;
  auto report = verify_checkpoint(*dir, options);
  if (!report.ok()) {
    if (as_json) std::cout << dump(json{{"path", *dir}, {"ok", false}, {"error", report.status().to_string()}}) << "\n";
    return fail(report.status());
  }
  if (as_json) {
    json j{{"path", *dir},       {"ok", true},           {"tensors", report->tensors},
           {"chunks", report->chunks}, {"files", report->files}, {"bytes", report->bytes_checked},
           {"deep", report->deep}, {"checksums", report->checksums},
           {"authenticated", report->authenticated}, {"checked", report->checked}};
    if (!report->warning.empty()) j["warning"] = report->warning;
    std::cout << dump(j) << "\n";
  } else {
    std::printf("OK %s: %s, %s, %s, %s checked (%s%s)\n", dir->c_str(), count_text(report->tensors, "tensor").c_str(),
                count_text(report->chunks, "chunk").c_str(), count_text(report->files, "file").c_str(),
                human_bytes(report->bytes_checked).c_str(), report->checked.c_str(),
                report->deep ? ", re-read from storage" : "");
    if (!report->warning.empty()) std::printf("warning: %s\n", report->warning.c_str());
  }
  return 0;
}

}  // namespace distckpt::internal_cli
