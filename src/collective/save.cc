// Sharded save: every rank writes the unique slices the plan gives it into its own
// data file, in parallel; rank 0 commits the index (save_frame.h, catalog/commit.cc).
// Also save(), which picks the write strategy.
#include <algorithm>
#include <cstring>
#include <functional>

#include "base/guard.h"
#include "base/kill_point.h"
#include "base/timer.h"
#include "catalog/claims.h"
#include "catalog/references.h"
#include "collective/incremental.h"
#include "collective/save_session.h"
#include "collective/save_strategies.h"
#include "comm/agree.h"
#include "distckpt/checkpoint.h"
#include "format/format.h"
#include "format/native/index_codec.h"
#include "layout/strided.h"
#include "base/bounce.h"
#include "storage/spare_files.h"
#include "storage/staging.h"
#include "storage/stream_writer.h"
#include "storage/write_maps.h"
#include "transform/crc32c.h"

namespace distckpt {

namespace internal_collective {

using internal_base::guarded;
using internal_base::Timer;
using internal_comm::agree;
using internal_plan::WriteItem;

namespace {

// Staging for direct-I/O saves: up to 4 slabs (2 made up front, more as the copy gets
// ahead of the writes), so copying one overlaps writing others.
constexpr std::size_t kSyncStagingBytes = 32u << 20;

using Sink = std::function<Status(const char*, std::size_t)>;
using Gap = std::function<Status(std::size_t)>;  // writes this many zeros

// Pieces of a strided box are packed into a scratch buffer of this size on their way
// to the file (small enough to stay in cache until they are written).
constexpr std::size_t kPackPiece = 1 << 20;

// Encrypts one chunk (box `item.local_box` of `e`, packed) and hands the stored bytes to
// `sink` in pieces; returns its tag. GCM keeps the length, CBC adds its padding at the end.
Result<std::string> seal_chunk(const internal_transform::CheckpointCipher& cipher, const WriteItem& item,
                               const TensorEntry& e, const std::string& file, std::vector<char>& bounce,
                               std::vector<char>& scratch, const Sink& sink) {
  constexpr std::size_t kPiece = 4 << 20;
  bounce.resize(kPiece + 32);
  const std::string& tensor = e.name;
  DISTCKPT_ASSIGN_OR_RETURN(
      auto sealer, cipher.begin_seal(cipher.chunk_nonce(item.tensor, item.chunk),
                                     internal_transform::chunk_aad(tensor, item.chunk, file, item.byte_offset,
                                                                   item.stored_length, item.length)));
  for (uint64_t done = 0; done < item.length;) {
    const std::size_t n = static_cast<std::size_t>(std::min<uint64_t>(kPiece, item.length - done));
    std::size_t out = 0;
    const char* p = internal_layout::packed_piece(e, item.local_box, done, n, scratch);
    DISTCKPT_RETURN_IF_ERROR(sealer.update(p, n, bounce.data(), &out));
    DISTCKPT_RETURN_IF_ERROR(sink(bounce.data(), out));
    done += n;
  }
  std::string tag;
  std::size_t out = 0;
  DISTCKPT_RETURN_IF_ERROR(sealer.finish(bounce.data(), &out, &tag));
  DISTCKPT_RETURN_IF_ERROR(sink(bounce.data(), out));
  return tag;
}

// Hands this rank's chunks, in file order, to `sink` as they are stored (encrypted on
// the way when the save is: each tag goes to `tags`), and the gap before each chunk
// (kChunkAlignment) to `gap`; `chunk_done` after each chunk. The one loop behind both
// write paths.
Status emit_chunks(const SaveSession& session, const StateDict& state, const Comm& comm, const Sink& sink,
                   const Gap& gap, const std::function<void()>& chunk_done, uint64_t* bytes,
                   std::vector<std::string>* tags) {
  std::vector<char> bounce, scratch;
  const std::string file_name = internal_format::data_file_name(comm.rank());
  uint64_t at = 0;
  for (const WriteItem& item : session.mine) {
    const TensorEntry& e = state.tensors()[item.tensor];
    if (item.byte_offset < at)
      return internal_error(rank_prefix(comm) + ": tensor '" + e.name + "': chunk at byte " +
                            std::to_string(item.byte_offset) + " overlaps the one before it (ends at " +
                            std::to_string(at) + ")");
    if (item.byte_offset - at >= internal_format::kChunkAlignment)
      return internal_error(rank_prefix(comm) + ": tensor '" + e.name + "': chunk at byte " +
                            std::to_string(item.byte_offset) + " leaves a gap of " +
                            std::to_string(item.byte_offset - at) + " bytes after the one before it");
    Status st;
    if (item.byte_offset > at) st = gap(static_cast<std::size_t>(item.byte_offset - at));
    if (!st.ok()) return st.with_context(rank_prefix(comm) + ": tensor '" + e.name + "'");
    if (session.frame.cipher) {
      auto tag = seal_chunk(*session.frame.cipher, item, e, file_name, bounce, scratch, sink);
      if (tag.ok()) tags->push_back(std::move(*tag));
      st = tag.status();
    } else if (e.packed(item.local_box)) {
      st = sink(static_cast<const char*>(e.buffers[item.local_box]), item.length);
    } else {  // strided: packed a piece at a time, so the file, its CRC and hash see packed bytes
      for (uint64_t done = 0; st.ok() && done < item.length;) {
        const std::size_t n = static_cast<std::size_t>(std::min<uint64_t>(kPackPiece, item.length - done));
        st = sink(internal_layout::packed_piece(e, item.local_box, done, n, scratch), n);
        done += n;
      }
    }
    if (!st.ok()) return st.with_context(rank_prefix(comm) + ": tensor '" + e.name + "'");
    if (chunk_done) chunk_done();
    *bytes += item.stored_length;
    at = item.byte_offset + item.stored_length;
  }
  return Status();
}

// Writes this rank's chunks into its data file and fsyncs it; returns each chunk's CRC32C.
// With direct I/O (when asked for and the file system allows it) the bytes stream
// through aligned staging slabs (storage/stream_writer.h); otherwise they go from the
// caller's buffers through the page cache, each 1 MiB piece checksummed just before it
// is written, while its bytes are still in cache (a recycled file on a memory file
// system: copied into its mapping instead, 256 KiB at a time). Encrypted chunks are encrypted on
// the way, and the CRC32C covers the bytes as stored.
Result<std::vector<uint32_t>> write_chunks(SaveSession& session, const StateDict& state, const Comm& comm,
                                           uint64_t* bytes) {
  std::vector<uint32_t> crcs;
  if (session.mine.empty()) return crcs;
  const std::string where = rank_prefix(comm);
  const SaveOptions& options = session.frame.options;
  DISTCKPT_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, open_data_file(session, comm));

  if (file->direct()) {
    internal_storage::StagingPool pool(kSyncStagingBytes, kSyncStagingBytes / 4, /*grow=*/true,
                                       internal_storage::StagingPool::FirstTouch::kOnUse);
    internal_storage::StreamWriter writer(std::move(file), pool, chunk_ranges(session.mine),
                                          data_file_path(session, comm), options.checksum, /*hold=*/false,
                                          internal_storage::StreamWriter::ChecksumOn::kAppend);
    DISTCKPT_RETURN_IF_ERROR(stage_chunks(writer, session, state, comm, bytes, &session.tags));
    internal_base::kill_point("save-write");
    auto done = writer.finish(options.fsync);
    if (!done.ok()) return done.status().with_context(where);
    return done;
  }

  // A memory file system's recycled file is written through its mapping (a memcpy,
  // storage/write_maps.h), in pieces small enough to stay in cache between the CRC and
  // the copy; other files with pwrite, in such pieces too when it copies them into a
  // bounce buffer first (base/bounce.h).
  const uint64_t size = file_end(session.mine);
  DISTCKPT_ASSIGN_OR_RETURN(char* view, file->map_for_write(size));
  const uint64_t piece_bytes = view != nullptr || internal_base::bounce_io_for(size) ? 256 << 10 : 1 << 20;
  uint32_t crc = internal_transform::kCrc32cInit;
  uint64_t at = 0;
  auto sink = [&](const char* p, std::size_t n) -> Status {
    if (view != nullptr && n > size - at)
      return internal_error("write: more bytes than the file's " + std::to_string(size));
    for (std::size_t done = 0; done < n;) {
      const std::size_t piece = static_cast<std::size_t>(std::min<uint64_t>(piece_bytes, n - done));
      if (options.checksum) crc = internal_transform::crc32c_extend(crc, p + done, piece);
      if (view != nullptr) internal_storage::copy_into_mapping(view + at, p + done, piece);
      else DISTCKPT_RETURN_IF_ERROR(file->write_at(p + done, piece, at));
      at += piece;
      done += piece;
    }
    return Status();
  };
  auto gap = [&](std::size_t n) -> Status {  // n < kChunkAlignment (emit_chunks)
    if (n > size - at) return internal_error("write: a gap of " + std::to_string(n) + " bytes past the file's end");
    if (view != nullptr) std::memset(view + at, 0, n);  // a recycled file's old bytes go
    else DISTCKPT_RETURN_IF_ERROR(file->write_at(internal_format::kGapZeros, n, at));
    at += n;
    return Status();
  };
  auto chunk_done = [&] {
    crcs.push_back(internal_transform::crc32c_finish(crc));
    crc = internal_transform::kCrc32cInit;
  };
  DISTCKPT_RETURN_IF_ERROR(emit_chunks(session, state, comm, sink, gap, chunk_done, bytes, &session.tags));
  if (view != nullptr && at != size)  // a recycled file's old bytes must not stay in its tail
    return internal_error(where + ": wrote " + std::to_string(at) + " of the file's " + std::to_string(size) + " bytes");
  internal_base::kill_point("save-write");  // this rank's data written, not yet fsynced
  if (options.fsync) DISTCKPT_RETURN_IF_ERROR(file->sync().with_context(where));
  DISTCKPT_RETURN_IF_ERROR(file->close().with_context(where));
  return crcs;
}

std::string encode_crcs(const std::vector<uint32_t>& crcs) {
  return std::string(reinterpret_cast<const char*>(crcs.data()), crcs.size() * sizeof(uint32_t));
}

}  // namespace

std::string data_file_path(const SaveSession& session, const Comm& comm) {
  return session.frame.entry.tmp + "/" + internal_format::data_file_name(comm.rank());
}

Result<std::unique_ptr<WritableFile>> open_data_file(const SaveSession& session, const Comm& comm,
                                                    bool from_staging) {
  WriteOpenOptions open_options;
  open_options.direct_io = session.frame.options.direct_io;
  open_options.from_reused_buffers = from_staging;
  const std::string path = data_file_path(session, comm);
  FileSystem& fs = *session.frame.fs;
  // A spare file of this node, sized to this one: its pages are overwritten, not made.
  const uint64_t size = file_end(session.mine);
  if (!session.frame.spare_dir.empty() && size > 0 && internal_storage::take_spare(fs, session.frame.spare_dir, path, size)) {
    WriteOpenOptions keep = open_options;
    keep.truncate = false;
    keep.mappable = true;  // a recycled tmpfs file is written through a mapping
    auto file = fs.open_writable(path, keep);
    if (file.ok() && (*file)->truncate(size).ok()) return file;
    (void)fs.remove_file(path);  // unusable: a new file instead
  }
  auto file = fs.open_writable(path, open_options);
  if (!file.ok()) return file.status().with_context(rank_prefix(comm));
  return file;
}

std::vector<internal_storage::ByteRange> chunk_ranges(const std::vector<WriteItem>& items) {
  std::vector<internal_storage::ByteRange> ranges;
  for (const auto& item : items) ranges.push_back({item.byte_offset, item.byte_offset + item.stored_length});
  return ranges;
}

uint64_t file_end(const std::vector<WriteItem>& items) {
  return items.empty() ? 0 : items.back().byte_offset + items.back().stored_length;
}

Status stage_chunks(internal_storage::StreamWriter& writer, const SaveSession& session, const StateDict& state,
                    const Comm& comm, uint64_t* bytes, std::vector<std::string>* tags) {
  return emit_chunks(
      session, state, comm, [&](const char* p, std::size_t n) { return writer.append(p, n); },
      [&](std::size_t n) { return writer.append(internal_format::kGapZeros, n); },  // n < kChunkAlignment
      nullptr, bytes, tags);
}

Result<SaveSession> begin_save(Comm& comm, const StateDict& state, const std::string& root,
                               const SaveOptions& options) {
  return begin_planned_save(comm, state, root, options, sharded_spec(options));
}

FrameSpec sharded_spec(const SaveOptions& options) {
  FrameSpec spec;
  spec.name = options.name;
  spec.remove_redundancy = options.remove_redundancy;
  spec.agree_on_checksum = true;
  spec.references_allowed = true;
  spec.shape_index = [](SaveFrame& frame) -> Status {
    if (frame.cipher) internal_plan::apply_encryption(*frame.cipher, &frame.plan);
    if (!frame.options.checksum) frame.plan.index.mutable_transforms()->set_checksum("none");
    return Status();
  };
  return spec;
}

Result<SaveSession> begin_planned_save(Comm& comm, const StateDict& state, const std::string& root,
                                       const SaveOptions& options, const FrameSpec& spec) {
  SaveSession session;
  FrameSpec with_writes = spec;
  with_writes.scatter_writes = true;  // each rank's write list comes with the plan's outcome
  DISTCKPT_ASSIGN_OR_RETURN(session.frame, open_save(comm, state, root, options, with_writes));
  // A bad write list is carried to the write agreement, never returned early.
  session.mine = std::move(session.frame.my_writes);
  session.local_error = session.frame.my_writes_error;
  if (session.frame.incremental) apply_base(comm, session, state);
  session.frame.result.plan_s = session.frame.timer.seconds();
  return session;
}

Result<std::vector<uint32_t>> write_session(SaveSession& session, const StateDict& state, const Comm& comm,
                                            uint64_t* bytes) {
  if (!session.local_error.ok()) return session.local_error;
  return guarded(rank_prefix(comm) + ": write", [&] { return write_chunks(session, state, comm, bytes); });
}

Status fill_checksums(SaveFrame& frame, const std::vector<std::string>& all_crcs,
                      const std::vector<std::string>& all_tags) {
  internal_plan::SavePlan& plan = frame.plan;
  for (std::size_t r = 0; r < plan.writes.size(); ++r) {
    if (all_crcs[r].size() != plan.writes[r].size() * sizeof(uint32_t))
      return internal_error("save: rank " + std::to_string(r) + " returned a wrong number of checksums");
    for (std::size_t i = 0; i < plan.writes[r].size(); ++i) {
      uint32_t crc;
      std::memcpy(&crc, all_crcs[r].data() + i * sizeof(uint32_t), sizeof(crc));
      const WriteItem& w = plan.writes[r][i];
      plan.index.mutable_tensors(static_cast<int>(w.tensor))->mutable_chunks(static_cast<int>(w.chunk))->set_crc32c(crc);
    }
    if (frame.cipher) {
      const std::size_t tag_bytes = frame.cipher->tag_bytes();
      if (all_tags[r].size() != plan.writes[r].size() * tag_bytes)
        return internal_error("save: rank " + std::to_string(r) + " returned a wrong number of tags");
      for (std::size_t i = 0; i < plan.writes[r].size(); ++i) {
        const WriteItem& w = plan.writes[r][i];
        plan.index.mutable_tensors(static_cast<int>(w.tensor))
            ->mutable_chunks(static_cast<int>(w.chunk))
            ->set_tag(all_tags[r].substr(i * tag_bytes, tag_bytes));
      }
    }
  }
  return Status();
}

Result<SaveResult> finish_save(Comm& comm, SaveSession& session, const Result<std::vector<uint32_t>>& crcs) {
  std::string mine_tags;
  for (const std::string& tag : session.tags) mine_tags += tag;
  std::vector<std::string> all_crcs = comm.gather(crcs.ok() ? encode_crcs(*crcs) : std::string(), 0);
  std::vector<std::string> all_tags = comm.gather(crcs.ok() ? mine_tags : std::string(), 0);
  // Rank 0: the plan's index with every chunk's CRC32C (and tag) as its writer reported.
  const bool incremental = session.frame.incremental;
  std::vector<std::string> all_marks;
  if (incremental) all_marks = comm.gather(crcs.ok() ? session.marks : std::string(), 0);
  uint64_t referenced = 0;
  std::unique_ptr<internal_catalog::RootLock> references_lock;  // rank 0: held through the commit
  // The frame's callbacks below refer to `references_lock`: cleared however this returns.
  struct ClearCallbacks {
    SaveFrame& frame;
    ~ClearCallbacks() {
      frame.after_commit = nullptr;
      frame.entry.before_rename = nullptr;
    }
  } clear_callbacks{session.frame};
  auto final_index = [&]() -> Result<proto::Index> {
    if (!incremental) {
      DISTCKPT_RETURN_IF_ERROR(fill_checksums(session.frame, all_crcs, all_tags));
      return session.frame.plan.index;
    }
    SaveFrame& frame = session.frame;
    DISTCKPT_RETURN_IF_ERROR(fill_references(frame, all_crcs, all_marks, &referenced));
    internal_base::kill_point("save-references");
    // Under the references lock until the rename (catalog/references.h): no retirement
    // reads what is live between this check and the commit.
    if (!frame.base_name.empty()) {
      DISTCKPT_ASSIGN_OR_RETURN(references_lock, internal_catalog::lock_references(*frame.fs, frame.root));
      frame.after_commit = [&references_lock] { references_lock.reset(); };
      frame.entry.before_rename = [&references_lock] {
        return references_lock ? references_lock->still_held() : Status();
      };
      DISTCKPT_RETURN_IF_ERROR(check_references(*frame.fs, frame.root, frame.plan.index));
    }
    return frame.plan.index;
  };
  auto result = close_save(comm, session.frame, crcs.status(), final_index);
  references_lock.reset();  // (an error before the commit: still held here)
  session.frame.after_commit = nullptr;
  session.frame.entry.before_rename = nullptr;
  if (!incremental) return result;
  // Every rank took part in close_save: the figures rank 0 alone knows go to all.
  std::vector<int64_t> known{result.ok() ? static_cast<int64_t>(referenced) : 0};
  comm.allreduce(known, ReduceOp::kMax);
  std::string base = session.frame.base_name;
  comm.broadcast_string(base, 0);
  if (!result.ok()) return result;
  result->bytes_referenced = static_cast<uint64_t>(known[0]);
  result->incremental_base = base;
  return result;
}

}  // namespace internal_collective

Result<SaveResult> save(Comm& comm, const StateDict& state, const std::string& root, const SaveOptions& options) {
  using namespace internal_collective;
  // Every rank takes the same branch.
  DISTCKPT_RETURN_IF_ERROR(agree_save_shape(comm, state, options));
  if (options.format == Format::kSafetensors && options.integrated == false)
    return invalid_argument("save '" + options.name +
                            "': integrated=false with safetensors (a safetensors file holds whole tensors; per-rank "
                            "files are written for .ckpt)");
  switch (save_shape(options)) {
    case SaveShape::kOneFile:
    case SaveShape::kPerRankSet: {
      // Their writers take whole boxes: strided ones are packed into a copy first (extra
      // memory: this rank's strided bytes), agreed so that no rank is left in a gather.
      std::unique_ptr<internal_layout::PackedState> packed;
      Status copied = guarded(rank_prefix(comm) + ": packing strided tensors", [&]() -> Status {
        if (!internal_layout::has_strided(state)) return Status();
        DISTCKPT_ASSIGN_OR_RETURN(packed, internal_layout::pack_strided(state));
        return Status();
      });
      DISTCKPT_RETURN_IF_ERROR(agree(comm, copied));
      const StateDict& whole = packed ? packed->state : state;
      return save_shape(options) == SaveShape::kOneFile ? save_single_file(comm, whole, root, options)
                                                        : save_ckpt_set(comm, whole, root, options);
    }
    case SaveShape::kSharded: break;
  }
  DISTCKPT_ASSIGN_OR_RETURN(SaveSession session, begin_save(comm, state, root, options));
  // Protocol steps 1-2: write and fsync, then agree (in finish_save).
  Timer write_timer;
  auto crcs = write_session(session, state, comm, &session.frame.result.rank_bytes_written);
  session.frame.result.write_s = write_timer.seconds();
  return finish_save(comm, session, crcs);
}

}  // namespace distckpt
