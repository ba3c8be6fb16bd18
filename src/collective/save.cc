// Sharded save: plan on rank 0, write unique slices in parallel, commit (commit.cc).
#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>

#include <openssl/crypto.h>

#include "comm/agree.h"
#include "distckpt/checkpoint.h"
#include "plan/save_plan.h"
#include "catalog/commit.h"
#include "base/guard.h"
#include "catalog/listing.h"
#include "collective/save_session.h"
#include "base/timer.h"
#include "format/native/index_io.h"
#include "storage/staging.h"
#include "storage/stream_writer.h"
#include "transform/crc32c.h"

namespace distckpt {

using internal_comm::agree;
using internal_plan::WriteItem;
using internal_runtime::rank_prefix;

namespace {

// Staging for direct-I/O saves: 4 slabs, so copying one overlaps writing others.
constexpr std::size_t kSyncStagingBytes = 32u << 20;

// Encrypts one chunk of `n` bytes at `data` and hands the stored bytes to `sink` in
// pieces; returns its tag. GCM keeps the length, CBC adds its padding at the end.
Result<std::string> seal_chunk(const internal_runtime::SaveSession& session, const WriteItem& item,
                               const std::string& tensor, const std::string& file, const void* data,
                               std::vector<char>& bounce, const std::function<Status(const char*, std::size_t)>& sink) {
  const auto& cipher = *session.cipher;
  constexpr std::size_t kPiece = 4 << 20;
  bounce.resize(kPiece + 32);
  DISTCKPT_ASSIGN_OR_RETURN(
      auto sealer, cipher.begin_seal(cipher.chunk_nonce(item.tensor, item.chunk),
                                     internal_transform::chunk_aad(tensor, item.chunk, file, item.byte_offset,
                                                                   item.stored_length, item.length)));
  const auto* p = static_cast<const char*>(data);
  for (uint64_t done = 0; done < item.length;) {
    const std::size_t n = static_cast<std::size_t>(std::min<uint64_t>(kPiece, item.length - done));
    std::size_t out = 0;
    DISTCKPT_RETURN_IF_ERROR(sealer.update(p + done, n, bounce.data(), &out));
    DISTCKPT_RETURN_IF_ERROR(sink(bounce.data(), out));
    done += n;
  }
  std::string tag;
  std::size_t out = 0;
  DISTCKPT_RETURN_IF_ERROR(sealer.finish(bounce.data(), &out, &tag));
  DISTCKPT_RETURN_IF_ERROR(sink(bounce.data(), out));
  return tag;
}

// Writes this rank's chunks into its data file and fsyncs it; returns each chunk's CRC32C.
// With direct I/O (when asked for and the file system allows it) the bytes stream
// through aligned staging slabs (storage/stream_writer.h); otherwise they go from the
// caller's buffers through the page cache, each 1 MiB piece checksummed just before it
// is written, while its bytes are still in cache. Encrypted chunks are encrypted on
// the way, and the CRC32C covers the bytes as stored.
Result<std::vector<uint32_t>> write_chunks(internal_runtime::SaveSession& session, const StateDict& state,
                                           const Comm& comm, uint64_t* bytes) {
  const std::vector<WriteItem>& items = session.mine;
  std::vector<uint32_t> crcs;
  if (items.empty()) return crcs;
  const std::string where = rank_prefix(comm);
  DISTCKPT_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, internal_runtime::open_data_file(session, comm));

  if (file->direct()) {
    internal_storage::StagingPool pool(kSyncStagingBytes, kSyncStagingBytes / 4);
    internal_storage::StreamWriter writer(std::move(file), pool, internal_runtime::chunk_ends(items),
                                          internal_runtime::data_file_path(session, comm), session.options.checksum);
    DISTCKPT_RETURN_IF_ERROR(internal_runtime::stage_chunks(writer, session, state, comm, bytes, &session.tags));
    auto done = writer.finish(session.options.fsync);
    if (!done.ok()) return done.status().with_context(where);
    return done;
  }

  constexpr uint64_t kPiece = 1 << 20;
  std::vector<char> bounce;
  const std::string file_name = internal_storage::data_file_name(comm.rank());
  for (const WriteItem& item : items) {
    const TensorEntry& e = state.tensors()[item.tensor];
    uint32_t crc = internal_transform::kCrc32cInit;
    uint64_t at = item.byte_offset;
    auto sink = [&](const char* p, std::size_t n) -> Status {
      for (std::size_t done = 0; done < n;) {
        const std::size_t piece = static_cast<std::size_t>(std::min<uint64_t>(kPiece, n - done));
        if (session.options.checksum) crc = internal_transform::crc32c_extend(crc, p + done, piece);
        DISTCKPT_RETURN_IF_ERROR(file->write_at(p + done, piece, at));
        at += piece;
        done += piece;
      }
      return Status();
    };
    Status st;
    if (session.cipher) {
      auto tag = seal_chunk(session, item, e.name, file_name, e.buffers[item.local_box], bounce, sink);
      if (tag.ok()) session.tags.push_back(std::move(*tag));
      st = tag.status();
    } else {
      st = sink(static_cast<const char*>(e.buffers[item.local_box]), item.length);
    }
    if (!st.ok()) return st.with_context(where + ": tensor '" + e.name + "'");
    crcs.push_back(internal_transform::crc32c_finish(crc));
    *bytes += item.stored_length;
  }
  if (session.options.fsync) DISTCKPT_RETURN_IF_ERROR(file->sync().with_context(where));
  DISTCKPT_RETURN_IF_ERROR(file->close().with_context(where));
  return crcs;
}

std::string encode_crcs(const std::vector<uint32_t>& crcs) {
  return std::string(reinterpret_cast<const char*>(crcs.data()), crcs.size() * sizeof(uint32_t));
}

}  // namespace

namespace internal_runtime {

// integrated_save.cc
Result<SaveResult> save_integrated(Comm& comm, const StateDict& state, const std::string& root,
                                   const SaveOptions& options);

std::string rank_prefix(const Comm& comm) { return "save: rank " + std::to_string(comm.rank()); }

std::string data_file_path(const SaveSession& session, const Comm& comm) {
  return session.tmp_dir + "/" + internal_storage::data_file_name(comm.rank());
}

Result<std::unique_ptr<WritableFile>> open_data_file(const SaveSession& session, const Comm& comm) {
  WriteOpenOptions open_options;
  open_options.direct_io = session.options.direct_io;
  auto file = session.fs->open_writable(data_file_path(session, comm), open_options);
  if (!file.ok()) return file.status().with_context(rank_prefix(comm));
  return file;
}

std::vector<uint64_t> chunk_ends(const std::vector<internal_plan::WriteItem>& items) {
  std::vector<uint64_t> ends;
  for (const auto& item : items) ends.push_back(item.byte_offset + item.stored_length);
  return ends;
}

Status stage_chunks(internal_storage::StreamWriter& writer, const SaveSession& session, const StateDict& state,
                    const Comm& comm, uint64_t* bytes, std::vector<std::string>* tags) {
  std::vector<char> bounce;
  const std::string file_name = internal_storage::data_file_name(comm.rank());
  for (const WriteItem& item : session.mine) {
    const TensorEntry& e = state.tensors()[item.tensor];
    Status st;
    if (session.cipher) {
      auto tag = seal_chunk(session, item, e.name, file_name, e.buffers[item.local_box], bounce,
                            [&](const char* p, std::size_t n) { return writer.append(p, n); });
      if (tag.ok()) tags->push_back(std::move(*tag));
      st = tag.status();
    } else {
      st = writer.append(e.buffers[item.local_box], item.length);
    }
    if (!st.ok()) return st.with_context(rank_prefix(comm) + ": tensor '" + e.name + "'");
    *bytes += item.stored_length;
  }
  return Status();
}

namespace {

struct Compared {
  bool failed = false;  // some rank's `local` was an error
  bool same = false;    // `words` are equal on every rank
};
// One allreduce: whether every rank succeeded, then min(x) and ~min(~x) = max(x) of each
// word, equal everywhere iff all ranks match. Every rank gets the same answer. `words`
// has the same length on every rank.
Compared compare_across_ranks(Comm& comm, const Status& local, const std::vector<int64_t>& words) {
  std::vector<int64_t> v{local.ok() ? 0 : -1};
  v.insert(v.end(), words.begin(), words.end());
  for (int64_t x : words) v.push_back(~x);
  comm.allreduce(v, ReduceOp::kMin);
  Compared c;
  c.failed = v[0] < 0;
  c.same = true;
  const std::size_t n = words.size();
  for (std::size_t i = 0; i < n; ++i) c.same = c.same && v[1 + i] == words[i] && ~v[1 + n + i] == words[i];
  return c;
}

}  // namespace

// Collective: every rank encrypts alike (mode and key), or none does; rank 0 draws the
// checkpoint's salt and every rank derives its cipher. The key itself never leaves a
// rank: ranks compare SHA-256 fingerprints of it.
Status agree_on_encryption(Comm& comm, const Encryption& enc, std::string* salt_out,
                           std::shared_ptr<const internal_transform::CheckpointCipher>* cipher_out) {
  std::vector<int64_t> mine(internal_plan::kFingerprintWords, 0);
  Status local = guarded(rank_prefix(comm) + ": encryption", [&]() -> Status {
    DISTCKPT_RETURN_IF_ERROR(enc.validate());
    if (!enc.enabled()) return Status();
    std::string check = "distckpt key check " + std::string(encryption_mode_name(enc.mode)) + " ";
    check.append(reinterpret_cast<const char*>(enc.key->data()), enc.key->size());
    auto words = internal_plan::fingerprint(check);
    OPENSSL_cleanse(check.data(), check.size());
    DISTCKPT_RETURN_IF_ERROR(words.status());
    mine = *words;
    mine.push_back(static_cast<int64_t>(enc.mode));
    return Status();
  });
  mine.resize(internal_plan::kFingerprintWords + 1, 0);
  const Compared compared = compare_across_ranks(comm, local, mine);
  if (compared.failed) return agree(comm, local);
  if (!compared.same)
    return agree(comm, invalid_argument("save: the ranks do not all encrypt with the same mode and key"));
  if (!enc.enabled()) return Status();
  if (comm.rank() == 0) {
    auto salt = internal_transform::CheckpointCipher::random_bytes(internal_transform::kSaltBytes);
    if (salt.ok()) *salt_out = *salt;
    else local = salt.status();
  }
  DISTCKPT_RETURN_IF_ERROR(agree(comm, local.with_context("save: rank 0")));
  comm.broadcast_string(*salt_out, 0);
  auto cipher = internal_transform::CheckpointCipher::create(enc.mode, *enc.key, *salt_out);
  if (cipher.ok()) *cipher_out = *cipher;
  return agree(comm, cipher.status().with_context(rank_prefix(comm)));
}

Status agree_on_state(Comm& comm, const StateDict& state) {
  std::string description;
  std::vector<int64_t> mine(internal_plan::kFingerprintWords, 0);
  Status local = guarded(rank_prefix(comm) + ": describe", [&]() -> Status {
    description = internal_plan::describe_state(state);
    DISTCKPT_ASSIGN_OR_RETURN(mine, internal_plan::fingerprint(description));
    return Status();
  });
  const Compared compared = compare_across_ranks(comm, local, mine);
  if (compared.failed) return agree(comm, local);  // every rank takes this branch
  if (compared.same) return Status();
  // They differ: the first rank whose fingerprint is not rank 0's sends its description,
  // so that rank 0 can name it, the tensor and how (O(tensors) bytes, whatever the world).
  const std::size_t n = mine.size();
  std::string zero(reinterpret_cast<const char*>(mine.data()), n * sizeof(int64_t));
  comm.broadcast_string(zero, 0);
  const bool differs = zero != std::string(reinterpret_cast<const char*>(mine.data()), n * sizeof(int64_t));
  const int first = static_cast<int>(comm.allreduce_one(differs ? comm.rank() : comm.size(), ReduceOp::kMin));
  local = invalid_argument("save: the ranks' state dicts differ");
  if (first < comm.size()) {
    std::string other = description;
    comm.broadcast_string(other, first);
    if (comm.rank() == 0) {
      Status why = guarded("save: rank 0: compare state dicts",
                           [&] { return internal_plan::explain_mismatch(description, other, first); });
      if (!why.ok()) local = why;
    }
  }
  return agree(comm, local);
}

Result<SaveSession> begin_save(Comm& comm, const StateDict& state, const std::string& root,
                               const SaveOptions& options) {
  Timer timer;
  SaveSession session;
  session.fs = options.fs ? options.fs : posix_filesystem();
  session.root = root;
  session.options = options;
  session.result.path = root + "/" + options.name;
  FileSystem& fs = *session.fs;
  const bool coordinator = comm.rank() == 0;

  // Local checks, agreed before anything touches the disk.
  Status local = internal_storage::validate_checkpoint_name(options.name);
  if (local.ok() && root.empty()) local = invalid_argument("empty root directory");
  if (local.ok() && state.rank() != comm.rank())
    local = invalid_argument("the state dict was built for rank " + std::to_string(state.rank()));
  DISTCKPT_RETURN_IF_ERROR(agree(comm, local.with_context(rank_prefix(comm))));

  // Plan: once the ranks agree that their state dicts match, rank 0 plans for all from
  // its own layouts (which give every rank's boxes): removes replicas, balances, lays
  // out files. Everything the index needs from `state` is taken now, so the caller may
  // change the state dict (not the tensor bytes) once the data is written or staged.
  DISTCKPT_RETURN_IF_ERROR(agree_on_state(comm, state));
  DISTCKPT_RETURN_IF_ERROR(agree_on_encryption(comm, options.encryption, &session.salt, &session.cipher));
  // Checksums are on unless every rank turned them off, so that the index never records
  // "crc32c" for a chunk whose writer computed none.
  session.options.checksum = comm.allreduce_one(options.checksum ? 1 : 0, ReduceOp::kMax) == 1;
  if (coordinator) {
    local = guarded("save: rank 0: plan", [&]() -> Status {
      DISTCKPT_ASSIGN_OR_RETURN(session.plan, internal_plan::plan_save(internal_plan::planned_tensors(state),
                                                                       comm.size(), options.remove_redundancy));
      if (session.cipher) internal_plan::apply_encryption(*session.cipher, &session.plan);
      proto::Index& index = session.plan.index;
      if (!session.options.checksum) index.mutable_transforms()->set_checksum("none");
      index.set_name(options.name);
      index.set_step(options.step);
      index.set_epoch(options.epoch);
      internal_storage::set_info_values(state.info(), &index);
      DISTCKPT_RETURN_IF_ERROR(fs.create_dirs(root).with_context("save: rank 0"));
      if (fs.exists(session.result.path))
        return already_exists("save: checkpoint '" + session.result.path + "' already exists");
      index.set_commit_seq(internal_runtime::next_commit_seq(fs, root));
      index.set_advances_latest(options.update_latest);
      session.tmp_dir = make_tmp_dir_name(root, options.name);
      return fs.create_dir(session.tmp_dir).with_context("save: rank 0");
    });
  }
  DISTCKPT_RETURN_IF_ERROR(agree(comm, local));
  comm.broadcast_string(session.tmp_dir, 0);
  std::vector<std::string> parts;
  if (coordinator)
    for (const auto& w : session.plan.writes) parts.push_back(internal_plan::encode_writes(w));
  // A bad write list is carried to the write agreement, never returned early.
  auto mine = internal_plan::decode_writes(comm.scatter(parts, 0));
  if (mine.ok()) session.mine = std::move(mine).value();
  else session.local_error = mine.status().with_context(rank_prefix(comm));
  for (const TensorEntry& e : state.tensors())
    session.result.bytes_unique +=
        static_cast<uint64_t>(full_box(e.layout.global_shape()).num_elements()) * dtype_size(e.dtype);
  session.result.plan_s = timer.seconds();
  return session;
}

Result<std::vector<uint32_t>> write_session(SaveSession& session, const StateDict& state, const Comm& comm,
                                            uint64_t* bytes) {
  if (!session.local_error.ok()) return session.local_error;
  return guarded(rank_prefix(comm) + ": write", [&] {
    return write_chunks(session, state, comm, bytes);
  });
}

Result<SaveResult> finish_save(Comm& comm, SaveSession& session, const Result<std::vector<uint32_t>>& crcs) {
  FileSystem& fs = *session.fs;
  SaveResult& result = session.result;
  const bool coordinator = comm.rank() == 0;
  internal_plan::SavePlan& plan = session.plan;

  // Protocol step 2: all agree that every writer wrote and fsynced its file.
  std::string mine_tags;
  for (const std::string& tag : session.tags) mine_tags += tag;
  std::vector<std::string> all_crcs = comm.gather(crcs.ok() ? encode_crcs(*crcs) : std::string(), 0);
  std::vector<std::string> all_tags = comm.gather(crcs.ok() ? mine_tags : std::string(), 0);
  Status written = agree(comm, crcs.status());
  if (!written.ok()) {
    if (coordinator) (void)fs.remove_all(session.tmp_dir);  // garbage; never visible under the final name
    return written;
  }

  // Commit (protocol steps 3-4) on rank 0, then agree (step 5).
  Timer commit_timer;
  int64_t index_bytes = 0;
  Status local;
  if (coordinator) {
    local = guarded("save: rank 0: commit", [&]() -> Status {
      for (std::size_t r = 0; r < plan.writes.size(); ++r) {
        if (all_crcs[r].size() != plan.writes[r].size() * sizeof(uint32_t))
          return internal_error("save: rank " + std::to_string(r) + " returned a wrong number of checksums");
        for (std::size_t i = 0; i < plan.writes[r].size(); ++i) {
          uint32_t crc;
          std::memcpy(&crc, all_crcs[r].data() + i * sizeof(uint32_t), sizeof(crc));
          const WriteItem& w = plan.writes[r][i];
          plan.index.mutable_tensors(static_cast<int>(w.tensor))->mutable_chunks(static_cast<int>(w.chunk))->set_crc32c(crc);
        }
        if (session.cipher) {
          const std::size_t tag_bytes = session.cipher->tag_bytes();
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
      plan.index.set_created_unix_ms(std::chrono::duration_cast<std::chrono::milliseconds>(
                                         std::chrono::system_clock::now().time_since_epoch())
                                         .count());
      if (session.cipher)  // last: the seal authenticates everything else in the index
        DISTCKPT_RETURN_IF_ERROR(internal_storage::seal_index(&plan.index, *session.cipher, session.salt));
      auto committed = commit_checkpoint(fs, session.root, session.tmp_dir, session.options.name, plan.index,
                                         session.options.fsync, session.options.update_latest);
      if (!committed.ok()) return committed.status().with_context("save: rank 0: commit");
      index_bytes = static_cast<int64_t>(committed->index_bytes);
      result.warning = committed->warning;
      return Status();
    });
    // Our tmp directory still exists unless the rename happened: remove it (garbage).
    if (!local.ok() && fs.exists(session.tmp_dir)) (void)fs.remove_all(session.tmp_dir);
  }
  DISTCKPT_RETURN_IF_ERROR(agree(comm, local));
  result.commit_s = commit_timer.seconds();
  comm.broadcast_string(result.warning, 0);

  std::vector<int64_t> sums{static_cast<int64_t>(result.rank_bytes_written), index_bytes};
  comm.allreduce(sums, ReduceOp::kSum);
  result.bytes_written = static_cast<uint64_t>(sums[0]);
  result.index_bytes = static_cast<uint64_t>(sums[1]);
  return result;
}

}  // namespace internal_runtime

Result<SaveResult> save(Comm& comm, const StateDict& state, const std::string& root, const SaveOptions& options) {
  // Every rank takes the same branch: save_integrated first agrees that the format
  // options match, and a native save with integrated=false on some ranks must not
  // wait for the others in another protocol.
  const int64_t integrated = options.format != Format::kNative || options.integrated ? 1 : 0;
  if (comm.allreduce_one(integrated, ReduceOp::kMax) == 1)
    return internal_runtime::save_integrated(comm, state, root, options);
  DISTCKPT_ASSIGN_OR_RETURN(internal_runtime::SaveSession session,
                            internal_runtime::begin_save(comm, state, root, options));
  // Protocol steps 1-2: write and fsync, then agree (in finish_save).
  internal_runtime::Timer write_timer;
  auto crcs = internal_runtime::write_session(session, state, comm, &session.result.rank_bytes_written);
  session.result.write_s = write_timer.seconds();
  return internal_runtime::finish_save(comm, session, crcs);
}

}  // namespace distckpt
