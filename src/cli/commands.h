// The subcommands of the `distckpt` tool. Each returns the process exit code:
// 0 success, 1 the checkpoint is bad / the operation failed, 2 bad usage.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace distckpt::internal_cli {

struct LayoutArgs {
  std::string shape, dev_mat, tensor_map, ranks;
  std::string picture;  // --picture FILE.svg: also draw which rank holds which block
};
int cmd_layout(const LayoutArgs& args);
struct KeyArgs;
int cmd_ls(const std::string& root, bool json, const KeyArgs& key);

// The key of an encrypted checkpoint: --key-file F or --key-env VAR (hex digits).
struct KeyArgs {
  std::string file, env;
};
int cmd_inspect(const std::string& path, bool json, const KeyArgs& key);
// allow_unchecked: VerifyOptions::allow_unchecked (--allow-unchecked true, --refuse-unchecked false).
int cmd_verify(const std::string& path, bool json, bool deep, std::optional<bool> allow_unchecked, const KeyArgs& key);

struct ConvertArgs {
  std::string src, dst, to;
  bool no_crc_footer = false;
  bool force = false;  // replace DST when it is a committed checkpoint
  uint64_t region_mib = 0;
  KeyArgs key;              // an encrypted source's (a plain source's with enc_mode: the copy's)
  std::string enc_mode;     // encrypt the copy; default: the source's mode, or AES-GCM
  KeyArgs enc_key;          // the copy's key; default: `key`
  bool decrypt = false;     // an encrypted source may be written in the clear
  std::vector<std::string> only, exclude;  // name prefixes (LoadOptions' specify_prefix / filter_prefix)
  std::vector<std::string> rename;         // "OLD=NEW", stored name -> name in the copy
  bool owner_only = false;                 // keep owner-only modes (else the umask's)
};
int cmd_convert(const ConvertArgs& args);

struct PublishArgs {
  std::string src, to = "safetensors", out_dir;
  std::vector<std::string> only;
  bool json = false;
  KeyArgs key;  // the source's
  bool owner_only = false;  // keep owner-only modes (else the umask's)
};
int cmd_publish(const PublishArgs& args);

struct GcArgs {
  std::string root, older_than, lease;
  bool dry_run = false, json = false;
};
int cmd_gc(const GcArgs& args);
// distckpt rm ROOT NAME...: remove_checkpoint for each NAME.
int cmd_rm(const std::string& root, const std::vector<std::string>& names);

}  // namespace distckpt::internal_cli
