// Sharded load: rank 0 resolves the checkpoint and reads the index once; every rank
// parses and validates it, then reads only the chunks that overlap its boxes.
//
// Reads are buffered preads straight into the caller's buffers (no staging copy) when
// a stored chunk is exactly the needed box. Measured on 1 GiB files here: buffered
// cold reads 0.39-0.63 s, O_DIRECT into aligned staging + memcpy 0.85-1.23 s, so,
// unlike writes (storage/stream_writer.h), reads stay buffered.
#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <tuple>
#include <set>

#include "comm/agree.h"
#include "distckpt/checkpoint.h"
#include "format/stored.h"
#include "layout/region.h"
#include "plan/load_plan.h"
#include "plan/save_plan.h"
#include "base/guard.h"
#include "tools/reader.h"
#include "base/timer.h"
#include "format/native/index_io.h"
#include "transform/cipher.h"
#include "transform/crc32c.h"

namespace distckpt {

using internal_comm::agree;

namespace {

std::string shape_str(const Shape& s) { return full_box(s).to_string(); }

// Opens data files on demand, checking each one's real size against the index, and
// keeps at most kMaxOpen of them open (least recently used closed first): a checkpoint
// written by thousands of ranks must load under the usual limit of 1024 descriptors.
class FileCache {
 public:
  FileCache(FileSystem& fs, std::string dir, const proto::Index& index) : fs_(fs), dir_(std::move(dir)), index_(index) {}
  std::string path(uint32_t file_id) const { return dir_ + "/" + name(file_id); }
  const std::string& name(uint32_t file_id) const { return index_.files(static_cast<int>(file_id)).name(); }
  bool single_file() const { return !(index_.format().empty() || index_.format() == "native"); }
  Result<const ReadableFile*> get(uint32_t file_id) {
    ++clock_;
    auto it = open_.find(file_id);
    if (it != open_.end()) {
      it->second.last_use = clock_;
      return it->second.file.get();
    }
    const auto& meta = index_.files(static_cast<int>(file_id));
    const std::string file_path = path(file_id);
    auto file = fs_.open_readable(file_path);
    if (!file.ok()) {
      if (file.status().code() == StatusCode::kNotFound)
        return not_found("data file '" + file_path + "' is missing");
      return file.status();
    }
    DISTCKPT_ASSIGN_OR_RETURN(uint64_t size, (*file)->size());
    if (size != meta.size())
      return corruption("data file '" + file_path + "' has " + std::to_string(size) + " bytes, the index records " +
                        std::to_string(meta.size()) + (size < meta.size() ? " (truncated)" : ""));
    if (open_.size() >= kMaxOpen) {
      auto oldest = open_.begin();
      for (auto o = open_.begin(); o != open_.end(); ++o)
        if (o->second.last_use < oldest->second.last_use) oldest = o;
      open_.erase(oldest);
    }
    const ReadableFile* raw = file->get();
    open_.emplace(file_id, Open{std::move(*file), clock_});
    return raw;
  }

 private:
  static constexpr std::size_t kMaxOpen = 64;
  struct Open {
    std::unique_ptr<ReadableFile> file;
    uint64_t last_use;
  };
  FileSystem& fs_;
  std::string dir_;
  const proto::Index& index_;
  std::map<uint32_t, Open> open_;
  uint64_t clock_ = 0;
};

// Whether two global shapes differ only by trailing dims of size 1 ([12,2048,1,1] and
// [12,2048]): the same elements in the same row-major order. MindSpore accepts a
// checkpoint shape with extra trailing 1s (its _special_process_par, for GE's 4-D
// tensors); the other direction is the same bytes, so it is accepted too.
bool same_up_to_trailing_ones(const Shape& a, const Shape& b) {
  const Shape& longer = a.size() >= b.size() ? a : b;
  const Shape& shorter = a.size() >= b.size() ? b : a;
  if (!std::equal(shorter.begin(), shorter.end(), longer.begin())) return false;
  return std::all_of(longer.begin() + static_cast<std::ptrdiff_t>(shorter.size()), longer.end(),
                     [](int64_t d) { return d == 1; });
}

// Rewrites a stored tensor's shape and chunk boxes to `to` (same_up_to_trailing_ones):
// trailing dims of size 1 are dropped or added (offset 0, extent 1). A chunk whose
// dropped dim is not offset 0, extent 1 (an empty chunk, say) would change meaning.
Status reshape_trailing_ones(proto::Tensor& t, const Shape& to) {
  const int n = static_cast<int>(to.size());
  for (const proto::Chunk& c : t.chunks())
    for (int d = n; d < c.shape_size(); ++d)
      if (c.offset(d) != 0 || c.shape(d) != 1)
        return corruption("tensor '" + t.name() + "': a chunk of extent " + std::to_string(c.shape(d)) + " at " +
                          std::to_string(c.offset(d)) + " in dim " + std::to_string(d) +
                          " of size 1 cannot be reshaped");
  t.clear_global_shape();
  for (int64_t d : to) t.add_global_shape(d);
  for (proto::Chunk& c : *t.mutable_chunks()) {
    c.mutable_offset()->Truncate(std::min(n, c.offset_size()));
    c.mutable_shape()->Truncate(std::min(n, c.shape_size()));
    while (c.offset_size() < n) c.add_offset(0);
    while (c.shape_size() < n) c.add_shape(1);
  }
  return Status();
}

// Reads chunk `c` of `t` into `dst` (the box's bytes) and checks its CRC32C. The CRC of
// each piece is computed right after the piece is read, while it is still in cache.
// Encrypted chunks (`cipher`) are authenticated and decrypted first (an authentication
// error, kAuthFailed, names the chunk); their CRC32C covers the bytes as stored. CBC
// chunks are read into `scratch` (their padding does not fit `dst`).
Status read_chunk(FileCache& files, const proto::Tensor& t, int c, void* dst, bool check,
                  const internal_transform::CheckpointCipher* cipher, std::vector<char>& scratch) {
  const proto::Chunk& chunk = t.chunks(c);
  const std::string where = "tensor '" + t.name() + "': chunk " + std::to_string(c) + " of " +
                            files.path(chunk.file_id());
  DISTCKPT_ASSIGN_OR_RETURN(const ReadableFile* file, files.get(chunk.file_id()));
  char* p = static_cast<char*>(dst);
  if (cipher != nullptr && !cipher->length_preserving()) {
    scratch.resize(chunk.length());
    p = scratch.data();
  }
  constexpr uint64_t kPiece = 1 << 20;
  uint32_t state = internal_transform::kCrc32cInit;
  for (uint64_t done = 0; done < chunk.length();) {
    const uint64_t n = std::min(kPiece, chunk.length() - done);
    DISTCKPT_RETURN_IF_ERROR(file->read_at(p + done, n, chunk.byte_offset() + done).with_context(where));
    state = internal_transform::crc32c_extend(state, p + done, n);
    done += n;
  }
  if (cipher != nullptr)  // a single file's chunks are bound to their place in it, not to its name
    DISTCKPT_RETURN_IF_ERROR(internal_storage::open_chunk(
        *cipher, t, c, files.single_file() ? std::string() : files.name(chunk.file_id()), p, dst, where));
  const uint32_t crc = internal_transform::crc32c_finish(state);
  if (check && crc != chunk.crc32c()) return corruption(where + ": " + internal_transform::crc32c_mismatch(crc, chunk.crc32c()));
  return Status();
}

// Checks, without reading data, that the checkpoint covers every box of `e` and that
// the files those chunks live in exist with their recorded sizes.
Status check_sources(FileCache& files, const proto::Tensor& t, const internal_plan::ChunkLookup& lookup,
                     const TensorEntry& e) {
  for (const Box& needed : e.boxes) {
    if (needed.num_elements() == 0) continue;
    int64_t covered = 0;
    for (const auto& r : lookup.plan_reads(needed, &covered))
      DISTCKPT_RETURN_IF_ERROR(files.get(t.chunks(r.chunk).file_id()).status().with_context("tensor '" + t.name() + "'"));
    if (covered != needed.num_elements())
      return corruption("tensor '" + t.name() + "': the checkpoint covers " + std::to_string(covered) + " of the " +
                        std::to_string(needed.num_elements()) + " elements of box " + needed.to_string());
  }
  return Status();
}

// Reads `region` of a stored chunk (row-major box `cbox` at `offset` of `file`) into
// `dst` (row-major box `dbox`), reading only the bytes the region needs: one pread per
// contiguous run when runs are large; when they are small (a split on a trailing dim),
// whole slabs of the chunk's rows, at most kSlab bytes each, are read and the region is
// copied out (data sieving, as ROMIO does), trading some extra bytes for far fewer calls.
Status read_region(const ReadableFile& file, uint64_t offset, const Box& cbox, void* dst, const Box& dbox,
                   const Box& region, std::size_t item, std::vector<char>& scratch, uint64_t* bytes_read) {
  constexpr uint64_t kRunDirect = 4 << 10, kSlab = 8 << 20;
  const std::size_t n = region.shape.size();
  auto read_box = [&](const Box& part) -> Status {  // `part` is contiguous in the chunk
    const uint64_t bytes = static_cast<uint64_t>(part.num_elements()) * item;
    const uint64_t at = offset + static_cast<uint64_t>(internal_layout::first_element_offset(part, cbox)) * item;
    const Box want = intersect(part, region);
    *bytes_read += bytes;
    if (want == part) {
      if (auto off = internal_layout::contiguous_offset(part, dbox))
        return file.read_at(static_cast<char*>(dst) + *off * static_cast<int64_t>(item), bytes, at);
    }
    scratch.resize(bytes);
    DISTCKPT_RETURN_IF_ERROR(file.read_at(scratch.data(), bytes, at));
    copy_box(scratch.data(), part, dst, dbox, want, item);
    return Status();
  };
  if (n == 0) return read_box(region);
  std::size_t k = n - 1;  // dims >= k of a run are contiguous in the chunk
  while (k > 0 && region.shape[k] == cbox.shape[k]) --k;
  uint64_t run_bytes = item;
  for (std::size_t d = k; d < n; ++d) run_bytes *= static_cast<uint64_t>(region.shape[d]);
  uint64_t row_bytes = item;  // one index of dim 0 of the chunk: the smallest sieving slab
  for (std::size_t d = 1; d < n; ++d) row_bytes *= static_cast<uint64_t>(cbox.shape[d]);
  if (run_bytes >= kRunDirect || run_bytes == static_cast<uint64_t>(region.num_elements()) * item ||
      row_bytes > kSlab) {
    Box run = region;  // an odometer over dims < k: each step is one run
    for (std::size_t d = 0; d < k; ++d) run.shape[d] = 1;
    while (true) {
      DISTCKPT_RETURN_IF_ERROR(read_box(run));
      std::size_t d = k;
      for (; d > 0; --d) {
        if (++run.offset[d - 1] < region.offset[d - 1] + region.shape[d - 1]) break;
        run.offset[d - 1] = region.offset[d - 1];
      }
      if (d == 0) return Status();
    }
  }
  // Data sieving over slabs of whole rows (dim 0) of the chunk, at most kSlab bytes.
  const int64_t rows_per = static_cast<int64_t>(std::max<uint64_t>(1, kSlab / std::max<uint64_t>(row_bytes, 1)));
  for (int64_t r = region.offset[0]; r < region.offset[0] + region.shape[0]; r += rows_per) {
    Box slab = cbox;
    slab.offset[0] = r;
    slab.shape[0] = std::min(rows_per, region.offset[0] + region.shape[0] - r);
    DISTCKPT_RETURN_IF_ERROR(read_box(slab));
  }
  return Status();
}

// Fills box `b` of `e` from the chunks of `t` that overlap it. A chunk needed whole is
// read whole and its CRC32C checked; of a chunk needed in part only the bytes of the
// region are read (its CRC32C covers the whole chunk, so it is not checked), unless
// `check_partial` asks for whole chunks. Single-file formats have no per-chunk
// checksums (theirs cover whole tensors or the file: see check_file_crc32 and verify).
// Encrypted chunks (`cipher`) are always read whole and authenticated.
Status read_into(FileCache& files, const proto::Index& index, const proto::Tensor& t,
                 const internal_plan::ChunkLookup& lookup, const Box& needed, void* dst, std::vector<char>& scratch,
                 uint64_t* bytes_read, bool check_partial, const internal_transform::CheckpointCipher* cipher) {
  const std::size_t item = dtype_size(*dtype_from_name(t.dtype()));
  if (needed.num_elements() == 0) return Status();
  const bool native = index.format().empty() || index.format() == "native";
  const bool checksums = index.transforms().checksum() == "crc32c";
  int64_t covered = 0;
  const auto reads = lookup.plan_reads(needed, &covered);  // coverage checked in phase 1
  for (const auto& r : reads) {
    const proto::Chunk& chunk = t.chunks(r.chunk);
    if (r.whole) {
      DISTCKPT_RETURN_IF_ERROR(read_chunk(files, t, r.chunk, dst, checksums, cipher, scratch));
      *bytes_read += chunk.length();
    } else if (cipher != nullptr || (native && (check_partial || r.region == internal_plan::chunk_box(chunk)))) {
      const Box cbox = internal_plan::chunk_box(chunk);
      // The chunk whole in `scratch`, or (CBC) its plaintext in `cbc_plain`, since its
      // stored bytes then take `scratch`.
      std::vector<char> cbc_plain;
      char* whole = nullptr;
      if (cipher != nullptr && !cipher->length_preserving()) {
        cbc_plain.resize(static_cast<std::size_t>(cbox.num_elements()) * item);
        whole = cbc_plain.data();
      } else {
        scratch.resize(chunk.length());
        whole = scratch.data();
      }
      DISTCKPT_RETURN_IF_ERROR(read_chunk(files, t, r.chunk, whole, checksums, cipher, scratch));
      copy_box(whole, cbox, dst, needed, r.region, item);
      *bytes_read += chunk.length();
    } else {
      DISTCKPT_ASSIGN_OR_RETURN(const ReadableFile* file, files.get(chunk.file_id()));
      DISTCKPT_RETURN_IF_ERROR(read_region(*file, chunk.byte_offset(), internal_plan::chunk_box(chunk), dst,
                                           needed, r.region, item, scratch, bytes_read)
                                   .with_context("tensor '" + t.name() + "' in " + files.path(chunk.file_id())));
    }
  }
  return Status();
}

// Collective: checks a whole-file CRC-32 (MindSpore's .ckpt footer) with every rank
// reading an equal share of the covered bytes; rank 0 combines the shares.
Status check_file_crc32(Comm& comm, FileCache& files, const proto::Index& index, const std::string& where) {
  Status local;
  for (int f = 0; f < index.files_size(); ++f) {
    const auto& meta = index.files(f);
    if (meta.crc32_covered() == 0) continue;
    const uint64_t total = meta.crc32_covered(), P = static_cast<uint64_t>(comm.size());
    const uint64_t begin = total * static_cast<uint64_t>(comm.rank()) / P,
                   end = total * static_cast<uint64_t>(comm.rank() + 1) / P;
    uint32_t crc = 0;
    if (local.ok())
      local = internal_runtime::guarded(where, [&]() -> Status {
        DISTCKPT_ASSIGN_OR_RETURN(const ReadableFile* file, files.get(static_cast<uint32_t>(f)));
        std::vector<char> buf(std::min<uint64_t>(end - begin, 8 << 20));
        for (uint64_t at = begin; at < end;) {
          const uint64_t n = std::min<uint64_t>(buf.size(), end - at);
          DISTCKPT_RETURN_IF_ERROR(file->read_at(buf.data(), n, at));
          crc = internal_transform::crc32_zlib(crc, buf.data(), n);
          at += n;
        }
        return Status();
      });
    const std::string share(reinterpret_cast<const char*>(&crc), sizeof(crc));
    std::vector<std::string> shares = comm.gather(share, 0);
    if (comm.rank() == 0 && local.ok()) {
      uint32_t all = 0;
      for (uint64_t r = 0; r < P; ++r) {
        uint32_t part;
        std::memcpy(&part, shares[r].data(), sizeof(part));
        const uint64_t len = total * (r + 1) / P - total * r / P;
        all = r == 0 ? part : internal_transform::crc32_zlib_combine(all, part, len);
      }
      if (all != meta.crc32())
        local = corruption("'" + files.path(static_cast<uint32_t>(f)) + "': CRC-32 " +
                           internal_transform::crc32c_hex(all) + " != footer " +
                           internal_transform::crc32c_hex(meta.crc32()) + " (the file was modified or damaged)");
    }
  }
  return agree(comm, local);
}

// Collective: whether replicas may share reads. Every rank must want it (its options,
// and no buffer of its planned boxes used twice: tied weights would make a rank receive
// into a buffer it also sends from) and every rank must load the same tensors, with the
// same dtypes and layouts (rank lists and explicit boxes included), in the same order,
// so that each member of a replica group derives the same reader for each box. One
// allreduce decides, so all ranks take the same path.
bool may_share_reads(Comm& comm, const StateDict& state, const std::vector<std::pair<int, int>>& plan,
                     bool wanted) {
  std::string signature;
  std::set<void*> buffers;
  bool tied = false;
  for (const auto& [i, t] : plan) {
    const TensorEntry& e = state.tensors()[i];
    proto::Tensor described;  // compact: O(1) for a device-matrix layout over a contiguous group
    internal_plan::describe_tensor(internal_plan::PlannedTensor{e.name, e.dtype, &e.layout}, true, &described);
    signature += described.SerializeAsString();
    for (std::size_t b = 0; b < e.buffers.size(); ++b)
      if (e.boxes[b].num_elements() > 0 && !buffers.insert(e.buffers[b]).second) tied = true;
  }
  const auto h = static_cast<int64_t>(std::hash<std::string>{}(signature) >> 1);
  std::vector<int64_t> v{h, -h, wanted && !tied ? 1 : 0};
  comm.allreduce(v, ReduceOp::kMin);
  return v[2] == 1 && v[0] == h && -v[1] == h;
}

}  // namespace

namespace internal_runtime {

struct CheckpointReader::Impl {
  std::shared_ptr<FileSystem> fs;
  std::string dir;
  proto::Index index;
  std::unique_ptr<FileCache> files;
  std::vector<char> scratch;
  std::map<int, internal_plan::ChunkLookup> lookups;  // built on first use
  std::shared_ptr<const internal_transform::CheckpointCipher> cipher;  // encrypted sources
};

CheckpointReader::CheckpointReader() = default;
CheckpointReader::~CheckpointReader() = default;

Result<std::unique_ptr<CheckpointReader>> CheckpointReader::open(std::shared_ptr<FileSystem> fs, const std::string& path,
                                                                 const EncryptionKey* key) {
  std::unique_ptr<CheckpointReader> r(new CheckpointReader());
  r->impl_ = std::make_unique<Impl>();
  Impl& m = *r->impl_;
  m.fs = fs ? fs : posix_filesystem();
  DISTCKPT_ASSIGN_OR_RETURN(std::string resolved, resolve_checkpoint(path, m.fs));
  DISTCKPT_ASSIGN_OR_RETURN(m.index, internal_format::read_stored_index(*m.fs, resolved));
  DISTCKPT_ASSIGN_OR_RETURN(m.cipher, internal_storage::open_index(&m.index, key, resolved));
  m.dir = resolved;
  if (!(m.index.format().empty() || m.index.format() == "native")) {
    const auto slash = resolved.find_last_of('/');
    m.dir = slash == std::string::npos ? "." : resolved.substr(0, slash);
  }
  m.files = std::make_unique<FileCache>(*m.fs, m.dir, m.index);
  return r;
}

const proto::Index& CheckpointReader::index() const { return impl_->index; }

Status CheckpointReader::read(int tensor, const Box& region, void* dst, uint64_t* bytes_read) {
  const proto::Tensor& t = impl_->index.tensors(tensor);
  auto it = impl_->lookups.find(tensor);
  if (it == impl_->lookups.end()) it = impl_->lookups.emplace(tensor, internal_plan::ChunkLookup(t)).first;
  int64_t covered = 0;
  (void)it->second.plan_reads(region, &covered);
  if (covered != region.num_elements())
    return corruption("tensor '" + t.name() + "': the checkpoint does not cover " + region.to_string());
  return read_into(*impl_->files, impl_->index, t, it->second, region, dst, impl_->scratch, bytes_read,
                   /*check_partial=*/true, impl_->cipher.get());  // conversions check every chunk they read
}

}  // namespace internal_runtime

Result<LoadResult> load(Comm& comm, StateDict& state, const std::string& path, const LoadOptions& options) {
  internal_runtime::Timer timer;
  std::shared_ptr<FileSystem> fs = options.fs ? options.fs : posix_filesystem();
  const std::string where = "load: rank " + std::to_string(comm.rank());

  // Rank 0 resolves the path and reads the index; everyone gets the same bytes.
  std::string dir, index_bytes;
  Status local;
  if (comm.rank() == 0) {
    local = internal_runtime::guarded(where, [&]() -> Status {
      DISTCKPT_ASSIGN_OR_RETURN(dir, resolve_checkpoint(path, fs));
      const auto format = internal_format::detect_format(*fs, dir);
      if (format && *format != Format::kNative) {
        // A single file: rank 0 reads its structure and describes it as an index.
        DISTCKPT_ASSIGN_OR_RETURN(proto::Index described, internal_format::read_stored_index(*fs, dir));
        described.SerializeToString(&index_bytes);
        return Status();
      }
      // The header is checked against the file's size before the rest is read, so what
      // is broadcast is bounded by a real file; every rank then validates it alike.
      DISTCKPT_ASSIGN_OR_RETURN(index_bytes, internal_storage::read_index_bytes(*fs, dir));
      return Status();
    });
  }
  DISTCKPT_RETURN_IF_ERROR(agree(comm, local.with_context(where)));
  comm.broadcast_string(dir, 0);
  comm.broadcast_string(index_bytes, 0);

  // Phase 1, metadata only: every check that can fail on a well-formed checkpoint
  // (names, dtypes, shapes, coverage, files present with the recorded sizes) runs
  // before any byte lands in the caller's buffers, and ranks agree on it. Only a
  // checksum or chunk authentication error found while reading (phase 2) can leave
  // buffers partly written.
  LoadResult result;
  proto::Index index;
  std::vector<std::pair<int, int>> plan;  // (state-dict tensor, index tensor)
  std::map<int, internal_plan::ChunkLookup> lookups;  // by index tensor
  std::unique_ptr<FileCache> files;
  std::shared_ptr<const internal_transform::CheckpointCipher> cipher;
  local = internal_runtime::guarded(where, [&]() -> Status {
    const std::string source = dir;
    if (index_bytes.rfind("DCKPTIDX", 0) == 0) {
      DISTCKPT_ASSIGN_OR_RETURN(index, internal_storage::parse_index(index_bytes, dir + "/" + internal_storage::kIndexFileName));
    } else {
      if (!index.ParseFromString(index_bytes)) return internal_error("the description of '" + dir + "' does not parse");
      DISTCKPT_RETURN_IF_ERROR(internal_storage::validate_index(index, dir));
      // Files of a single-file checkpoint are named relative to its directory.
      const auto slash = dir.find_last_of('/');
      dir = slash == std::string::npos ? "." : dir.substr(0, slash);
    }
    DISTCKPT_ASSIGN_OR_RETURN(cipher, internal_storage::open_index(&index, options.key.get(), source));
    if (state.rank() != comm.rank())
      return invalid_argument("the state dict was built for rank " + std::to_string(state.rank()));
    std::map<std::string, int> stored;
    for (int i = 0; i < index.tensors_size(); ++i) stored[index.tensors(i).name()] = i;

    std::vector<int> wanted;
    if (options.only.empty()) {
      for (int i = 0; i < static_cast<int>(state.tensors().size()); ++i) wanted.push_back(i);
    } else {
      for (const auto& name : options.only) {
        const int i = state.find(name);
        if (i < 0) return invalid_argument("tensor '" + name + "' was asked for but is not in the state dict");
        wanted.push_back(i);
      }
    }
    std::set<std::string> asked;
    files = std::make_unique<FileCache>(*fs, dir, index);
    for (int i : wanted) {
      const TensorEntry& e = state.tensors()[i];
      asked.insert(e.name);
      auto it = stored.find(e.name);
      if (it == stored.end()) {
        if (options.strict) return mismatch("tensor '" + e.name + "' is not in checkpoint '" + dir + "'");
        result.missing_in_checkpoint.push_back(e.name);
        continue;
      }
      proto::Tensor& t = *index.mutable_tensors(it->second);
      if (t.dtype() != dtype_name(e.dtype))
        return mismatch("tensor '" + e.name + "': dtype " + std::string(dtype_name(e.dtype)) +
                        " in the state dict, " + t.dtype() + " in the checkpoint");
      const Shape stored_shape(t.global_shape().begin(), t.global_shape().end());
      if (stored_shape != e.layout.global_shape()) {
        if (!same_up_to_trailing_ones(stored_shape, e.layout.global_shape()))
          return mismatch("tensor '" + e.name + "': global shape " + shape_str(e.layout.global_shape()) +
                          " in the state dict, " + shape_str(stored_shape) + " in the checkpoint");
        DISTCKPT_RETURN_IF_ERROR(reshape_trailing_ones(t, e.layout.global_shape()));
      }
      auto lookup = lookups.emplace(it->second, internal_plan::ChunkLookup(t)).first;
      DISTCKPT_RETURN_IF_ERROR(check_sources(*files, t, lookup->second, e));
      plan.emplace_back(i, it->second);
    }
    for (const auto& t : index.tensors())
      if (!asked.count(t.name())) result.unexpected_in_checkpoint.push_back(t.name());
    return Status();
  });
  DISTCKPT_RETURN_IF_ERROR(agree(comm, local.with_context(where)));
  DISTCKPT_RETURN_IF_ERROR(check_file_crc32(comm, *files, index, where));

  // Phase 2: read what each box needs (checking the CRC32C of chunks read whole), copy it
  // into the buffers. With
  // shared reads, each box needed by several replicas is read by one of them (chosen
  // greedily by bytes within the replica group, the same choice on every member) and,
  // after all ranks agreed that every read succeeded, sent to the others.
  const bool wants_sharing =
      options.replica_reads == LoadOptions::ReplicaReads::kShared ||
      (options.replica_reads == LoadOptions::ReplicaReads::kAuto && comm.node_count() > 1);
  const bool share = comm.size() > 1 && may_share_reads(comm, state, plan, wants_sharing);
  std::vector<Comm::Transfer> sends, receives;
  internal_runtime::Timer read_timer;
  local = internal_runtime::guarded(where, [&]() -> Status {
    std::vector<char> scratch;
    internal_plan::ReplicaGroups groups(comm.rank());
    for (const auto& [i, t] : plan) {
      TensorEntry& e = state.mutable_tensors()[i];
      const int g = share && e.layout.group_index(comm.rank()) >= 0 ? groups.group_of(e.layout) : -1;
      static const std::vector<int> kAlone;
      const std::vector<int>& group = g >= 0 ? groups.members(g) : kAlone;
      const bool shared = group.size() > 1 && group.back() < comm.size();
      for (std::size_t b = 0; b < e.boxes.size(); ++b) {
        const uint64_t bytes = static_cast<uint64_t>(e.boxes[b].num_elements()) * dtype_size(e.dtype);
        int reader = comm.rank();
        if (shared && bytes > 0) reader = groups.pick_reader(g, bytes);
        if (reader == comm.rank()) {
          DISTCKPT_RETURN_IF_ERROR(read_into(*files, index, index.tensors(t), lookups.at(t), e.boxes[b],
                                             e.buffers[b], scratch, &result.rank_bytes_read,
                                             options.check_partial_chunks, cipher.get()));
          result.rank_bytes_needed += bytes;
          if (shared && bytes > 0)
            for (int member : group)
              if (member != comm.rank()) sends.push_back({member, e.buffers[b], bytes});
        } else {
          receives.push_back({reader, e.buffers[b], bytes});
        }
      }
      result.loaded.push_back(e.name);
    }
    result.step = index.step();
    result.epoch = index.epoch();
    result.info = internal_storage::info_values(index);
    return Status();
  });
  result.read_s = read_timer.seconds();
  DISTCKPT_RETURN_IF_ERROR(agree(comm, local.with_context(where)));
  // Every read succeeded everywhere, so every listed message will be sent.
  internal_runtime::Timer exchange_timer;
  if (share) comm.transfer(sends, receives);
  result.exchange_s = exchange_timer.seconds();
  std::vector<int64_t> totals{static_cast<int64_t>(result.rank_bytes_read), static_cast<int64_t>(result.rank_bytes_needed)};
  comm.allreduce(totals, ReduceOp::kSum);
  result.bytes_read = static_cast<uint64_t>(totals[0]);
  result.bytes_needed = static_cast<uint64_t>(totals[1]);
  result.load_s = timer.seconds();
  return result;
}

}  // namespace distckpt
