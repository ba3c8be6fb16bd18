// Damaged and hostile checkpoints, made from good ones, for tests/hostile/run.sh.
//
//   hostile gen GOOD_DIR OUT_DIR   GOOD_DIR holds native/ (a checkpoint directory),
//                                  model.ckpt, model.safetensors, model.h5 and, with
//                                  key.hex, encrypted/ (an encrypted checkpoint) and
//                                  model-gcm.ckpt (a .ckpt encrypted whole).
//                                  Writes OUT_DIR/<format>/<case> and OUT_DIR/manifest.tsv:
//                                  case, class, path, key file (or -).
//   hostile load PATH [KEY_FILE]   loads every tensor of PATH (any format) on one
//                                  in-process rank; exit 0 when it loads.
//   hostile batch MANIFEST FIRST RESULTS
//                                  from case FIRST (0-based line of MANIFEST) on, runs
//                                  `distckpt verify`, the load above and `distckpt
//                                  inspect` in this process (the CLI's own command
//                                  functions, their printing included), and appends to
//                                  RESULTS "begin N TOOL" before each call and
//                                  "end N TOOL RC" after it. A call still running after
//                                  10 s appends "end N TOOL 124" and ends the process;
//                                  a crash leaves a "begin" without its "end". For the
//                                  sanitizer builds, where each process start costs
//                                  0.35 s and the three per case took 9 minutes.
//
// Classes (what must refuse the case; every tool must neither crash nor hang on any):
//   structure  damage to what describes the checkpoint (an index, headers, records,
//              truncations, hostile numbers under a valid CRC, empty files): verify,
//              inspect and load refuse it;
//   data       a flip in bytes that a checksum or an authentication tag covers: verify
//              and load refuse it (inspect reads no data);
//   any        bytes nothing checks (an HDF5 file's data, a safetensors header's free
//              text): whatever the tools say, they neither crash nor hang.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include "cli/commands.h"
#include "comm/local_comm.h"
#include "distckpt/distckpt.h"
#include "format/ckpt/ms_ckpt.h"
#include "format/format.h"
#include "format/native/index_codec.h"
#include "format/stored.h"

namespace fs = std::filesystem;
using namespace distckpt;

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}
void write_file(const std::string& path, const std::string& bytes) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

struct Corpus {
  std::string out;
  std::ofstream manifest;
  std::mt19937_64 rng{20261123};
  void add(const std::string& format, const std::string& name, const std::string& cls, const std::string& key = "-") {
    manifest << format << "/" << name << "\t" << cls << "\t" << out << "/" << format << "/" << name << "\t" << key
             << "\n";
  }
  // A single file of `format`, named with its extension, holding `bytes`.
  void file(const std::string& format, const std::string& ext, const std::string& name, const std::string& cls,
            const std::string& bytes, const std::string& key = "-") {
    write_file(out + "/" + format + "/" + name + ext, bytes);
    add(format, name + ext, cls, key);
  }
  std::size_t pick(std::size_t n) { return static_cast<std::size_t>(rng() % n); }
};

std::string flip(std::string bytes, std::size_t at, unsigned char mask = 0x10) {
  bytes[at] = static_cast<char>(static_cast<unsigned char>(bytes[at]) ^ mask);
  return bytes;
}

// ---- native ----

void native_cases(Corpus& c, const std::string& good, const std::string& format = "native", const std::string& key = "-") {
  const std::string index_bytes = read_file(good + "/index.pb");
  std::vector<std::string> data;
  for (const auto& e : fs::directory_iterator(good))
    if (e.path().filename() != "index.pb") data.push_back(e.path().filename().string());
  std::sort(data.begin(), data.end());
  // A copy of the checkpoint with `edit` applied to one of its files.
  auto variant = [&](const std::string& name, const std::string& cls, const std::string& file,
                     const std::function<std::optional<std::string>(std::string)>& edit) {
    const std::string dir = c.out + "/" + format + "/" + name;
    fs::create_directories(dir);
    for (const auto& e : fs::directory_iterator(good)) fs::copy_file(e.path(), dir + "/" + e.path().filename().string());
    auto changed = edit(read_file(dir + "/" + file));
    if (changed) write_file(dir + "/" + file, *changed);
    else fs::remove(dir + "/" + file);
    c.add(format, name, cls, key);
  };
  if (key == "-") {
    // Truncations of the index at every boundary of its frame, and inside its payload.
    for (std::size_t at : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{8}, std::size_t{12},
                           std::size_t{16}, std::size_t{23}, std::size_t{24}, std::size_t{25}, index_bytes.size() / 2,
                           index_bytes.size() - 1})
      variant("index_truncated_" + std::to_string(at), "structure", "index.pb",
              [&](std::string b) { return b.substr(0, at); });
    variant("index_missing", "structure", "index.pb", [](std::string) { return std::nullopt; });
    variant("index_bad_magic", "structure", "index.pb", [](std::string b) { return flip(b, 0); });
    variant("index_version_0", "structure", "index.pb", [](std::string b) { return b.replace(8, 4, std::string(4, '\0')); });
    variant("index_version_99", "structure", "index.pb", [](std::string b) { return b.replace(8, 1, std::string(1, 'c')); });
    variant("index_length_plus_1", "structure", "index.pb", [](std::string b) { return flip(b, 16, 0x01); });
    variant("index_length_huge", "structure", "index.pb", [](std::string b) { return flip(b, 23, 0x10); });
    variant("index_crc_flipped", "structure", "index.pb", [](std::string b) { return flip(b, 12); });
    for (int i = 0; i < 10; ++i) {
      const std::size_t at = 24 + c.pick(index_bytes.size() - 24);
      variant("index_payload_flip" + std::to_string(i) + "_" + std::to_string(at), "structure", "index.pb",
              [&](std::string b) { return flip(b, at, static_cast<unsigned char>(1u << (i % 8))); });
    }
    // Hostile numbers under a valid CRC: only the semantic checks can catch these.
    auto index = internal_format::parse_index(index_bytes, "good");
    if (!index.ok()) return;
    auto hostile = [&](const std::string& name, const std::function<void(proto::Index&)>& edit) {
      proto::Index x = *index;
      edit(x);
      variant("index_hostile_" + name, "structure", "index.pb", [&](std::string) {
        return internal_format::frame_payload(internal_format::serialize_deterministic(x), 1);
      });
    };
    hostile("world_0", [](proto::Index& x) { x.set_world_size(0); });
    hostile("world_huge", [](proto::Index& x) { x.set_world_size(1 << 30); });
    hostile("dtype", [](proto::Index& x) { x.mutable_tensors(0)->set_dtype("float99"); });
    hostile("shape_negative", [](proto::Index& x) { x.mutable_tensors(0)->set_global_shape(0, -4); });
    hostile("shape_overflow", [](proto::Index& x) {
      auto* t = x.mutable_tensors(0);
      t->set_global_shape(0, int64_t{1} << 40);
      t->add_global_shape(int64_t{1} << 40);
    });
    hostile("chunk_outside", [](proto::Index& x) { x.mutable_tensors(0)->mutable_chunks(0)->set_offset(0, 1000000); });
    hostile("chunk_length", [](proto::Index& x) { x.mutable_tensors(0)->mutable_chunks(0)->set_length(3); });
    hostile("chunk_past_file", [](proto::Index& x) {
      x.mutable_tensors(0)->mutable_chunks(0)->set_byte_offset(uint64_t{1} << 50);
    });
    hostile("chunk_file_id", [](proto::Index& x) { x.mutable_tensors(0)->mutable_chunks(0)->set_file_id(1000); });
    hostile("chunk_missing", [](proto::Index& x) { x.mutable_tensors(0)->mutable_chunks()->RemoveLast(); });
    hostile("chunk_overlap", [](proto::Index& x) {
      auto* t = x.mutable_tensors(0);
      if (t->chunks_size() > 1) *t->mutable_chunks(1)->mutable_offset() = t->chunks(0).offset();
    });
    hostile("file_size_absurd", [](proto::Index& x) { x.mutable_files(0)->set_size(uint64_t{1} << 63); });
    hostile("file_escapes", [](proto::Index& x) { x.mutable_files(0)->set_name("../evil.bin"); });
    hostile("file_control_char", [](proto::Index& x) { x.mutable_files(0)->set_name("data\n.bin"); });
    hostile("tensor_control_char", [](proto::Index& x) { x.mutable_tensors(0)->set_name("w\x01"); });
    hostile("tensor_twice", [](proto::Index& x) { *x.add_tensors() = x.tensors(0); });
    hostile("tensor_map_range", [](proto::Index& x) {
      auto* l = x.mutable_tensors(0)->mutable_layout();
      if (l->tensor_map_size() > 0) l->set_tensor_map(0, 7);
    });
    hostile("tensor_map_twice", [](proto::Index& x) {
      auto* l = x.mutable_tensors(0)->mutable_layout();
      for (int i = 0; i < l->tensor_map_size(); ++i) l->set_tensor_map(i, 0);
    });
    hostile("dev_mat_zero", [](proto::Index& x) {
      auto* l = x.mutable_tensors(0)->mutable_layout();
      if (l->dev_mat_size() > 0) l->set_dev_mat(0, 0);
    });
    hostile("dev_mat_huge", [](proto::Index& x) {
      auto* l = x.mutable_tensors(0)->mutable_layout();
      if (l->dev_mat_size() > 0) l->set_dev_mat(0, int64_t{1} << 40);
    });
    hostile("ranks_first", [](proto::Index& x) { x.mutable_tensors(0)->mutable_layout()->set_ranks_first(1 << 20); });
    hostile("ranks_negative", [](proto::Index& x) {
      auto* l = x.mutable_tensors(0)->mutable_layout();
      l->add_ranks(-1);
    });
    hostile("checksum_unknown", [](proto::Index& x) { x.mutable_transforms()->set_checksum("xxh3-128"); });
    hostile("compression_unknown", [](proto::Index& x) { x.mutable_transforms()->set_compression("zstd"); });
    hostile("encryption_without_parameters", [](proto::Index& x) { x.mutable_transforms()->set_encryption("AES-256-GCM"); });
    hostile("format_single_file", [](proto::Index& x) { x.set_format("hdf5"); });
    hostile("nonce_in_plain", [](proto::Index& x) { x.mutable_tensors(0)->mutable_chunks(0)->set_nonce("123456789012"); });
  }
  // Data files: gone, empty, truncated, and flipped bytes (every chunk has a CRC32C, or
  // a tag when encrypted).
  for (const auto& f : data) {
    if (key == "-") {
      variant(f + "_missing", "data", f, [](std::string) { return std::nullopt; });
      variant(f + "_empty", "data", f, [](std::string) { return std::string(); });
      variant(f + "_truncated", "data", f, [](std::string b) { return b.substr(0, b.size() - 1); });
    }
    const std::size_t size = fs::file_size(good + "/" + f);
    for (int i = 0; i < 4 && size > 0; ++i) {
      const std::size_t at = c.pick(size);
      variant(f + "_flip" + std::to_string(i) + "_" + std::to_string(at), "data", f,
              [&](std::string b) { return flip(b, at, static_cast<unsigned char>(1u << (i % 8))); });
    }
  }
}

// ---- single files ----

// Truncations at each boundary and in the middle of each span between boundaries, the
// empty file, and `flips` flipped bytes of class `flip_class` in [flip_begin, flip_end).
void single_file_cases(Corpus& c, const std::string& format, const std::string& ext, const std::string& good,
                       std::vector<std::size_t> cuts, std::size_t flip_begin, std::size_t flip_end,
                       const std::string& flip_class, int flips) {
  cuts.push_back(0);
  cuts.push_back(good.size() - 1);
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  std::vector<std::size_t> all = cuts;
  for (std::size_t i = 0; i + 1 < cuts.size(); ++i) all.push_back((cuts[i] + cuts[i + 1]) / 2);
  for (std::size_t at : all)
    if (at < good.size()) c.file(format, ext, "truncated_" + std::to_string(at), "structure", good.substr(0, at));
  for (int i = 0; i < flips && flip_end > flip_begin; ++i) {
    const std::size_t at = flip_begin + c.pick(flip_end - flip_begin);
    c.file(format, ext, "flip" + std::to_string(i) + "_" + std::to_string(at), flip_class, flip(good, at, static_cast<unsigned char>(1u << (i % 8))));
  }
}

void ckpt_cases(Corpus& c, const std::string& path) {
  const std::string good = read_file(path);
  auto file = posix_filesystem()->open_readable(path);
  auto scan = internal_format::scan_ckpt(**file, good.size(), path);
  std::vector<std::size_t> cuts{good.size() - internal_format::kCkptFooterBytes};
  if (scan.ok())
    for (const auto& r : scan->records) {
      cuts.push_back(r.content_offset);
      cuts.push_back(r.content_offset + r.content_bytes);
    }
  single_file_cases(c, "ckpt", ".ckpt", good, cuts, 0, good.size(), "data", 24);  // the CRC-32 footer covers all
  c.file("ckpt", ".ckpt", "first_byte", "structure", flip(good, 0, 0xff));
  c.file("ckpt", ".ckpt", "varint_huge", "structure", std::string("\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", 11) + good);
  c.file("ckpt", ".ckpt", "lightning_zip", "structure", std::string("PK\x03\x04", 4) + good.substr(4));
  c.file("ckpt", ".ckpt", "pickle", "structure", std::string("\x80\x04\x95", 3) + good.substr(3));
}

// A .ckpt encrypted whole in MindSpore's framing (AES-GCM), read with its key: cuts at
// every header field and in the cipher, hostile header numbers, another mode's magic, a
// second block cut short; flips anywhere (every byte is under the tag or in the header).
void framed_ckpt_cases(Corpus& c, const std::string& good, const std::string& key) {
  const std::string format = "ckpt-encrypted";
  for (std::size_t at : {std::size_t{3}, std::size_t{4}, std::size_t{20}, std::size_t{24}, std::size_t{28},
                         std::size_t{44}, std::size_t{48}, good.size() / 2, good.size() - 1})
    c.file(format, ".ckpt", "truncated_" + std::to_string(at), "structure", good.substr(0, at), key);
  auto with_u32 = [&](std::size_t at, uint32_t v) {
    std::string b = good;
    std::memcpy(b.data() + at, &v, 4);
    return b;
  };
  c.file(format, ".ckpt", "block_size_huge", "structure", with_u32(20, 0x7fffffffu), key);
  c.file(format, ".ckpt", "iv_len_12", "structure", with_u32(24, 12), key);
  c.file(format, ".ckpt", "cipher_len_0", "structure", with_u32(44, 0), key);
  c.file(format, ".ckpt", "cipher_len_negative", "structure", with_u32(44, 0x80000000u), key);
  c.file(format, ".ckpt", "cbc_magic", "structure", with_u32(0, 0x7F3A5ED9u), key);
  c.file(format, ".ckpt", "second_block_cut", "structure", good + good.substr(0, 60), key);
  for (int i = 0; i < 24; ++i) {
    const std::size_t at = c.pick(good.size());
    c.file(format, ".ckpt", "flip" + std::to_string(i) + "_" + std::to_string(at), "data",
           flip(good, at, static_cast<unsigned char>(1u << (i % 8))), key);
  }
}

void safetensors_cases(Corpus& c, const std::string& good) {
  uint64_t header = 0;
  std::memcpy(&header, good.data(), 8);
  std::vector<std::size_t> cuts{8, 8 + header / 2, 8 + header};
  const auto j = nlohmann::json::parse(good.substr(8, header), nullptr, false);
  if (j.is_object())
    for (const auto& [name, t] : j.items())
      if (name != "__metadata__" && t.contains("data_offsets")) {
        cuts.push_back(8 + header + t["data_offsets"][0].get<std::size_t>());
        cuts.push_back(8 + header + t["data_offsets"][1].get<std::size_t>());
      }
  // Data bytes: distckpt's per-tensor CRC32C covers them. Header bytes: what a flip
  // there does is up to the JSON (a name, a number, free text), so: no crash, no hang.
  single_file_cases(c, "safetensors", ".safetensors", good, cuts, 8 + header, good.size(), "data", 16);
  for (int i = 0; i < 12; ++i) {
    const std::size_t at = 8 + c.pick(header);
    c.file("safetensors", ".safetensors", "header_flip" + std::to_string(i) + "_" + std::to_string(at), "any", flip(good, at, static_cast<unsigned char>(1u << (i % 8))));
  }
  std::string huge = good;
  huge[7] = 0x7f;
  c.file("safetensors", ".safetensors", "header_length_huge", "structure", huge);
  std::string not_json = good;
  not_json[8] = '[';
  c.file("safetensors", ".safetensors", "header_not_object", "structure", not_json);
}

void hdf5_cases(Corpus& c, const std::string& path) {
  const std::string good = read_file(path);
  auto index = internal_format::read_stored_index(*posix_filesystem(), path);
  std::vector<std::size_t> cuts{8, 16, 48, 96, 512, 1024};
  std::size_t first_data = good.size();
  if (index.ok())
    for (const auto& t : index->tensors())
      for (const auto& ch : t.chunks()) {
        cuts.push_back(ch.byte_offset());
        cuts.push_back(ch.byte_offset() + ch.length() / 2);
        if (ch.length() > 0) first_data = std::min<std::size_t>(first_data, ch.byte_offset());
      }
  // HDF5 carries no checksums: flips in its metadata must not crash or hang anything.
  single_file_cases(c, "hdf5", ".h5", good, cuts, 0, first_data, "any", 40);
  c.file("hdf5", ".h5", "bad_magic", "structure", flip(good, 1, 0xff));
}

int gen(const std::string& good, const std::string& out) {
  fs::remove_all(out);
  fs::create_directories(out);
  Corpus c;
  c.out = out;
  c.manifest.open(out + "/manifest.tsv");
  native_cases(c, good + "/native");
  if (fs::exists(good + "/encrypted") && fs::exists(good + "/key.hex"))
    native_cases(c, good + "/encrypted", "encrypted", good + "/key.hex");
  ckpt_cases(c, good + "/model.ckpt");
  if (fs::exists(good + "/model-gcm.ckpt") && fs::exists(good + "/key.hex"))
    framed_ckpt_cases(c, read_file(good + "/model-gcm.ckpt"), good + "/key.hex");
  safetensors_cases(c, read_file(good + "/model.safetensors"));
  hdf5_cases(c, good + "/model.h5");
  for (const auto* ext : {".ckpt", ".safetensors", ".h5"}) {
    const std::string format = ext == std::string(".ckpt") ? "ckpt" : ext == std::string(".h5") ? "hdf5" : "safetensors";
    c.file(format, ext, "empty", "structure", "");
    c.file(format, ext, "text", "structure", "these are notes, not a checkpoint\n");
  }
  std::printf("hostile: corpus in %s\n", out.c_str());
  return 0;
}

// Loads every tensor of `path` as one rank holding whole tensors.
int load_all(const std::string& path, const std::string& key_file) {
  InspectOptions options;
  if (!key_file.empty()) {
    auto key = EncryptionKey::from_file(key_file);
    if (!key.ok()) return 2;
    options.key = std::make_shared<EncryptionKey>(*key);
  }
  auto info = read_checkpoint_info(path, options);
  if (!info.ok()) {
    std::printf("%s\n", info.status().to_string().c_str());
    return 1;
  }
  Status st;
  internal_comm::run_local_ranks(1, [&](Comm& comm) {
    StateDict state(0);
    std::vector<std::vector<char>> buffers;
    for (const auto& t : info->tensors) {
      auto layout = TensorLayout::from_device_matrix(t.global_shape, {1}, Shape(t.global_shape.size(), -1));
      if (!layout.ok()) {
        st = layout.status();
        return;
      }
      int64_t n = 1;
      for (int64_t d : t.global_shape) n *= d;
      buffers.emplace_back(static_cast<std::size_t>(n) * dtype_size(t.dtype) + 1);
      st = state.add_tensor(t.name, t.dtype, buffers.back().data(), *layout);
      if (!st.ok()) return;
    }
    LoadOptions lo;
    lo.key = options.key;
    st = load(comm, state, path, lo).status();
  });
  std::printf("%s\n", st.to_string().c_str());
  return st.ok() ? 0 : 1;
}

// What the SIGALRM handler writes when a call hangs: prepared before each call, since a
// handler may only write() and _exit().
int results_fd = -1;
char hang_line[64];
std::size_t hang_line_size = 0;

void on_hang(int) {
  [[maybe_unused]] ssize_t n = ::write(results_fd, hang_line, hang_line_size);
  _exit(124);
}

// A command of the CLI, as its main() runs it: an exception is an internal error, exit 1.
int as_cli_main(const char* tool, const std::string& path, const std::function<int()>& command) {
  try {
    return command();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hostile batch: %s %s: exception: %s\n", tool, path.c_str(), e.what());
    return 1;
  }
}

bool append(const std::string& line) {
  return ::write(results_fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
}

int batch(const std::string& manifest_path, long first, const std::string& results_path) {
  results_fd = ::open(results_path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (results_fd < 0) {
    std::perror(results_path.c_str());
    return 2;
  }
  // The tools' reports go nowhere (run.sh judges them by their exit codes); stderr stays,
  // for the sanitizers' reports.
  std::fflush(stdout);
  const int devnull = ::open("/dev/null", O_WRONLY);
  if (devnull < 0 || ::dup2(devnull, STDOUT_FILENO) < 0) return 2;
  ::close(devnull);
  struct sigaction sa {};
  sa.sa_handler = on_hang;
  sigaction(SIGALRM, &sa, nullptr);

  std::ifstream manifest(manifest_path);
  std::string line;
  for (long n = 0; std::getline(manifest, line); ++n) {
    if (n < first) continue;
    std::vector<std::string> fields;
    std::size_t at = 0;
    for (std::size_t tab; (tab = line.find('\t', at)) != std::string::npos; at = tab + 1)
      fields.push_back(line.substr(at, tab - at));
    fields.push_back(line.substr(at));
    if (fields.size() != 4) {
      std::fprintf(stderr, "hostile batch: line %ld of %s is not 'case class path key'\n", n + 1,
                   manifest_path.c_str());
      return 2;
    }
    const std::string& path = fields[2];
    const std::string key_file = fields[3] == "-" ? "" : fields[3];
    internal_cli::KeyArgs key;
    key.file = key_file;
    // `load` as `hostile load` runs it: an exception ends the process.
    const std::pair<const char*, std::function<int()>> tools[] = {
        {"verify",
         [&] { return as_cli_main("verify", path, [&] { return internal_cli::cmd_verify(path, false, false, false, key); }); }},
        {"load", [&] { return load_all(path, key_file); }},
        {"inspect", [&] { return as_cli_main("inspect", path, [&] { return internal_cli::cmd_inspect(path, false, key); }); }},
    };
    for (const auto& [tool, call] : tools) {
      hang_line_size = static_cast<std::size_t>(
          std::snprintf(hang_line, sizeof hang_line, "end %ld %s 124\n", n, tool));
      if (!append("begin " + std::to_string(n) + " " + tool + "\n")) return 2;
      alarm(10);
      const int rc = call();
      alarm(0);
      if (!append("end " + std::to_string(n) + " " + tool + " " + std::to_string(rc) + "\n")) return 2;
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "gen") return gen(argv[2], argv[3]);
  if ((argc == 3 || argc == 4) && std::string(argv[1]) == "load") return load_all(argv[2], argc == 4 ? argv[3] : "");
  if (argc == 5 && std::string(argv[1]) == "batch") return batch(argv[2], std::atol(argv[3]), argv[4]);
  std::fprintf(stderr,
               "usage: hostile gen GOOD_DIR OUT_DIR | hostile load PATH [KEY_FILE] | "
               "hostile batch MANIFEST FIRST RESULTS\n");
  return 2;
}
