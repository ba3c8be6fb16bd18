#include "collective/save_frame.h"

#include <chrono>

#include <openssl/crypto.h>

#include "base/guard.h"
#include "base/test_seams.h"
#include "catalog/names.h"
#include "collective/incremental.h"
#include "comm/agree.h"
#include "format/ckpt/framed_file.h"
#include "format/native/sealing.h"
#include "catalog/object_root.h"
#include "storage/object_fs.h"

namespace distckpt::internal_collective {

using internal_base::guarded;
using internal_base::Timer;
using internal_comm::agree;

std::string rank_prefix(const Comm& comm) { return "save: rank " + std::to_string(comm.rank()); }

namespace {

constexpr const char* kDifferentKeys = "save: the ranks do not all encrypt with the same mode and key";

// This rank's side of agree_on_state: its description of the state and the fingerprint
// of that description.
struct StateVote {
  std::string description;
  std::vector<int64_t> words = std::vector<int64_t>(internal_plan::kFingerprintWords, 0);
};
Status vote_on_state(const Comm& comm, const StateDict& state, StateVote* vote) {
  Status local = guarded(rank_prefix(comm) + ": describe", [&]() -> Status {
    vote->description = internal_plan::describe_state(state);
    DISTCKPT_ASSIGN_OR_RETURN(vote->words, internal_plan::fingerprint(vote->description));
    return Status();
  });
  vote->words.resize(internal_plan::kFingerprintWords, 0);  // the allreduce needs one length everywhere
  return local;
}

// Collective, once the ranks found that their fingerprints differ (every rank calls it):
// the first rank whose fingerprint is not rank 0's sends its description, so that rank 0
// can name it, the tensor and how (O(tensors) bytes, whatever the world).
Status explain_state_mismatch(Comm& comm, const StateVote& vote) {
  const std::size_t n = vote.words.size();
  const auto* mine = reinterpret_cast<const char*>(vote.words.data());
  std::string zero(mine, n * sizeof(int64_t));
  comm.broadcast_string(zero, 0);
  const bool differs = zero != std::string(mine, n * sizeof(int64_t));
  const int first = static_cast<int>(comm.allreduce_one(differs ? comm.rank() : comm.size(), ReduceOp::kMin));
  Status local = invalid_argument("save: the ranks' state dicts differ");
  if (first < comm.size()) {
    std::string other = vote.description;
    comm.broadcast_string(other, first);
    if (comm.rank() == 0) {
      Status why = guarded("save: rank 0: compare state dicts",
                           [&] { return internal_plan::explain_mismatch(vote.description, other, first); });
      if (!why.ok()) local = why;
    }
  }
  return agree(comm, local);
}

// This rank's side of agree_on_encryption: the SHA-256 fingerprint of its key and its
// mode (zeros when it does not encrypt). The key itself never leaves the rank.
Status vote_on_encryption(const Comm& comm, const Encryption& enc, std::vector<int64_t>* words) {
  Status local = guarded(rank_prefix(comm) + ": encryption", [&]() -> Status {
    DISTCKPT_RETURN_IF_ERROR(enc.validate());
    if (!enc.enabled()) return Status();
    std::string check = "distckpt key check " + std::string(encryption_mode_name(enc.mode)) + " ";
    check.append(reinterpret_cast<const char*>(enc.key->data()), enc.key->size());
    auto fingerprint = internal_plan::fingerprint(check);
    OPENSSL_cleanse(check.data(), check.size());
    DISTCKPT_RETURN_IF_ERROR(fingerprint.status());
    *words = *fingerprint;
    words->resize(internal_plan::kFingerprintWords, 0);
    words->push_back(static_cast<int64_t>(enc.mode));
    return Status();
  });
  words->resize(internal_plan::kFingerprintWords + 1, 0);
  return local;
}

// Collective, once the ranks agreed to encrypt alike: rank 0 draws the checkpoint's salt
// and every rank derives its cipher.
Status share_salt(Comm& comm, const Encryption& enc, std::string* salt_out,
                  std::shared_ptr<const internal_transform::CheckpointCipher>* cipher_out) {
  Status local;
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

// Collective, one scatter: rank 0's outcome of the plan and, when it planned, the
// temporary entry's path and each rank's write list. Between the opening's agreement
// and this, only rank 0 works, so its outcome is everyone's: one message replaces an
// agreement, a broadcast and the scatter of the write lists. A message this rank cannot
// read (a bug) becomes frame->my_writes_error, reported by the write agreement.
// Part of rank r: rank 0's outcome (internal_comm::pack_outcome) with the entry's path,
// a NUL and the write list (internal_plan::encode_writes).
// With FrameSpec::share_index: rank 0's planned index to every rank (after a scatter
// that succeeded everywhere). A message that does not parse is carried to the write
// agreement, as a malformed write list is.
void share_planned_index(Comm& comm, SaveFrame* frame) {
  std::string bytes;
  if (comm.rank() == 0) frame->plan.index.SerializeToString(&bytes);
  comm.broadcast_string(bytes, 0);
  if (comm.rank() != 0 && !frame->plan.index.ParseFromString(bytes) && frame->my_writes_error.ok())
    frame->my_writes_error = internal_error(rank_prefix(comm) + ": the planned index from rank 0 does not parse");
}

Status scatter_plan(Comm& comm, const Status& planned, SaveFrame* frame) {
  std::vector<std::string> parts;
  if (comm.rank() == 0) {
    const auto& writes = frame->plan.writes;
    for (int r = 0; r < comm.size(); ++r) {
      const auto at = static_cast<std::size_t>(r);
      const std::string list = at < writes.size() ? internal_plan::encode_writes(writes[at]) : std::string();
      parts.push_back(internal_comm::pack_outcome(planned, frame->entry.tmp + '\0' + list));
    }
  }
  std::string mine;
  // Rank 0's error, the same on every rank.
  DISTCKPT_RETURN_IF_ERROR(internal_comm::unpack_outcome(comm.scatter(parts, 0), &mine));
  const std::size_t nul = mine.find('\0');
  if (nul == std::string::npos) {
    frame->my_writes_error = internal_error(rank_prefix(comm) + ": a malformed plan message from rank 0");
    return Status();
  }
  frame->entry.tmp = mine.substr(0, nul);
  auto writes = internal_plan::decode_writes(mine.substr(nul + 1));
  if (writes.ok()) frame->my_writes = std::move(writes).value();
  else frame->my_writes_error = writes.status().with_context(rank_prefix(comm));
  return Status();
}

}  // namespace

Status agree_on_encryption(Comm& comm, const Encryption& enc, std::string* salt_out,
                           std::shared_ptr<const internal_transform::CheckpointCipher>* cipher_out) {
  std::vector<int64_t> words;
  const Status local = vote_on_encryption(comm, enc, &words);
  const internal_comm::Compared compared = internal_comm::agree_same(comm, local, words);
  if (compared.failed) return agree(comm, local);
  if (!compared.same) return agree(comm, invalid_argument(kDifferentKeys));
  if (!enc.enabled()) return Status();
  return share_salt(comm, enc, salt_out, cipher_out);
}

Status agree_on_state(Comm& comm, const StateDict& state) {
  StateVote vote;
  const Status local = vote_on_state(comm, state, &vote);
  const internal_comm::Compared compared = internal_comm::agree_same(comm, local, vote.words);
  if (compared.failed) return agree(comm, local);  // every rank takes this branch
  if (compared.same) return Status();
  return explain_state_mismatch(comm, vote);
}

Status agree_to_open(Comm& comm, const Status& checks, const StateDict& state, const Encryption& encryption,
                     Opening* opening, std::string* salt,
                     std::shared_ptr<const internal_transform::CheckpointCipher>* cipher) {
  StateVote vote;  // both sized for the allreduce, even when a check fails first
  std::vector<int64_t> key(internal_plan::kFingerprintWords + 1, 0);
  Status local = checks;
  if (local.ok()) local = vote_on_state(comm, state, &vote);
  if (local.ok()) local = vote_on_encryption(comm, encryption, &key);
  std::vector<int64_t> words = vote.words;
  words.insert(words.end(), key.begin(), key.end());
  words.push_back(opening->incremental ? 1 : 0);
  words.insert(words.end(), opening->same_words.begin(), opening->same_words.end());
  const internal_comm::ComparedWords compared =
      internal_comm::agree_words(comm, local, words, {opening->checksum ? 1 : 0});
  // Every branch below is taken by every rank alike: they all hold the same `compared`.
  if (compared.failed) return agree(comm, local);
  const std::size_t state_end = vote.words.size(), key_end = state_end + key.size();
  if (!compared.all_same(0, state_end)) return explain_state_mismatch(comm, vote);
  if (!compared.all_same(state_end, key_end)) return invalid_argument(kDifferentKeys);
  if (!compared.same[key_end])
    return invalid_argument("save '" + opening->name + "': incremental must be the same on every rank");
  if (!compared.all_same(key_end + 1, words.size()))
    return invalid_argument("save '" + opening->name + "': " + opening->same_what + " must be the same on every rank");
  opening->checksum = compared.maxima[0] == 1;
  if (!encryption.enabled() || !opening->chunk_cipher) return Status();
  return share_salt(comm, encryption, salt, cipher);
}

Result<SaveFrame> open_save(Comm& comm, const StateDict& state, const std::string& root, const SaveOptions& options,
                            const FrameSpec& spec) {
  SaveFrame frame;
  // With its key, the save reads the root's encrypted .ckpt files (latest's commit number)
  // as their plaintext.
  frame.fs = internal_format::with_key(internal_storage::filesystem_for(root, options.fs),
                                       options.encryption.enabled() ? options.encryption.key.get() : nullptr);
  frame.root = root;
  frame.options = options;
  frame.format = &internal_format::driver(spec.entry_format.value_or(options.format));
  frame.name = spec.name;
  frame.result.path = root + "/" + spec.name;
  FileSystem& fs = *frame.fs;

  // Local checks, agreed before anything touches the disk.
  Status local = spec.extra_checks;
  if (local.ok()) local = internal_catalog::validate_checkpoint_name(spec.name);
  if (local.ok() && options.incremental && !spec.references_allowed)
    local = invalid_argument("incremental saves are sharded native checkpoints (not integrated, not another format)");
  // An object root holds sharded native checkpoints, each whole: a single file is committed
  // by a rename (which a store has not), a per-rank .ckpt set's files are named by rank, and
  // an incremental save's references would keep another checkpoint's objects alive.
  if (local.ok() && internal_catalog::is_object_root(root) &&
      (options.format != Format::kNative || spec.entry_format.has_value()))
    local = unsupported("'" + root + "' is an object root, which holds sharded native checkpoints only (save the " +
                        std::string(internal_format::driver(options.format).name) +
                        " checkpoint to a file system, or convert one from the root)");
  if (local.ok() && internal_catalog::is_object_root(root) && options.incremental)
    local = invalid_argument("'" + root + "' is an object root: incremental saves are not offered there (each "
                             "checkpoint of an object root is whole)");
  if (local.ok() && options.incremental && options.encryption.enabled())
    local = invalid_argument(
        "an incremental save cannot be encrypted: each checkpoint has its own keys (HKDF of its own salt), and a "
        "chunk referenced from another checkpoint is sealed with that one's");
  if (local.ok() && options.incremental && !options.checksum)
    local = invalid_argument("an incremental save needs checksums: a referenced chunk is checked by its CRC32C");
  if (local.ok() && options.incremental && !options.incremental_base.empty())
    local = internal_catalog::validate_checkpoint_name(options.incremental_base).with_context("incremental base");
  if (local.ok() && root.empty()) local = invalid_argument("empty root directory");
  if (local.ok() && state.rank() != comm.rank())
    local = invalid_argument("the state dict was built for rank " + std::to_string(state.rank()));

  // Plan: once the ranks agree that their state dicts match, rank 0 plans for all from
  // its own layouts (which give every rank's boxes): removes replicas, balances, lays
  // out files. Everything the index needs from `state` is taken now, so the caller may
  // change the state dict (not the tensor bytes) once the data is written or staged.
  // One allreduce agrees on the checks, the state, encryption and the flags below.
  Opening opening;
  opening.name = spec.name;
  opening.checksum = options.checksum;
  opening.incremental = options.incremental;
  opening.chunk_cipher = frame.format->id != Format::kCkpt;
  opening.same_words = spec.same_words;
  opening.same_what = spec.same_what;
  DISTCKPT_RETURN_IF_ERROR(agree_to_open(comm, local.with_context(rank_prefix(comm)), state, options.encryption,
                                         &opening, &frame.salt, &frame.cipher));
  frame.seam = spec.seam;
  if (spec.before_plan) DISTCKPT_RETURN_IF_ERROR(spec.before_plan(comm, frame));
  // Checksums are on unless every rank turned them off; incremental is every rank's
  // alike (the base is rank 0's to choose).
  if (spec.agree_on_checksum) frame.options.checksum = opening.checksum;
  frame.incremental = opening.incremental;
  std::string seam_name;  // rank 0, with a seam: the entry's name, sent as the tmp entry is
  if (comm.rank() == 0) {
    local = guarded("save: rank 0: plan", [&]() -> Status {
      DISTCKPT_ASSIGN_OR_RETURN(frame.plan, internal_plan::plan_save(internal_plan::planned_tensors(state), comm.size(),
                                                                     spec.remove_redundancy, spec.node_of, spec.writers));
      proto::Index& index = frame.plan.index;
      index.set_name(spec.name);
      index.set_step(options.step);
      index.set_epoch(options.epoch);
      internal_format::set_info_values(state.info(), &index);
      if (spec.shape_index) DISTCKPT_RETURN_IF_ERROR(spec.shape_index(frame));
      if (spec.seam) {
        DISTCKPT_ASSIGN_OR_RETURN(seam_name, spec.seam->name(frame));
      } else {
        DISTCKPT_ASSIGN_OR_RETURN(frame.entry, internal_catalog::begin_entry(fs, root, spec.name,
                                                                             !frame.format->single_file,
                                                                             "save: rank 0", frame.fs));
      }
      frame.plan.index.set_commit_seq(frame.entry.commit_seq);
      frame.plan.index.set_advances_latest(options.update_latest);
      frame.plan.index.set_created_unix_ms(internal_base::wall_clock_ms());
      frame.plan.index.set_writer_version(version());
      if (frame.incremental) DISTCKPT_RETURN_IF_ERROR(prepare_base(frame));
      return Status();
    });
    // An exception after the tmp entry was made: it goes.
    if (!local.ok() && !frame.entry.tmp.empty() && fs.exists(frame.entry.tmp)) discard_entry(fs, frame.entry);
    if (local.ok() && spec.seam) frame.entry.tmp = seam_name;  // what the ranks receive
  }
  if (spec.scatter_writes) {
    DISTCKPT_RETURN_IF_ERROR(scatter_plan(comm, local, &frame));
  } else {
    DISTCKPT_RETURN_IF_ERROR(agree(comm, local));
    comm.broadcast_string(frame.entry.tmp, 0);
  }
  if (spec.share_index) share_planned_index(comm, &frame);
  frame.entry.root = root;
  frame.entry.name = spec.name;
  frame.entry.path = frame.result.path;
  frame.entry.directory = !frame.format->single_file;
  if (spec.seam) {
    seam_name = frame.entry.tmp;
    frame.entry.tmp.clear();  // the seam makes the entry
    DISTCKPT_RETURN_IF_ERROR(spec.seam->open(comm, frame, seam_name));
  }
  for (const TensorEntry& e : state.tensors())
    frame.result.bytes_unique +=
        static_cast<uint64_t>(full_box(e.layout.global_shape()).num_elements()) * dtype_size(e.dtype);
  frame.result.plan_s = frame.timer.seconds();
  return frame;
}

Status agree_or_discard(Comm& comm, const SaveFrame& frame, const Status& local) {
  Status agreed = agree(comm, local);
  // Garbage: never visible under the final name.
  if (!agreed.ok() && frame.seam) frame.seam->discard(frame);
  else if (!agreed.ok() && comm.rank() == 0) discard_entry(*frame.fs, frame.entry);
  return agreed;
}

Result<SaveResult> close_save(Comm& comm, SaveFrame& frame, const Status& written,
                              const std::function<Result<proto::Index>()>& final_index) {
  if (frame.seam) {
    // Protocol step 2 as below, then the seam's commit.
    Status agreed = agree(comm, written);
    if (frame.seam->after_write) frame.seam->after_write(comm, frame);
    if (!agreed.ok()) {
      frame.seam->discard(frame);
      return agreed;
    }
    DISTCKPT_RETURN_IF_ERROR(frame.seam->commit(comm, frame));
    return frame.result;
  }
  // Protocol step 2: all agree that every writer wrote and fsynced its files.
  DISTCKPT_RETURN_IF_ERROR(agree_or_discard(comm, frame, written));

  // Commit (protocol steps 3-4) on rank 0, then agree (step 5).
  Timer commit_timer;
  SaveResult& result = frame.result;
  int64_t index_bytes = 0;
  Status local;
  if (comm.rank() == 0) {
    local = guarded("save: rank 0: commit", [&]() -> Status {
      proto::Index index;
      if (frame.entry.directory) {
        DISTCKPT_ASSIGN_OR_RETURN(index, final_index());
        internal_catalog::name_files_under_entry(frame.entry, &index);  // an object root's save prefix
        index.set_created_unix_ms(internal_base::wall_clock_ms());
        if (frame.cipher)  // last: the seal authenticates everything else in the index
          DISTCKPT_RETURN_IF_ERROR(internal_format::seal_index(&index, *frame.cipher, frame.salt));
      }
      auto committed = internal_catalog::finish_entry(*frame.fs, frame.entry, frame.entry.directory ? &index : nullptr,
                                                      frame.options.fsync, frame.options.update_latest);
      if (frame.after_commit) frame.after_commit();
      if (!committed.ok()) return committed.status().with_context("save: rank 0: commit");
      index_bytes = static_cast<int64_t>(committed->index_bytes);
      if (!committed->warning.empty()) result.warning += (result.warning.empty() ? "" : "; ") + committed->warning;
      return Status();
    });
    // Our tmp entry still exists unless the rename happened: remove it (garbage). An object
    // root's commit decides that itself (its save prefix outlives the commit).
    if (!local.ok() && frame.entry.data_dir.empty() && frame.fs->exists(frame.entry.tmp))
      discard_entry(*frame.fs, frame.entry);
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

}  // namespace distckpt::internal_collective
