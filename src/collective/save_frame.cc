#include "collective/save_frame.h"

#include <chrono>

#include <openssl/crypto.h>

#include "base/guard.h"
#include "catalog/names.h"
#include "collective/incremental.h"
#include "comm/agree.h"
#include "format/native/sealing.h"

namespace distckpt::internal_collective {

using internal_base::guarded;
using internal_base::Timer;
using internal_comm::agree;

namespace {

int64_t now_unix_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

std::string rank_prefix(const Comm& comm) { return "save: rank " + std::to_string(comm.rank()); }

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
  const internal_comm::Compared compared = internal_comm::agree_same(comm, local, mine);
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
  const internal_comm::Compared compared = internal_comm::agree_same(comm, local, mine);
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

Result<SaveFrame> open_save(Comm& comm, const StateDict& state, const std::string& root, const SaveOptions& options,
                            const FrameSpec& spec) {
  SaveFrame frame;
  frame.fs = options.fs ? options.fs : posix_filesystem();
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
  DISTCKPT_RETURN_IF_ERROR(agree(comm, local.with_context(rank_prefix(comm))));

  // Plan: once the ranks agree that their state dicts match, rank 0 plans for all from
  // its own layouts (which give every rank's boxes): removes replicas, balances, lays
  // out files. Everything the index needs from `state` is taken now, so the caller may
  // change the state dict (not the tensor bytes) once the data is written or staged.
  DISTCKPT_RETURN_IF_ERROR(agree_on_state(comm, state));
  DISTCKPT_RETURN_IF_ERROR(agree_on_encryption(comm, options.encryption, &frame.salt, &frame.cipher));
  if (spec.agree_on_checksum)
    frame.options.checksum = comm.allreduce_one(options.checksum ? 1 : 0, ReduceOp::kMax) == 1;
  // Incremental or not, on every rank alike (the base is rank 0's to choose).
  std::vector<int64_t> incremental{options.incremental ? 1 : 0, options.incremental ? -1 : 0};
  comm.allreduce(incremental, ReduceOp::kMax);
  if (incremental[0] != -incremental[1])
    return invalid_argument("save '" + spec.name + "': incremental must be the same on every rank");
  frame.incremental = incremental[0] == 1;
  if (comm.rank() == 0) {
    local = guarded("save: rank 0: plan", [&]() -> Status {
      DISTCKPT_ASSIGN_OR_RETURN(frame.plan, internal_plan::plan_save(internal_plan::planned_tensors(state), comm.size(),
                                                                     spec.remove_redundancy));
      proto::Index& index = frame.plan.index;
      index.set_name(spec.name);
      index.set_step(options.step);
      index.set_epoch(options.epoch);
      internal_format::set_info_values(state.info(), &index);
      if (spec.shape_index) DISTCKPT_RETURN_IF_ERROR(spec.shape_index(frame));
      DISTCKPT_ASSIGN_OR_RETURN(frame.entry, internal_catalog::begin_entry(fs, root, spec.name,
                                                                           !frame.format->single_file, "save: rank 0",
                                                                           frame.fs));
      frame.plan.index.set_commit_seq(frame.entry.commit_seq);
      frame.plan.index.set_advances_latest(options.update_latest);
      frame.plan.index.set_created_unix_ms(now_unix_ms());
      if (frame.incremental) DISTCKPT_RETURN_IF_ERROR(prepare_base(frame));
      return Status();
    });
    // An exception after the tmp entry was made: it goes.
    if (!local.ok() && !frame.entry.tmp.empty() && fs.exists(frame.entry.tmp)) discard_entry(fs, frame.entry);
  }
  DISTCKPT_RETURN_IF_ERROR(agree(comm, local));
  comm.broadcast_string(frame.entry.tmp, 0);
  frame.entry.root = root;
  frame.entry.name = spec.name;
  frame.entry.path = frame.result.path;
  frame.entry.directory = !frame.format->single_file;
  for (const TensorEntry& e : state.tensors())
    frame.result.bytes_unique +=
        static_cast<uint64_t>(full_box(e.layout.global_shape()).num_elements()) * dtype_size(e.dtype);
  frame.result.plan_s = frame.timer.seconds();
  return frame;
}

Status agree_or_discard(Comm& comm, const SaveFrame& frame, const Status& local) {
  Status agreed = agree(comm, local);
  // Garbage: never visible under the final name.
  if (!agreed.ok() && comm.rank() == 0) discard_entry(*frame.fs, frame.entry);
  return agreed;
}

Result<SaveResult> close_save(Comm& comm, SaveFrame& frame, const Status& written,
                              const std::function<Result<proto::Index>()>& final_index) {
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
        index.set_created_unix_ms(now_unix_ms());
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
    // Our tmp entry still exists unless the rename happened: remove it (garbage).
    if (!local.ok() && frame.fs->exists(frame.entry.tmp)) discard_entry(*frame.fs, frame.entry);
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
