#include "format/chunk_reader.h"

#include <algorithm>

#include "format/format.h"
#include "format/native/index_codec.h"
#include "format/native/sealing.h"
#include "layout/region.h"
#include "storage/direct_reader.h"
#include "storage/staging.h"
#include "transform/cipher.h"
#include "transform/crc32c.h"

namespace distckpt::internal_format {

Box chunk_box(const proto::Chunk& c) {
  return Box{Shape(c.offset().begin(), c.offset().end()), Shape(c.shape().begin(), c.shape().end())};
}

FileCache::FileCache(FileSystem& fs, std::string dir, const proto::Index& index)
    : fs_(fs),
      dir_(std::move(dir)),
      index_(index),
      single_file_(is_single_file(index)),
      inside_(fs, dir_),
      referenced_(fs, references_root(dir_)) {}

std::string FileCache::path(uint32_t file_id) const {
  return single_file_ ? dir_ + "/" + name(file_id) : data_file_location(index_, dir_, static_cast<int>(file_id));
}

std::string FileCache::identity_name(uint32_t file_id) const {
  return single_file_ ? std::string() : file_identity(name(file_id));
}

Status InsideCheck::check(const std::string& file_name) {
  const auto slash = file_name.find('/');
  if (slash == std::string::npos) return Status();
  if (!real_dirs_) {
    DISTCKPT_ASSIGN_OR_RETURN(std::vector<DirEntry> entries, fs_.list_dir(dir_));
    real_dirs_.emplace();
    for (const DirEntry& e : entries)
      if (e.is_dir) real_dirs_->insert(e.name);
  }
  const std::string sub = file_name.substr(0, slash);
  if (real_dirs_->count(sub)) return Status();
  return corruption("'" + dir_ + "/" + sub + "' is not a directory of the checkpoint (missing, or a symlink): its data "
                    "file '" + file_name + "' is not read");
}

Result<const ReadableFile*> FileCache::get(uint32_t file_id) {
  ++clock_;
  auto it = open_.find(file_id);
  if (it != open_.end()) {
    it->second.last_use = clock_;
    return it->second.file.get();
  }
  const auto& meta = index_.files(static_cast<int>(file_id));
  const std::string file_path = path(file_id);
  if (!single_file_ && meta.checkpoint().empty()) DISTCKPT_RETURN_IF_ERROR(inside_.check(meta.name()));
  if (!single_file_ && !meta.checkpoint().empty()) {
    DISTCKPT_RETURN_IF_ERROR(referenced_.check(meta.checkpoint() + "/" + meta.name()));
    // Once per referenced checkpoint: it is the one the reference was made to.
    auto known = identities_.find(meta.checkpoint());
    if (known == identities_.end())
      known = identities_.emplace(meta.checkpoint(), check_reference_identity(fs_, references_root(dir_), meta)).first;
    DISTCKPT_RETURN_IF_ERROR(known->second);
  }
  auto file = fs_.open_readable(file_path);
  if (!file.ok()) {
    if (file.status().code() == StatusCode::kNotFound)
      return not_found("data file '" + file_path + "' is missing" +
                       (meta.checkpoint().empty() ? "" : " (a file of checkpoint '" + meta.checkpoint() + "', which this one references)"));
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

Status read_chunk(const ReadableFile& file, const proto::Tensor& t, int c, void* dst, const ChunkCheck& check,
                  std::vector<char>& scratch) {
  const proto::Chunk& chunk = t.chunks(c);
  const auto* cipher = check.cipher;
  uint32_t state = internal_transform::kCrc32cInit;
  // Reads [at, at + n) of the chunk into `p`, extending the CRC32C.
  auto read_piece = [&](char* p, uint64_t at, uint64_t n) -> Status {
    DISTCKPT_RETURN_IF_ERROR(file.read_at(p, n, chunk.byte_offset() + at).with_context(check.where));
    state = internal_transform::crc32c_extend(state, p, n);
    return Status();
  };
  if (dst == nullptr && cipher == nullptr) {
    constexpr uint64_t kCheckPiece = 16 << 20;  // memory stays bounded whatever the index claims
    for (uint64_t done = 0; done < chunk.length();) {
      const uint64_t n = std::min(kCheckPiece, chunk.length() - done);
      scratch.resize(n);
      DISTCKPT_RETURN_IF_ERROR(read_piece(scratch.data(), done, n));
      done += n;
    }
  } else {
    // Stored bytes go to `dst` when they fit it; CBC's padding, or a chunk only checked,
    // goes through `scratch`.
    char* p = static_cast<char*>(dst);
    if (dst == nullptr || (cipher != nullptr && !cipher->length_preserving())) {
      scratch.resize(chunk.length());
      p = scratch.data();
    }
    constexpr uint64_t kPiece = 256 << 10;  // the CRC reads each piece from cache, just after its copy
    for (uint64_t done = 0; done < chunk.length();) {
      const uint64_t n = std::min(kPiece, chunk.length() - done);
      DISTCKPT_RETURN_IF_ERROR(read_piece(p + done, done, n));
      done += n;
    }
    if (cipher != nullptr)
      DISTCKPT_RETURN_IF_ERROR(open_chunk(*cipher, t, c, check.file_identity, p, dst != nullptr ? dst : p, check.where));
  }
  const uint32_t crc = internal_transform::crc32c_finish(state);
  if (check.crc && crc != chunk.crc32c())
    return corruption(check.where + ": " + internal_transform::crc32c_mismatch(crc, chunk.crc32c()));
  return Status();
}

namespace {

// read_chunk of a chunk of a cached file, named as load names it.
Status read_cached_chunk(FileCache& files, const proto::Tensor& t, int c, void* dst, bool crc,
                         const internal_transform::CheckpointCipher* cipher, std::vector<char>& scratch) {
  const proto::Chunk& chunk = t.chunks(c);
  ChunkCheck check;
  check.crc = crc;
  check.cipher = cipher;
  check.file_identity = files.identity_name(chunk.file_id());
  check.where = "tensor '" + t.name() + "': chunk " + std::to_string(c) + " of " + files.path(chunk.file_id());
  DISTCKPT_ASSIGN_OR_RETURN(const ReadableFile* file, files.get(chunk.file_id()));
  return read_chunk(*file, t, c, dst, check, scratch);
}

// Reads `region` of a stored chunk (row-major box `cbox` at `offset` of `file`) into
// `dst` (row-major box `dbox`), reading only the bytes the region needs: one pread per
// contiguous run when runs are large; when they are small (a split on a trailing dim),
// the runs are read exactly, batched (ReadableFile::read_batch: io_uring where allowed),
// each into its place when it is contiguous there; or, when `small` asks for sieving,
// whole slabs of the chunk's rows, at most kSlab bytes each, are read and the region is
// copied out (data sieving, as ROMIO does), trading extra bytes for far fewer calls.
Status read_region(const ReadableFile& file, uint64_t offset, const Box& cbox, void* dst, const Box& dbox,
                   const Box& region, std::size_t item, std::vector<char>& scratch, uint64_t* bytes_read,
                   SmallRuns* small) {
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
  // Calls `visit` on each run of the region in order (an odometer over dims < k).
  auto each_run = [&](const auto& visit) -> Status {
    Box run = region;
    for (std::size_t d = 0; d < k; ++d) run.shape[d] = 1;
    while (true) {
      DISTCKPT_RETURN_IF_ERROR(visit(run));
      std::size_t d = k;
      for (; d > 0; --d) {
        if (++run.offset[d - 1] < region.offset[d - 1] + region.shape[d - 1]) break;
        run.offset[d - 1] = region.offset[d - 1];
      }
      if (d == 0) return Status();
    }
  };
  if (run_bytes >= kRunDirect || run_bytes == static_cast<uint64_t>(region.num_elements()) * item ||
      row_bytes > kSlab)
    return each_run(read_box);
  if (small == nullptr || !small->sieve) {
    // Batched exact reads: at most kBatchRuns requests and kBatchScratch bytes of runs
    // that are not contiguous in `dst` (copied out of `scratch` after their batch).
    constexpr std::size_t kBatchRuns = 1024, kBatchScratch = 1 << 20;
    std::vector<ReadRequest> requests;
    struct Copy {
      std::size_t at;
      Box part;
    };
    std::vector<Copy> copies;
    std::size_t used = 0;
    auto flush = [&]() -> Status {
      DISTCKPT_RETURN_IF_ERROR(file.read_batch(requests));
      for (const Copy& c : copies) copy_box(scratch.data() + c.at, c.part, dst, dbox, c.part, item);
      if (small != nullptr) {
        small->runs += requests.size();
        small->method = file.batch_method();
      }
      requests.clear();
      copies.clear();
      used = 0;
      return Status();
    };
    DISTCKPT_RETURN_IF_ERROR(each_run([&](const Box& run) -> Status {  // each under 4 KiB
      const uint64_t at = offset + static_cast<uint64_t>(internal_layout::first_element_offset(run, cbox)) * item;
      *bytes_read += run_bytes;
      if (auto off = internal_layout::contiguous_offset(run, dbox)) {
        requests.push_back(ReadRequest{static_cast<char*>(dst) + *off * static_cast<int64_t>(item),
                                       static_cast<std::size_t>(run_bytes), at});
      } else {
        if (used + run_bytes > kBatchScratch) DISTCKPT_RETURN_IF_ERROR(flush());
        if (scratch.size() < kBatchScratch) scratch.resize(kBatchScratch);  // never during a batch
        requests.push_back(ReadRequest{scratch.data() + used, static_cast<std::size_t>(run_bytes), at});
        copies.push_back(Copy{used, run});
        used += static_cast<std::size_t>(run_bytes);
      }
      return requests.size() == kBatchRuns ? flush() : Status();
    }));
    return flush();
  }
  // Data sieving over slabs of whole rows (dim 0) of the chunk, at most kSlab bytes.
  if (small != nullptr) small->method = "sieving";
  const int64_t rows_per = static_cast<int64_t>(std::max<uint64_t>(1, kSlab / std::max<uint64_t>(row_bytes, 1)));
  for (int64_t r = region.offset[0]; r < region.offset[0] + region.shape[0]; r += rows_per) {
    Box slab = cbox;
    slab.offset[0] = r;
    slab.shape[0] = std::min(rows_per, region.offset[0] + region.shape[0] - r);
    DISTCKPT_RETURN_IF_ERROR(read_box(slab));
    if (small != nullptr) ++small->runs;
  }
  return Status();
}

}  // namespace

Status read_into(FileCache& files, const proto::Index& index, const proto::Tensor& t,
                 const std::vector<ChunkRead>& reads, const Box& needed, void* dst, std::vector<char>& scratch,
                 uint64_t* bytes_read, bool check_partial, const internal_transform::CheckpointCipher* cipher,
                 SmallRuns* small, GatheredReads* gathered) {
  const std::size_t item = dtype_size(*dtype_from_name(t.dtype()));
  if (needed.num_elements() == 0) return Status();
  const bool native = !is_single_file(index);
  const bool checksums = has_chunk_checksums(index);
  for (const auto& r : reads) {
    const proto::Chunk& chunk = t.chunks(r.chunk);
    if (r.whole) {
      if (gathered != nullptr && cipher == nullptr && chunk.length() > 0 &&
          gathered->reads_directly(files, chunk.file_id())) {
        gathered->add(t, r.chunk, static_cast<char*>(dst));
        *bytes_read += chunk.length();
        continue;
      }
      DISTCKPT_RETURN_IF_ERROR(read_cached_chunk(files, t, r.chunk, dst, checksums, cipher, scratch));
      *bytes_read += chunk.length();
    } else if (cipher != nullptr || ((native || checksums) && (check_partial || r.region == chunk_box(chunk)))) {
      const Box cbox = chunk_box(chunk);
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
      DISTCKPT_RETURN_IF_ERROR(read_cached_chunk(files, t, r.chunk, whole, checksums, cipher, scratch));
      copy_box(whole, cbox, dst, needed, r.region, item);
      *bytes_read += chunk.length();
    } else {
      DISTCKPT_ASSIGN_OR_RETURN(const ReadableFile* file, files.get(chunk.file_id()));
      DISTCKPT_RETURN_IF_ERROR(read_region(*file, chunk.byte_offset(), chunk_box(chunk), dst,
                                           needed, r.region, item, scratch, bytes_read, small)
                                   .with_context("tensor '" + t.name() + "' in " + files.path(chunk.file_id())));
    }
  }
  return Status();
}

bool GatheredReads::reads_directly(FileCache& files, uint32_t file_id) {
  auto known = direct_files_.find(file_id);
  if (known != direct_files_.end()) return known->second;
  bool direct = false;
  Result<const ReadableFile*> file = files.get(file_id);
  // A file mostly in the page cache (written through it moments ago) is read faster from
  // there, straight into the buffers.
  if (file.ok() && (*file)->can_read_direct()) direct = (*file)->cached_fraction() < 0.5;
  direct_files_.emplace(file_id, direct);
  return direct;
}

void GatheredReads::add(const proto::Tensor& t, int chunk, char* dst) {
  items_.push_back(Item{&t, chunk, dst, tag});
  bytes_ += t.chunks(chunk).length();
}

Status read_gathered(FileCache& files, GatheredReads& gathered, bool checksums,
                     const std::function<void(int64_t tag)>& on_read, const std::function<void()>& meanwhile,
                     uint64_t* direct_bytes) {
  std::vector<GatheredReads::Item> items = std::move(gathered.items_);
  gathered.items_.clear();
  gathered.bytes_ = 0;
  const auto chunk_of = [](const GatheredReads::Item& item) -> const proto::Chunk& {
    return item.tensor->chunks(item.chunk);
  };
  std::stable_sort(items.begin(), items.end(), [&](const auto& a, const auto& b) {
    const proto::Chunk &ca = chunk_of(a), &cb = chunk_of(b);
    return ca.file_id() != cb.file_id() ? ca.file_id() < cb.file_id() : ca.byte_offset() < cb.byte_offset();
  });
  std::vector<internal_storage::DirectRange> ranges;
  std::vector<const GatheredReads::Item*> of_range;
  std::vector<char> scratch;
  // One chunk through the page cache, as read_into reads those it does not gather.
  const auto read_plainly = [&](const GatheredReads::Item& item) -> Status {
    DISTCKPT_RETURN_IF_ERROR(read_cached_chunk(files, *item.tensor, item.chunk, item.dst, checksums, nullptr, scratch));
    if (on_read) on_read(item.tag);
    return Status();
  };
  for (const auto& item : items) {
    const proto::Chunk& c = chunk_of(item);
    // A chunk needed twice (two boxes of one rank) is read again the plain way: the
    // direct reader takes ranges that do not overlap.
    if (!ranges.empty() && ranges.back().file == c.file_id() && c.byte_offset() < ranges.back().offset + ranges.back().n) {
      DISTCKPT_RETURN_IF_ERROR(read_plainly(item));
      continue;
    }
    ranges.push_back(internal_storage::DirectRange{c.file_id(), c.byte_offset(), c.length(), item.dst});
    of_range.push_back(&item);
  }
  const auto name = [&](std::size_t r) {
    return "tensor '" + of_range[r]->tensor->name() + "': chunk " + std::to_string(of_range[r]->chunk) + " of " +
           files.path(chunk_of(*of_range[r]).file_id());
  };
  uint32_t state = internal_transform::kCrc32cInit;
  const auto check = [&](std::size_t r, uint64_t at, const char* piece, std::size_t n) -> Status {
    const proto::Chunk& c = chunk_of(*of_range[r]);
    if (checksums) {
      if (at == 0) state = internal_transform::kCrc32cInit;
      state = internal_transform::crc32c_extend(state, piece, n);
    }
    if (meanwhile) meanwhile();  // after the CRC, which reads the piece while it is in cache
    if (at + n < c.length()) return Status();
    if (checksums) {
      const uint32_t crc = internal_transform::crc32c_finish(state);
      if (crc != c.crc32c()) return corruption(name(r) + ": " + internal_transform::crc32c_mismatch(crc, c.crc32c()));
    }
    if (on_read) on_read(of_range[r]->tag);
    return Status();
  };
  if (ranges.empty()) return Status();
  // Only the reader thread uses `files` while the ranges are read.
  const auto open_file = [&](uint32_t file_id) { return files.get(file_id); };
  constexpr std::size_t kSlab = 8 << 20, kStaging = 4 * kSlab;
  std::unique_ptr<internal_storage::StagingPool> pool;
  try {
    pool = std::make_unique<internal_storage::StagingPool>(kStaging, kSlab, /*grow=*/true,
                                                           internal_storage::StagingPool::FirstTouch::kOnUse);
  } catch (const std::bad_alloc&) {
    for (const GatheredReads::Item* item : of_range) DISTCKPT_RETURN_IF_ERROR(read_plainly(*item));
    return Status();
  }
  return internal_storage::read_ranges(ranges, open_file, check, name, *pool, direct_bytes);
}

Result<uint32_t> file_crc32(const ReadableFile& file, uint64_t begin, uint64_t end) {
  uint32_t crc = 0;
  std::vector<char> buf(std::min<uint64_t>(end - begin, 8 << 20));
  for (uint64_t at = begin; at < end;) {
    const uint64_t n = std::min<uint64_t>(buf.size(), end - at);
    DISTCKPT_RETURN_IF_ERROR(file.read_at(buf.data(), n, at));
    crc = internal_transform::crc32_zlib(crc, buf.data(), n);
    at += n;
  }
  return crc;
}

}  // namespace distckpt::internal_format
