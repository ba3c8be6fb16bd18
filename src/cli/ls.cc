// `distckpt ls`: a root's checkpoints at every tier.
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

int cmd_ls(const std::string& root, bool as_json, const KeyArgs& key_args) {
  auto key = load_key(key_args);
  if (!key.ok()) return fail(key.status(), 2);
  // A checkpoint is no root: listing its files as entries would say it holds none.
  if (std::filesystem::exists(root + "/" + internal_format::kIndexFileName) ||
      (std::filesystem::is_regular_file(root) && internal_catalog::is_checkpoint_file_name(internal_base::base_name(root))))
    return fail(invalid_argument("ls: '" + root + "' is a checkpoint, not a root (`distckpt inspect` describes it; " +
                                 "`distckpt ls` lists the directory that holds it)"),
                2);
  auto listing = list_checkpoints(root, {.key = *key});
  if (!listing.ok()) return fail(listing.status());
  // The local tier's records (tier.h): shown only when the root has any, so that the
  // listing of a root without a local tier stays as it was.
  auto records = list_local_records(root);
  if (!records.ok()) return fail(records.status());
  std::map<std::string, const TierRecordInfo*> local;
  for (const auto& r : *records) local[r.name] = &r;
  const bool tiers = !local.empty();
  auto tiers_of = [&](const std::string& name, bool global) {
    std::vector<std::string> t;
    if (local.count(name)) t.push_back("local");
    if (global) t.push_back("global");
    return t;
  };
  std::set<std::string> global_names;
  for (const auto& e : listing->entries)
    if (e.state == EntryState::kCommitted) global_names.insert(e.name);
  // The newest checkpoint at any tier: records and global checkpoints by commit number.
  std::string newest;
  uint64_t newest_seq = 0;
  for (const auto& e : listing->entries)
    if (e.state == EntryState::kCommitted && e.advances_latest && e.commit_seq >= newest_seq)
      newest = e.name, newest_seq = e.commit_seq;
  for (const auto& r : *records)
    if (r.advances_latest && r.commit_seq >= newest_seq) newest = r.name, newest_seq = r.commit_seq;
  // Best checkpoints (the manager's save_best): "best_<metric>_<name>" holding <metric>.
  std::map<std::string, std::string> best_of;
  for (const auto& e : listing->entries)
    if (e.state == EntryState::kCommitted && e.name.rfind("best_", 0) == 0)
      if (auto info = read_checkpoint_info(root + "/" + e.name); info.ok())
        if (std::string m = internal_manager::best_metric_of(e.name, info->info); !m.empty()) best_of[e.name] = m;
  if (as_json) {
    json entries = json::array();
    for (const auto& e : listing->entries) {
      json j{{"name", e.name}, {"state", state_name(e.state)}};
      if (best_of.count(e.name)) j["best"] = best_of.at(e.name);
      if (e.state == EntryState::kCommitted) {
        j["step"] = e.step;
        j["epoch"] = e.epoch;
        j["bytes"] = e.bytes;
        if (!e.references.empty()) {
          j["referenced_bytes"] = e.referenced_bytes;
          j["references"] = e.references;
        }
        j["format"] = std::string(format_name(e.format));
        if (e.per_rank_files) j["per_rank_files"] = true;
        j["created_unix_ms"] = e.created_unix_ms;
        j["commit_seq"] = e.commit_seq;
        j["advances_latest"] = e.advances_latest;
        if (tiers) j["tiers"] = tiers_of(e.name, true);
        if (!e.detail.empty()) j["warning"] = e.detail;
      } else {
        j["detail"] = e.detail;
        if (e.state == EntryState::kRetired) j["bytes"] = e.bytes;
      }
      entries.push_back(j);
    }
    for (const auto& r : *records) {
      if (global_names.count(r.name)) continue;
      entries.push_back(json{{"name", r.name},
                             {"state", "committed"},
                             {"step", r.step},
                             {"epoch", r.epoch},
                             {"commit_seq", r.commit_seq},
                             {"format", "native"},  // local-tier saves are native
                             {"tiers", tiers_of(r.name, false)},
                             {"nodes", r.nodes},
                             {"redundancy", r.redundancy}});
    }
    json out{{"root", root}, {"latest", listing->latest}, {"entries", entries}};
    if (tiers) out["newest_any_tier"] = newest;
    std::cout << dump(out) << "\n";
    return 0;
  }
  // The name column fits the longest name (at least 32 wide), so the columns stay aligned.
  int width = 32;
  for (const auto& e : listing->entries) width = std::max(width, static_cast<int>(printable(e.name).size()));
  for (const auto& r : *records) width = std::max(width, static_cast<int>(printable(r.name).size()));
  if (tiers)
    std::printf("%-*s %10s %6s %12s %-8s %-13s %s\n", width, "NAME", "STEP", "EPOCH", "BYTES", "FORMAT", "TIER", "STATE");
  else
    std::printf("%-*s %10s %6s %12s %-8s %s\n", width, "NAME", "STEP", "EPOCH", "BYTES", "FORMAT", "STATE");
  for (const auto& e : listing->entries) {
    const std::string tier = tiers ? internal_base::join(tiers_of(e.name, true), '+') : "";
    char tier_column[32] = "";
    if (tiers) std::snprintf(tier_column, sizeof(tier_column), "%-13s ", e.state == EntryState::kCommitted ? tier.c_str() : "-");
    if (e.state == EntryState::kCommitted) {
      std::printf("%-*s %10s %6s %12s %-8s %s%s%s%s%s\n", width, printable(e.name).c_str(), counter_text(e.step).c_str(),
                  counter_text(e.epoch).c_str(), human_bytes(e.bytes).c_str(),
                  e.per_rank_files ? "ckpt-set" : std::string(format_name(e.format)).c_str(), tier_column, "committed",
                  (e.name == listing->latest      ? " (latest)"
                   : best_of.count(e.name) != 0 ? " (best " + printable(best_of.at(e.name)) + ")"
                                                : std::string())
                          .c_str(),
                  references_text(e).c_str(), e.detail.empty() ? "" : (" [" + printable(e.detail) + "]").c_str());
    } else {
      std::printf("%-*s %10s %6s %12s %-8s %s%s: %s\n", width, printable(e.name).c_str(), "-", "-",
                  e.state == EntryState::kRetired ? human_bytes(e.bytes).c_str() : "-", "-", tier_column,
                  state_name(e.state), printable(e.detail).c_str());
    }
  }
  for (const auto& r : *records) {
    if (global_names.count(r.name)) continue;
    std::printf("%-*s %10s %6s %12s %-8s %-13s committed (%d nodes, %s)\n", width, printable(r.name).c_str(),
                counter_text(r.step).c_str(), counter_text(r.epoch).c_str(), "-", "native", "local", r.nodes,
                printable(r.redundancy).c_str());
  }
  std::printf("latest: %s\n", listing->latest.empty() ? "(none)" : printable(listing->latest).c_str());
  if (tiers) std::printf("newest at any tier: %s\n", newest.empty() ? "(none)" : printable(newest).c_str());
  return 0;
}

}  // namespace distckpt::internal_cli
