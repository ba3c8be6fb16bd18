#include "format/native/index_codec.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <string_view>

#include "base/text.h"
#include "format/format.h"
#include "layout/tiling.h"
#include "transform/cipher.h"
#include "transform/content_hash.h"
#include "transform/crc32c.h"

namespace distckpt::internal_format {

using internal_base::is_printable_utf8;
using internal_base::printable;

namespace {

constexpr char kMagic[8] = {'D', 'C', 'K', 'P', 'T', 'I', 'D', 'X'};
constexpr std::size_t kHeaderSize = 8 + 4 + 4 + 8;
// An index describes metadata only; 16,384 ranks x 2,000 tensors fit well below this.
constexpr uint64_t kMaxIndexBytes = uint64_t{2} << 30;

template <typename T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(v));  // little-endian hosts only (x86-64, aarch64)
}
template <typename T>
T get(const std::string& in, std::size_t pos) {
  T v;
  std::memcpy(&v, in.data() + pos, sizeof(v));
  return v;
}

}  // namespace

bool valid_file_name(const std::string& name) {
  return !name.empty() && name.size() <= 255 && name != "." && name != ".." && name != kIndexFileName &&
         name.find('/') == std::string::npos && internal_base::is_printable_utf8(name);
}

bool valid_save_dir(std::string_view dir) {
  if (dir.size() != 18 || dir.substr(0, 2) != "s-") return false;
  for (char c : dir.substr(2))
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

std::string file_identity(const std::string& name) {
  const std::size_t slash = name.find('/');
  if (slash != std::string::npos && valid_save_dir(std::string_view(name).substr(0, slash))) return name.substr(slash + 1);
  return name;
}

bool valid_data_file_name(const std::string& name) {
  if (valid_file_name(name)) return true;
  if (const std::size_t slash = name.find('/');
      slash != std::string::npos && valid_save_dir(std::string_view(name).substr(0, slash)))
    return valid_file_name(name.substr(slash + 1));
  constexpr std::string_view kPrefix = "rank_";
  const std::size_t slash = name.find('/');
  if (name.rfind(kPrefix, 0) != 0 || slash == std::string::npos) return false;
  const std::size_t digits = slash - kPrefix.size();
  if (digits == 0 || digits > 8) return false;
  for (std::size_t i = kPrefix.size(); i < slash; ++i)
    if (name[i] < '0' || name[i] > '9') return false;
  return valid_file_name(name.substr(slash + 1));
}

std::string per_rank_file_name(int rank, const std::string& name) {
  return "rank_" + std::to_string(rank) + "/" + name + ".ckpt";
}

namespace {
// Whether `file` is exactly per_rank_file_name(r, the index's name) of a per-rank set,
// with r one of its ranks.
bool per_rank_name_of(const proto::Index& index, const std::string& file) {
  if (index.per_rank_format().empty() || index.world_size() < 1) return false;
  const auto slash = file.find('/');
  if (slash == std::string::npos || slash <= 5) return false;
  const std::string digits = file.substr(5, slash - 5);
  if (digits.size() > 8 || digits.find_first_not_of("0123456789") != std::string::npos) return false;
  const int r = std::stoi(digits);
  return r < index.world_size() && file == per_rank_file_name(r, index.name());
}
}  // namespace

std::string data_file_name(int writer_rank) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "data-%05d.bin", writer_rank);
  return buf;
}

namespace {
bool has_references(const proto::Index& index) {
  for (const auto& f : index.files())
    if (!f.checkpoint().empty()) return true;
  return false;
}
}  // namespace

uint32_t index_version(const proto::Index& index) {
  if (index.info().count(std::string(kStateTreeInfoKey))) return 4;
  if (has_references(index)) return 3;
  return index.has_encryption() ? 2 : 1;
}

std::string frame_index(const proto::Index& index) {
  return frame_payload(serialize_deterministic(index), index_version(index));
}

std::string frame_payload(const std::string& payload, uint32_t version) {
  std::string out(kMagic, sizeof(kMagic));
  put<uint32_t>(out, version);
  put<uint32_t>(out, internal_transform::crc32c(payload.data(), payload.size()));
  put<uint64_t>(out, payload.size());
  out += payload;
  return out;
}

Result<proto::Index> parse_index(const std::string& bytes, const std::string& path) {
  if (bytes.size() < kHeaderSize || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0)
    return corruption("index '" + path + "': not a distckpt index (bad magic or " + std::to_string(bytes.size()) +
                      " bytes)");
  const auto version = get<uint32_t>(bytes, 8);
  if (version == 0) return corruption("index '" + path + "': format version 0 is invalid");
  if (version > kIndexFormatVersion)
    return unsupported("index '" + path + "': format version " + std::to_string(version) +
                       " is newer than this build supports (" + std::to_string(kIndexFormatVersion) +
                       "); upgrade distckpt");
  const auto crc = get<uint32_t>(bytes, 12);
  const auto length = get<uint64_t>(bytes, 16);
  if (length != bytes.size() - kHeaderSize)
    return corruption("index '" + path + "': header says " + std::to_string(length) + " payload bytes, file has " +
                      std::to_string(bytes.size() - kHeaderSize) + " (truncated?)");
  const uint32_t actual = internal_transform::crc32c(bytes.data() + kHeaderSize, length);
  if (actual != crc) return corruption("index '" + path + "': " + internal_transform::crc32c_mismatch(actual, crc));
  proto::Index index;
  if (!index.ParseFromArray(bytes.data() + kHeaderSize, static_cast<int>(length)))
    return corruption("index '" + path + "': protobuf payload does not parse");
  if (index.has_encryption() && version < 2)
    return corruption("index '" + path + "': an encrypted index framed as version " + std::to_string(version));
  if (has_references(index) && version < 3)
    return corruption("index '" + path + "': an index with references framed as version " + std::to_string(version));
  // An index.pb describes a checkpoint directory: never a single file, whose encryption
  // is checked another way (open_index follows `format`).
  // Only a .ckpt's reader says a file is encrypted whole (and opened with its key).
  if (index.has_file_encryption()) return corruption("index '" + path + "': a whole-file encryption record");
  if (!index.format().empty() && format_from_name(index.format()) != Format::kNative)
    return corruption("index '" + path + "': format '" + printable(index.format()) +
                      "' in an index.pb");
  if (index.has_encryption() && !index.encryption().associated().empty())
    return corruption("index '" + path + "': a single file's seal in an index.pb");
  DISTCKPT_RETURN_IF_ERROR(validate_index(index, path));
  return index;
}

Status check_reference_identity(FileSystem& fs, const std::string& root, const proto::File& file) {
  const std::string dir = root + "/" + file.checkpoint();
  const char* name = kIndexFileName;
  auto bytes = read_index_bytes(fs, dir, name);
  if (!bytes.ok() && bytes.status().code() == StatusCode::kNotFound) {
    name = kRetiredIndexFileName;
    bytes = read_index_bytes(fs, dir, name);
  }
  if (!bytes.ok())
    return corruption("the checkpoint '" + dir + "' that this one references has no readable index (" +
                      bytes.status().to_string() + ")");
  DISTCKPT_ASSIGN_OR_RETURN(proto::Index index, parse_index(*bytes, dir + "/" + name));
  if (index.commit_seq() != file.checkpoint_seq())
    return corruption("'" + dir + "' is not the checkpoint this one references (its commit number is " +
                      std::to_string(index.commit_seq()) + ", the reference records " +
                      std::to_string(file.checkpoint_seq()) + "): it was replaced, or copied there");
  return Status();
}

Result<std::string> read_index_bytes(FileSystem& fs, const std::string& dir, const char* file_name) {
  const std::string path = dir + "/" + file_name;
  DISTCKPT_ASSIGN_OR_RETURN(auto file, fs.open_readable(path));
  DISTCKPT_ASSIGN_OR_RETURN(uint64_t size, file->size());
  // The header first: nothing is allocated for a file that is not an index of the
  // size it claims (a sparse multi-GiB file must not cost multi-GiB of memory).
  std::string bytes(std::min<uint64_t>(size, kHeaderSize), '\0');
  DISTCKPT_RETURN_IF_ERROR(file->read_at(bytes.data(), bytes.size(), 0));
  if (bytes.size() == kHeaderSize && std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) == 0) {
    const auto length = get<uint64_t>(bytes, 16);
    if (length != size - kHeaderSize || length > kMaxIndexBytes)
      return corruption("index '" + path + "': header says " + std::to_string(length) + " payload bytes, file has " +
                        std::to_string(size - kHeaderSize) + (length > kMaxIndexBytes ? " (too large)" : ""));
    bytes.resize(size);
    DISTCKPT_RETURN_IF_ERROR(file->read_at(bytes.data() + kHeaderSize, length, kHeaderSize));
  }
  return bytes;  // parse_index reports whatever is wrong with a bad header
}

bool is_framed_index(const std::string& bytes) {
  return bytes.size() >= sizeof(kMagic) && std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) == 0;
}

Result<proto::Index> read_index(FileSystem& fs, const std::string& dir) {
  DISTCKPT_ASSIGN_OR_RETURN(std::string bytes, read_index_bytes(fs, dir));
  return parse_index(bytes, dir + "/" + kIndexFileName);
}

namespace {

// The files: names inside the checkpoint (or a per-rank set's), references to other
// checkpoints of the root, no file twice, sizes bounded.
Status check_files(const proto::Index& index, const std::string& where) {
  std::set<std::string> file_names;
  for (const auto& f : index.files()) {
    if (f.name().find('/') != std::string::npos && !per_rank_name_of(index, f.name()) &&
        file_identity(f.name()) == f.name())
      return corruption(where + ": file name '" + printable(f.name()) +
                        "' escapes the checkpoint directory or is invalid (only a per-rank set's "
                        "rank_<r>/<name>.ckpt of this checkpoint, or an object root's save prefix s-<id>/, "
                        "names a directory)");
    if (!valid_data_file_name(f.name()))
      return corruption(where + ": file name '" + printable(f.name()) +
                        "' escapes the checkpoint directory or is invalid");
    if (!f.checkpoint().empty()) {
      // A reference names another checkpoint of the same root: one path component.
      const std::string& c = f.checkpoint();
      if (c.size() > 255 || c == "." || c == ".." || c.find('/') != std::string::npos || c.find('\0') != std::string::npos ||
          c.find(".tmp-") != std::string::npos || c.rfind(".distckpt", 0) == 0 || c == "latest" || !is_printable_utf8(c))
        return corruption(where + ": file '" + f.name() + "' references checkpoint '" + printable(c) +
                          "', which is not a checkpoint name of this root");
      if (c == index.name()) return corruption(where + ": file '" + f.name() + "' references its own checkpoint");
      if (index.has_encryption()) return corruption(where + ": an encrypted checkpoint references another's file");
      if (f.name().find('/') != std::string::npos) return corruption(where + ": a reference to a per-rank set's file");
    }
    if (!file_names.insert(f.checkpoint() + "/" + f.name()).second)
      return corruption(where + ": file '" + f.checkpoint() + (f.checkpoint().empty() ? "" : "/") + f.name() +
                        "' listed twice");
    if (f.size() > (uint64_t{1} << 62)) return corruption(where + ": file '" + f.name() + "' has an absurd size");
  }
  return Status();
}

struct EncryptionSizes {
  std::optional<EncryptionMode> mode;  // set for chunk encryption
  std::size_t nonce_bytes = 0, tag_bytes = 0;
};

// Encrypted: the mode and its sizes, checked before any key is derived from them.
Status check_encryption(const proto::Index& index, const std::string& where, EncryptionSizes* sizes) {
  if (index.has_encryption() && index.has_file_encryption()) return corruption(where + ": encrypted twice");
  if (index.has_encryption()) {
    const auto& e = index.encryption();
    sizes->mode = encryption_mode_from_name(e.mode());
    if (!sizes->mode || *sizes->mode == EncryptionMode::kNone)
      return corruption(where + ": unknown encryption mode '" + printable(e.mode()) + "'");
    if (e.salt().size() != internal_transform::kSaltBytes)
      return corruption(where + ": encryption salt of " + std::to_string(e.salt().size()) + " bytes");
    sizes->nonce_bytes = *sizes->mode == EncryptionMode::kAesGcm ? 12 : 16;
    sizes->tag_bytes = *sizes->mode == EncryptionMode::kAesGcm ? 16 : 32;
    // The seal: the tensor table of an index.pb, the metadata of a .ckpt.
    if (e.table_nonce().size() != sizes->nonce_bytes || e.table_tag().size() != sizes->tag_bytes)
      return corruption(where + ": the seal's nonce or tag has the wrong size");
    if (index.transforms().encryption() != e.algorithm())
      return corruption(where + ": transforms say '" + printable(index.transforms().encryption()) +
                        "', the encryption record '" + printable(e.algorithm()) + "'");
  } else if (index.has_file_encryption()) {  // a .ckpt encrypted whole (only its reader says so)
    const proto::FileEncryption& e = index.file_encryption();
    const auto mode = encryption_mode_from_name(e.mode());
    if (index.format() != "ckpt") return corruption(where + ": whole-file encryption outside a .ckpt");
    if (!mode || *mode == EncryptionMode::kNone)
      return corruption(where + ": unknown encryption mode '" + printable(e.mode()) + "'");
    if (index.transforms().encryption() != (e.opened() ? e.algorithm() : e.mode()))
      return corruption(where + ": transforms say '" + printable(index.transforms().encryption()) +
                        "', the file's encryption '" + printable(e.opened() ? e.algorithm() : e.mode()) + "'");
    if (!e.opened() && index.tensors_size() > 0) return corruption(where + ": encrypted whole, yet tensors listed");
  } else if (!index.transforms().encryption().empty() && index.transforms().encryption() != "none") {
    return corruption(where + ": encryption '" + printable(index.transforms().encryption()) +
                      "' without its parameters");
  }
  return Status();
}

// A tensor's layout, every field checked, needed or not: a layout load does not use is
// still one that cannot have been saved. Adds the ranks it lists to `listed_ranks`.
Status check_layout(const proto::Tensor& t, const std::string& tw, int64_t world_size, int64_t* listed_ranks) {
  const int dims = t.global_shape_size();
  const auto& L = t.layout();
  if (L.dev_mat_size() > 0 && L.tensor_map_size() != dims)
    return corruption(tw + ": tensor_map has " + std::to_string(L.tensor_map_size()) + " entries for " +
                      std::to_string(dims) + " dims");
  for (int r : L.ranks())
    if (r < 0) return corruption(tw + ": negative rank in layout");
  // The save-time group: a rank list, or (device-matrix form) the contiguous run of
  // prod(dev_mat) ranks from ranks_first, which must lie inside the world.
  int64_t group = 1;
  for (int64_t d : L.dev_mat()) {
    if (d <= 0 || d > kMaxWorldSize || group * d > kMaxWorldSize)
      return corruption(tw + ": layout dev_mat has a non-positive or too large entry");
    group *= d;
  }
  if (L.dev_mat_size() == 0 && L.tensor_map_size() > 0) return corruption(tw + ": tensor_map without dev_mat");
  // Every field is checked, needed or not: a layout load does not use is still one
  // that cannot have been saved (MindSpore's rules, as TensorLayout checks them).
  {
    const int64_t axes = L.dev_mat_size();
    std::vector<bool> used(static_cast<std::size_t>(axes), false);
    for (int i = 0; i < L.tensor_map_size(); ++i) {
      const int64_t k = L.tensor_map(i);
      if (k == -1) continue;
      if (k < -1 || k >= axes)
        return corruption(tw + ": tensor_map[" + std::to_string(i) + "] = " + std::to_string(k) +
                          " is out of range for " + std::to_string(axes) + " device axes");
      const auto axis = static_cast<std::size_t>(axes - 1 - k);
      if (used[axis]) return corruption(tw + ": tensor_map uses device axis " + std::to_string(k) + " twice");
      used[axis] = true;
      const int64_t parts = L.dev_mat(static_cast<int>(axis));
      if (parts > 0 && t.global_shape(i) % parts != 0)
        return corruption(tw + ": dim " + std::to_string(i) + " (" + std::to_string(t.global_shape(i)) +
                          ") is not divisible by its split " + std::to_string(parts));
    }
  }
  if (L.ranks_first() < 0 || (L.ranks_first() > 0 && (L.dev_mat_size() == 0 || L.ranks_size() > 0)))
    return corruption(tw + ": layout has a bad ranks_first " + std::to_string(L.ranks_first()));
  if (L.dev_mat_size() > 0 && L.ranks_size() == 0 && L.ranks_first() + group > world_size)
    return corruption(tw + ": layout's ranks " + std::to_string(L.ranks_first()) + ".." +
                      std::to_string(L.ranks_first() + group - 1) + " lie outside the world of " +
                      std::to_string(world_size));
  if (L.dev_mat_size() > 0 && L.ranks_size() > 0 && L.ranks_size() != group)
    return corruption(tw + ": layout lists " + std::to_string(L.ranks_size()) + " ranks for dev_mat of " +
                      std::to_string(group));
  *listed_ranks += L.ranks_size() > 0 || L.dev_mat_size() == 0 ? L.ranks_size() : group;
  return Status();
}

}  // namespace

Status validate_index(const proto::Index& index, const std::string& path) {
  const std::string where = "index '" + path + "'";
  if (index.world_size() < 1 || index.world_size() > kMaxWorldSize)
    return corruption(where + ": world size " + std::to_string(index.world_size()));
  // Commit numbers order a root's checkpoints (latest, retention) and the next save takes
  // the highest + 1: one near 2^64 would wrap it to 0 and pin itself as the newest.
  if (index.commit_seq() >= kCommitSeqLimit)
    return corruption(where + ": commit number " + std::to_string(index.commit_seq()));
  // What this build cannot read, it refuses: a checksum it does not know would be read as
  // "no checksum", a compression as plain bytes (a silently wrong load).
  const std::string& checksum = index.transforms().checksum();
  if (!checksum.empty() && checksum != "crc32c" && checksum != "none")
    return unsupported(where + ": checksum '" + printable(checksum) + "' is not known to this build; upgrade distckpt");
  const std::string& compression = index.transforms().compression();
  if (!compression.empty() && compression != "none")
    return unsupported(where + ": compression '" + printable(compression) +
                       "' is not known to this build; upgrade distckpt");
  DISTCKPT_RETURN_IF_ERROR(check_files(index, where));
  EncryptionSizes sizes;
  DISTCKPT_RETURN_IF_ERROR(check_encryption(index, where, &sizes));
  const std::optional<EncryptionMode>& encryption = sizes.mode;
  const std::size_t nonce_bytes = sizes.nonce_bytes, tag_bytes = sizes.tag_bytes;
  int64_t listed_ranks = 0;  // what to_checkpoint_info will list, bounded before anything is allocated
  std::set<std::string> names;
  for (const auto& t : index.tensors()) {
    const std::string tw = where + ": tensor '" + printable(t.name()) + "'";
    if (t.name().empty()) return corruption(where + ": tensor with an empty name");
    if (!is_printable_utf8(t.name()))
      return corruption(where + ": tensor name '" + printable(t.name()) + "' has control characters or invalid UTF-8");
    if (!names.insert(t.name()).second) return corruption(tw + " appears twice");
    const auto dtype = dtype_from_name(t.dtype());
    if (!dtype) return corruption(tw + ": unknown dtype '" + printable(t.dtype()) + "'");
    if (static_cast<std::size_t>(t.global_shape_size()) > internal_layout::kMaxDims)
      return corruption(tw + ": " + std::to_string(t.global_shape_size()) + " dims (at most " +
                        std::to_string(internal_layout::kMaxDims) + ")");
    const Shape global(t.global_shape().begin(), t.global_shape().end());
    if (!internal_layout::checked_num_elements(global))
      return corruption(tw + ": global shape has a negative or overflowing dimension");
    const int dims = t.global_shape_size();
    DISTCKPT_RETURN_IF_ERROR(check_layout(t, tw, index.world_size(), &listed_ranks));
    if (listed_ranks > kMaxListedRanks)
      return corruption(where + ": its layouts name more than " + std::to_string(kMaxListedRanks) + " ranks in all");
    std::set<Box> distinct;
    for (int c = 0; c < t.chunks_size(); ++c) {
      const auto& ch = t.chunks(c);
      const std::string cw = tw + ": chunk " + std::to_string(c);
      if (ch.offset_size() != dims || ch.shape_size() != dims)
        return corruption(cw + ": box has the wrong number of dims");
      Box box;
      for (int d = 0; d < dims; ++d) {
        const int64_t o = ch.offset(d), s = ch.shape(d), g = t.global_shape(d);
        if (o < 0 || s < 0 || o > g || s > g - o) return corruption(cw + ": box lies outside the tensor");
        box.offset.push_back(o);
        box.shape.push_back(s);
      }
      uint64_t want = static_cast<uint64_t>(box.num_elements()) * dtype_size(*dtype);
      if (encryption) {
        want = internal_transform::stored_length(*encryption, want);  // CBC: PKCS#7 padding
        if (ch.nonce().size() != nonce_bytes || ch.tag().size() != tag_bytes)
          return corruption(cw + ": its nonce or tag has the wrong size for " + index.encryption().mode());
      } else if (!ch.nonce().empty() || !ch.tag().empty()) {
        return corruption(cw + ": a nonce or tag in a checkpoint that is not encrypted");
      }
      if (!ch.content_hash().empty() && ch.content_hash().size() != internal_transform::kContentHashBytes)
        return corruption(cw + ": its content hash has " + std::to_string(ch.content_hash().size()) + " bytes");
      if (ch.length() != want)
        return corruption(cw + ": length " + std::to_string(ch.length()) + " != " + std::to_string(want) +
                          " bytes for box " + box.to_string());
      if (ch.file_id() >= static_cast<uint32_t>(index.files_size()))
        return corruption(cw + ": file id " + std::to_string(ch.file_id()) + " out of range");
      const auto& f = index.files(static_cast<int>(ch.file_id()));
      if (ch.byte_offset() > f.size() || ch.length() > f.size() - ch.byte_offset())
        return corruption(cw + ": bytes [" + std::to_string(ch.byte_offset()) + ", +" + std::to_string(ch.length()) +
                          ") run past the end of '" + f.name() + "' (" + std::to_string(f.size()) + " bytes)");
      if (box.num_elements() > 0) distinct.insert(box);
    }
    // Distinct chunks must tile the tensor: overlaps would let a gap pass a volume count.
    const std::string tiling = internal_layout::check_tiling({distinct.begin(), distinct.end()}, global);
    if (!tiling.empty()) return corruption(tw + ": chunks do not tile the tensor: " + tiling);
  }
  return Status();
}

}  // namespace distckpt::internal_format
