// `distckpt publish`: a content-addressed single file for serving.
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

int cmd_publish(const PublishArgs& args) {
  const auto to = format_from_name(args.to);
  if (!to || *to == Format::kNative)
    return fail(invalid_argument("--to '" + args.to + "': expected safetensors, ckpt or hdf5"), 2);
  PublishOptions options;
  options.format = *to;
  auto key = load_key(args.key);
  if (!key.ok()) return fail(key.status(), 2);
  options.key = *key;
  options.only = args.only;
  options.directory = args.out_dir;
  options.owner_only = args.owner_only;
  if (auto dir = resolve_checkpoint(args.src); dir.ok()) note_newer_local(args.src, *dir);
  auto result = publish_checkpoint(args.src, options);
  if (!result.ok()) return fail(result.status());
  if (args.json) {
    std::cout << dump(json{{"path", result->path},
                           {"sha256", result->sha256},
                           {"bytes", result->file_bytes},
                           {"tensors", result->tensors},
                           {"dropped", result->dropped},
                           {"already_published", result->already_published}})
              << "\n";
  } else {
    std::printf("%s %s -> %s (%zu tensors, %s; sha256 %s)\n",
                result->already_published ? "already published" : "published", args.src.c_str(),
                result->path.c_str(), result->tensors.size(), human_bytes(result->file_bytes).c_str(),
                result->sha256.c_str());
    if (!result->dropped.empty())
      std::printf("left out %zu tensors not selected by --only\n", result->dropped.size());
  }
  return 0;
}

}  // namespace distckpt::internal_cli
