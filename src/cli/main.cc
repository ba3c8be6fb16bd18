// distckpt: inspect, verify, convert, publish and plan checkpoints from the command line.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <new>

#include "cli/commands.h"
#include "distckpt/status.h"

int main(int argc, char** argv) {
  using namespace distckpt::internal_cli;
  CLI::App app{"distckpt: inspect, verify and plan distributed checkpoints"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("distckpt ") + distckpt::version());

  LayoutArgs layout;
  auto* lay = app.add_subcommand("layout", "Print every rank's slice of a tensor layout as JSON");
  lay->add_option("--shape", layout.shape, "global shape, e.g. 32,16")->required();
  lay->add_option("--dev-mat", layout.dev_mat, "device matrix, e.g. 2,4")->required();
  lay->add_option("--tensor-map", layout.tensor_map, "tensor map, e.g. 1,-1")->required();
  lay->add_option("--ranks", layout.ranks, "global ranks of the group, e.g. 8,9,10,11 (default 0..N-1)");
  lay->add_option("--picture", layout.picture, "also draw which rank holds which block, as an SVG file");

  std::string path;
  bool json = false;
  auto* ls = app.add_subcommand("ls", "List committed, in-flight and broken checkpoints under ROOT");
  ls->add_option("ROOT", path, "checkpoint root directory")->required();
  ls->add_flag("--json", json, "machine-readable output");
  auto* inspect = app.add_subcommand("inspect", "Show tensors, chunks, files and info values of a checkpoint");
  inspect->add_option("CKPT", path, "checkpoint directory (or a root: its newest checkpoint)")->required();
  inspect->add_flag("--json", json, "machine-readable output");
  KeyArgs key;
  auto add_key = [](CLI::App* cmd, KeyArgs& k, const std::string& prefix, const std::string& whose) {
    cmd->add_option("--" + prefix + "key-file", k.file,
                    whose + " key file: 16/24/32 raw bytes or 32/48/64 hex digits");
    cmd->add_option("--" + prefix + "key-env", k.env, whose + " key in this environment variable (hex digits)");
  };
  add_key(inspect, key, "", "an encrypted checkpoint's");
  add_key(ls, key, "", "encrypted .ckpt files' (their step, epoch and order are inside them)");
  auto* verify = app.add_subcommand("verify", "Read every byte; check file sizes and checksums");
  verify->add_option("CKPT", path, "checkpoint directory (or a root: its newest checkpoint)")->required();
  verify->add_flag("--json", json, "machine-readable output");
  bool deep = false, allow_unchecked = false, refuse_unchecked = false;
  verify->add_flag("--deep", deep, "drop each file from the page cache first: every byte is re-read from storage");
  verify->add_flag("--allow-unchecked", allow_unchecked,
                   "pass data that records no checksums (a safetensors file from another writer), with a warning; "
                   "a .ckpt or HDF5 file without them passes with the warning anyway");
  verify->add_flag("--refuse-unchecked", refuse_unchecked,
                   "fail on data that records no checksums, a .ckpt or HDF5 file included (MindSpore's crc_check=True)")
      ->excludes("--allow-unchecked");
  add_key(verify, key, "", "an encrypted checkpoint's (every chunk is then authenticated)");

  ConvertArgs conv;
  auto* convert = app.add_subcommand("convert", "Write a checkpoint in another format, streaming with bounded memory");
  convert->add_option("SRC", conv.src, "checkpoint (directory or single file; a root: its newest)")->required();
  convert->add_option("DST", conv.dst, "new checkpoint path (the format's extension is added if missing)")->required();
  convert->add_option("--to", conv.to, "native, ckpt, safetensors or hdf5")->required();
  convert->add_flag("--no-crc-footer", conv.no_crc_footer, "ckpt: omit MindSpore's CRC-32 footer (MindSpore < 2.1)");
  convert->add_flag("--force", conv.force, "replace DST if it is a committed checkpoint (retired first, as rm does)");
  convert->add_flag("--owner-only", conv.owner_only,
                    "keep the copy owner-only (files 0600, directories 0700); default: the umask's modes");
  convert->add_option("--region-mib", conv.region_mib, "MiB of a tensor held at a time (default 64)");
  add_key(convert, conv.key, "", "the encrypted source's");
  convert->add_option("--enc-mode", conv.enc_mode,
                      "encrypt the destination (native, ckpt): AES-GCM, AES-CBC or SM4-CBC (default with a key: "
                      "AES-GCM; an encrypted source: its mode)");
  add_key(convert, conv.enc_key, "enc-", "the destination's (default: the source's)");
  convert->add_flag("--decrypt", conv.decrypt, "write an encrypted source in the clear");
  convert->add_option("--only", conv.only, "convert only tensors whose names start with these prefixes");
  convert->add_option("--exclude", conv.exclude, "leave out tensors whose names start with these prefixes");
  convert->add_option("--rename", conv.rename, "OLD=NEW: the stored tensor OLD is NEW in the copy (repeatable)");

  PublishArgs pub;
  auto* publish = app.add_subcommand(
      "publish", "Export a checkpoint (or some of its tensors) as one file named with its SHA-256's first 8 hex digits");
  publish->add_option("SRC", pub.src, "checkpoint (directory or single file; a root: its newest)")->required();
  publish->add_option("--to", pub.to, "safetensors (default), ckpt or hdf5");
  publish->add_option("--only", pub.only, "tensor names or name prefixes to publish, e.g. model. (default: all)")
      ->delimiter(',');
  publish->add_option("--out", pub.out_dir, "directory of the published file (default: beside SRC)");
  publish->add_flag("--owner-only", pub.owner_only, "keep the file owner-only (0600); default: the umask's mode");
  publish->add_flag("--json", pub.json, "machine-readable output");
  add_key(publish, pub.key, "", "the encrypted source's (the published file is not encrypted)");

  std::string rm_root;
  std::vector<std::string> rm_names;
  auto* rmc = app.add_subcommand("rm", "Remove committed checkpoints the way retention does (files later incremental "
                                       "checkpoints reference stay until nothing does)");
  rmc->add_option("ROOT", rm_root, "checkpoint root directory")->required();
  rmc->add_option("NAME", rm_names, "checkpoint names")->required();
  GcArgs gc;
  auto* gcc = app.add_subcommand("gc", "Remove what abandoned saves left under ROOT (never an entry whose owner runs)");
  gcc->add_option("ROOT", gc.root, "checkpoint root directory")->required();
  gcc->add_flag("--dry-run", gc.dry_run, "say what would be removed, remove nothing");
  gcc->add_option("--older-than", gc.older_than,
                  "also remove entries without an owner record (older builds, crashed removals) older than this "
                  "(30m, 2h, 7d); a remote owner is gone when its heartbeat is older than this too");
  gcc->add_option("--lease", gc.lease, "a remote owner whose heartbeat is older than this is gone (default 10m)");
  gcc->add_flag("--json", gc.json, "machine-readable output");

  // CLI11 would call an unknown command a missing one ("A subcommand is required").
  if (argc > 1 && argv[1][0] != '-') {
    std::string known;
    bool found = false;
    for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
      known += (known.empty() ? "" : ", ") + sub->get_name();
      found |= sub->get_name() == argv[1];
    }
    if (!found) {
      std::fprintf(stderr, "distckpt: unknown command '%s' (commands: %s; --help for more)\n", argv[1], known.c_str());
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  try {
    if (*lay) return cmd_layout(layout);
    if (*ls) return cmd_ls(path, json, key);
    if (*inspect) return cmd_inspect(path, json, key);
    if (*verify)
      return cmd_verify(path, json, deep,
                        allow_unchecked ? std::optional<bool>(true)
                        : refuse_unchecked ? std::optional<bool>(false)
                                           : std::nullopt,
                        key);
    if (*convert) return cmd_convert(conv);
    if (*publish) return cmd_publish(pub);
    if (*gcc) return cmd_gc(gc);
    if (*rmc) return cmd_rm(rm_root, rm_names);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "distckpt: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "distckpt: internal error: %s\n", e.what());
    return 1;
  }
  return 2;
}
