// `distckpt convert`: a checkpoint in another format.
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

}  // namespace distckpt::internal_cli
