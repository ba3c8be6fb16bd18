#include "cli/commands.h"
#include "cli/helpers.h"

#include "base/strings.h"
#include "manager/best.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <cstdio>
#include <limits>
#include <map>
#include <set>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "distckpt/convert.h"
#include "distckpt/inspect.h"
#include "distckpt/tier.h"
#include "distckpt/layout.h"
#include "base/text.h"
#include "catalog/gc.h"
#include "catalog/names.h"
#include "catalog/references.h"
#include "format/native/file_names.h"
#include "transform/crc32c.h"

namespace distckpt::internal_cli {

// JSON text that never throws: invalid UTF-8 (names from a hostile file) is replaced.
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// "32,16" -> {32,16}; also accepts "[32, 16]".
Result<Shape> parse_list(const std::string& text, const std::string& what) {
  Shape out;
  std::string cleaned;
  for (char c : text)
    if (c != '[' && c != ']' && c != ' ') cleaned += c;
  if (cleaned.empty()) return out;
  if (cleaned.back() == ',') return invalid_argument(what + ": '" + text + "' ends with a comma");
  std::stringstream ss(cleaned);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) return invalid_argument(what + ": '" + text + "' has an empty entry");
    try {
      std::size_t used = 0;
      const long long v = std::stoll(item, &used);
      if (used != item.size()) throw std::invalid_argument(item);
      out.push_back(v);
    } catch (const std::exception&) {
      return invalid_argument(what + ": '" + item + "' is not an integer");
    }
  }
  return out;
}

int fail(const Status& st, int code) {
  // Messages name what files hold (tensor names, dtypes): escaped line by line, so that a
  // hostile file cannot drive the terminal.
  std::cerr << "distckpt: ";
  const std::string text = st.to_string();
  for (std::size_t begin = 0; begin <= text.size();) {
    const std::size_t end = std::min(text.find('\n', begin), text.size());
    std::cerr << (begin > 0 ? "\n" : "") << internal_base::printable(std::string_view(text).substr(begin, end - begin));
    begin = end + 1;
  }
  std::cerr << "\n";
  return code;
}

namespace {

using internal_base::printable;

json info_json(const InfoValue& v) {
  return std::visit([](const auto& x) -> json { return x; }, v);
}

std::string human_bytes(uint64_t b) {
  char buf[32];
  if (b >= (1ull << 30)) std::snprintf(buf, sizeof(buf), "%.2f GiB", b / double(1ull << 30));
  else if (b >= (1ull << 20)) std::snprintf(buf, sizeof(buf), "%.2f MiB", b / double(1ull << 20));
  else if (b >= 1024) std::snprintf(buf, sizeof(buf), "%.2f KiB", b / 1024.0);
  else std::snprintf(buf, sizeof(buf), "%llu B", static_cast<unsigned long long>(b));
  return buf;
}

// ", references 3.50 MiB in step-5, step-10": an incremental checkpoint's unchanged data.
std::string references_text(const CheckpointEntry& e) {
  if (e.references.empty()) return "";
  std::string names;
  for (const auto& r : e.references) names += (names.empty() ? "" : ", ") + printable(r);
  return "; references " + human_bytes(e.referenced_bytes) + " in " + names;
}

const char* state_name(EntryState s) {
  switch (s) {
    case EntryState::kCommitted: return "committed";
    case EntryState::kInFlight: return "in-flight";
    case EntryState::kBroken: return "broken";
    case EntryState::kForeign: return "foreign";
    case EntryState::kRetired: return "retired";
  }
  return "?";
}

}  // namespace

namespace {
// A step or epoch for a table: "-" when not recorded (-1).
std::string counter_text(int64_t value) { return value < 0 ? "-" : std::to_string(value); }
// "1 file", "3 files".
std::string count_text(uint64_t n, const std::string& noun) {
  return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
}
}  // namespace

Result<std::shared_ptr<const EncryptionKey>> load_key(const KeyArgs& args);  // below

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

// Null when neither --key-file nor --key-env was given.
Result<std::shared_ptr<const EncryptionKey>> load_key(const KeyArgs& args) {
  if (!args.file.empty() && !args.env.empty()) return invalid_argument("give --key-file or --key-env, not both");
  if (!args.file.empty()) {
    DISTCKPT_ASSIGN_OR_RETURN(EncryptionKey key, EncryptionKey::from_file(args.file));
    return std::make_shared<const EncryptionKey>(std::move(key));
  }
  if (!args.env.empty()) {
    DISTCKPT_ASSIGN_OR_RETURN(EncryptionKey key, EncryptionKey::from_env(args.env));
    return std::make_shared<const EncryptionKey>(std::move(key));
  }
  return std::shared_ptr<const EncryptionKey>();
}

// A root whose newest checkpoint is at the local tier only: this tool reads the global
// root, so it says which checkpoint it uses instead (on stderr).
void note_newer_local(const std::string& root, const std::string& resolved) {
  if (resolved == root) return;  // a checkpoint was named
  auto records = list_local_records(root);
  if (!records.ok() || records->empty()) return;
  auto listing = list_checkpoints(root);
  uint64_t seq = 0;
  if (listing.ok())
    for (const auto& e : listing->entries)
      if (e.state == EntryState::kCommitted && internal_base::trim_trailing_slashes(root) + "/" + e.name == resolved)
        seq = e.commit_seq;
  const TierRecordInfo& newest = records->front();
  if (newest.global || newest.commit_seq <= seq) return;
  std::fprintf(stderr,
               "note: the newest checkpoint, %s (step %lld), is at the local tier only (its files are on the nodes "
               "that saved it); using the newest global checkpoint, %s\n",
               printable(newest.name).c_str(), static_cast<long long>(newest.step), printable(resolved).c_str());
}

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

int cmd_convert(const ConvertArgs& args) {
  const auto to = format_from_name(args.to);
  if (!to) return fail(invalid_argument("--to '" + args.to + "': expected native, ckpt, safetensors or hdf5"), 2);
  ConvertOptions options;
  options.ckpt_crc_footer = !args.no_crc_footer;
  options.replace_existing = args.force;
  options.owner_only = args.owner_only;
  options.only = args.only;
  options.exclude = args.exclude;
  for (const auto& pair : args.rename) {
    const std::size_t eq = pair.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == pair.size())
      return fail(invalid_argument("--rename '" + pair + "': expected OLD=NEW"), 2);
    if (!options.rename.emplace(pair.substr(0, eq), pair.substr(eq + 1)).second)
      return fail(invalid_argument("--rename '" + pair.substr(0, eq) + "' is given twice"), 2);
  }
  auto key = load_key(args.key);
  if (!key.ok()) return fail(key.status(), 2);
  auto enc_key = load_key(args.enc_key);
  if (!enc_key.ok()) return fail(enc_key.status(), 2);
  // Resolved once: a root's `latest` may move while we decide.
  auto source = resolve_checkpoint(args.src, {.key = *key});
  if (!source.ok()) return fail(source.status());
  note_newer_local(args.src, *source);
  auto described = read_checkpoint_info(*source);  // no key needed to see whether it is encrypted
  if (!described.ok()) return fail(described.status());
  const std::string source_mode = described->encryption_mode == EncryptionMode::kNone
                                      ? ""
                                      : std::string(encryption_mode_name(described->encryption_mode));
  std::shared_ptr<const EncryptionKey> source_key = *key, copy_key = *enc_key;
  if (!source_mode.empty() && !source_key)  // as verify, inspect and publish say it
    return fail(Status(StatusCode::kAuthFailed, "convert: '" + *source + "' is encrypted (" + source_mode +
                                                    "): its key is needed (--key-file or --key-env)"));
  if (source_mode.empty() && source_key) {
    // A plain source needs no key: with --enc-mode, --key-file encrypts the copy.
    if (copy_key || args.enc_mode.empty())
      return fail(invalid_argument("the source is not encrypted: --key-file/--key-env open encrypted sources, "
                                   "--enc-key-file/--enc-key-env (or --enc-mode with --key-file) encrypt the copy"),
                  2);
    copy_key = source_key;
    source_key = nullptr;
  }
  options.key = source_key;
  std::string enc_mode = args.enc_mode;
  if (enc_mode.empty() && copy_key) enc_mode = source_mode.empty() ? "AES-GCM" : source_mode;
  if (enc_mode.empty() && !source_mode.empty() && !args.decrypt) {
    // An encrypted source stays encrypted unless --decrypt says otherwise: its mode, its
    // key, a new salt.
    if (*to != Format::kNative && *to != Format::kCkpt)
      return fail(invalid_argument("the source is encrypted and " + args.to +
                                   " cannot be: pass --decrypt to write it in the clear"),
                  2);
    enc_mode = source_mode;
  }
  if (!enc_mode.empty()) {
    if (args.decrypt) return fail(invalid_argument("--decrypt and --enc-mode/--enc-key-* contradict"), 2);
    const auto mode = encryption_mode_from_name(enc_mode);
    if (!mode || *mode == EncryptionMode::kNone)
      return fail(invalid_argument("--enc-mode '" + enc_mode + "': expected AES-GCM, AES-CBC or SM4-CBC"), 2);
    options.encryption.mode = *mode;
    options.encryption.key = copy_key ? copy_key : source_key;
    if (!options.encryption.key)
      return fail(invalid_argument("--enc-mode needs a key: --enc-key-file or --enc-key-env"), 2);
  }
  const bool terminal = ::isatty(STDERR_FILENO) != 0;
  auto last = std::chrono::steady_clock::now();
  if (terminal)
    options.progress = [&](uint64_t done, uint64_t total, const std::string& tensor) {
      const auto now = std::chrono::steady_clock::now();
      if (done != total && now - last < std::chrono::milliseconds(200)) return;
      last = now;
      std::fprintf(stderr, "\r\033[Kconverting %s / %s (%3.0f%%) %s", human_bytes(done).c_str(),
                   human_bytes(total).c_str(), total ? 100.0 * double(done) / double(total) : 100.0, tensor.c_str());
      std::fflush(stderr);
    };
  auto result = convert_checkpoint(*source, args.dst, *to, options);
  if (result.status().code() == StatusCode::kAlreadyExists && !args.force &&
      result.status().message().find("already exists") != std::string::npos)
    return fail(Status(StatusCode::kAlreadyExists, result.status().message() + " (--force replaces it)"));
  if (terminal) std::fprintf(stderr, "\n");
  if (!result.ok()) return fail(result.status());
  std::printf("converted %s -> %s (%s, %s of tensors)\n", args.src.c_str(), result->path.c_str(), args.to.c_str(),
              human_bytes(result->bytes).c_str());
  return 0;
}

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
