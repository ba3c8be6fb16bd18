// `distckpt inspect`: a checkpoint's description.
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

int cmd_inspect(const std::string& path, bool as_json, const KeyArgs& key_args) {
  auto key = load_key(key_args);
  if (!key.ok()) return fail(key.status(), 2);
  auto dir = resolve_checkpoint(path, {.key = *key});
  if (!dir.ok()) return fail(dir.status());
  note_newer_local(path, *dir);
  InspectOptions options;
  options.key = *key;
  auto info = read_checkpoint_info(*dir, options);
  if (!info.ok()) return fail(info.status());
  const CheckpointInfo& ci = *info;
  json tensors = json::array();
  for (const auto& t : ci.tensors) {
    json chunks = json::array();
    for (const auto& c : t.chunks)
      chunks.push_back({{"offset", c.box.offset},
                        {"shape", c.box.shape},
                        {"file", c.file},
                        {"byte_offset", c.byte_offset},
                        {"length", c.length},
                        {"crc32c", internal_transform::crc32c_hex(c.crc32c)},
                        {"writer_rank", c.writer_rank}});
    json layout = t.dev_mat.empty() ? json{{"kind", "explicit"}, {"ranks", t.ranks}}
                                    : json{{"kind", "device_matrix"},
                                           {"dev_mat", t.dev_mat},
                                           {"tensor_map", t.tensor_map},
                                           {"ranks", t.ranks}};
    tensors.push_back({{"name", t.name},
                       {"dtype", std::string(dtype_name(t.dtype))},
                       {"global_shape", t.global_shape},
                       {"layout", layout},
                       {"chunks", chunks}});
  }
  json files = json::array();
  for (const auto& f : ci.files) {
    json j{{"name", f.name}, {"size", f.size}};
    if (!f.checkpoint.empty()) j["checkpoint"] = f.checkpoint;
    files.push_back(j);
  }
  json info_values = json::object();
  for (const auto& [k, v] : ci.info) info_values[k] = info_json(v);
  if (as_json) {
    json out{{"path", ci.path},       {"name", ci.name},        {"format", std::string(format_name(ci.format))},
             {"format_version", ci.format_version},        {"step", ci.step},
             {"epoch", ci.epoch},     {"world_size", ci.world_size},
             {"created_unix_ms", ci.created_unix_ms},      {"commit_seq", ci.commit_seq},
             {"writer_version", ci.writer_version},
             {"checksum", std::string(checksum_name(ci.checksum))}, {"encryption", ci.encryption},
             {"tensors_sealed", ci.tensors_sealed}};
    if (ci.per_rank_files) out["per_rank_files"] = true;
    out["tensors"] = tensors;
    out["files"] = files;
    out["info"] = info_values;
    std::cout << dump(out) << "\n";
    return 0;
  }
  // A .ckpt encrypted whole: without the key its step, epoch, world size and checksums
  // are inside it; with the key its sizes are the plaintext's.
  const bool whole_file = ci.encryption.find("(MindSpore framing)") != std::string::npos;
  if (whole_file && ci.tensors_sealed)
    std::printf("checkpoint %s (%s)\n  step, epoch, world size and checksums: encrypted with the rest\n",
                ci.path.c_str(), std::string(format_name(ci.format)).c_str());
  else
    std::printf("checkpoint %s (%s v%u)\n  step %lld  epoch %lld  world size %d  checksum %s\n", ci.path.c_str(),
                ci.per_rank_files ? "native manifest of a per-rank .ckpt set" : std::string(format_name(ci.format)).c_str(),
                ci.format_version, static_cast<long long>(ci.step), static_cast<long long>(ci.epoch), ci.world_size,
                std::string(checksum_name(ci.checksum)).c_str());
  if (!ci.writer_version.empty()) std::printf("  written by distckpt %s\n", printable(ci.writer_version).c_str());
  if (ci.encryption != "none") std::printf("  encryption %s\n", printable(ci.encryption).c_str());
  if (ci.tensors_sealed) std::printf("tensors: sealed (pass --key-file or --key-env to read them)\n");
  else std::printf("tensors (%zu):\n", ci.tensors.size());
  for (const auto& t : ci.tensors) {
    std::printf("  %-40s %-8s %-18s %s\n", printable(t.name).c_str(), std::string(dtype_name(t.dtype)).c_str(),
                full_box(t.global_shape).to_string().c_str(),
                t.dev_mat.empty() ? "explicit boxes"
                                  : ("dev_mat " + json(t.dev_mat).dump() + " tensor_map " + json(t.tensor_map).dump())
                                        .c_str());
    for (const auto& c : t.chunks)
      std::printf("      chunk %-22s %s @%llu +%llu crc32c %s\n", c.box.to_string().c_str(), printable(c.file).c_str(),
                  static_cast<unsigned long long>(c.byte_offset), static_cast<unsigned long long>(c.length),
                  internal_transform::crc32c_hex(c.crc32c).c_str());
  }
  std::printf("files (%zu, %s%s):\n", ci.files.size(), human_bytes(ci.data_bytes()).c_str(),
              whole_file && !ci.tensors_sealed ? " of plaintext; on disk, the encryption adds its framing" : "");
  for (const auto& f : ci.files)
    std::printf("  %-20s %llu%s\n", printable(f.name).c_str(), static_cast<unsigned long long>(f.size),
                f.checkpoint.empty() ? "" : ("  (of checkpoint " + printable(f.checkpoint) + ", referenced)").c_str());
  std::printf("info:\n");
  for (const auto& [k, v] : ci.info) std::printf("  %s = %s\n", printable(k).c_str(), printable(info_value_to_string(v)).c_str());
  return 0;
}

}  // namespace distckpt::internal_cli
