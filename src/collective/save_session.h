// The phases of a sharded save, shared by save() and the async saver:
//   begin_save   (collective) checks, plan on rank 0, tmp directory, write lists;
//   write        (local)      this rank's data file, fsynced (or staged, for async);
//   finish_save  (collective) agree on the writes, commit (commit.cc), agree.
// Each collective phase returns the same Status on every rank.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "distckpt/checkpoint.h"
#include "plan/save_plan.h"
#include "storage/stream_writer.h"
#include "transform/cipher.h"

namespace distckpt::internal_runtime {

struct SaveSession {
  std::shared_ptr<FileSystem> fs;
  std::string root;
  SaveOptions options;
  std::string tmp_dir;
  internal_plan::SavePlan plan;  // complete on rank 0 only
  std::vector<internal_plan::WriteItem> mine;
  Status local_error;  // a local failure of begin_save, reported by the write phase
  SaveResult result;
  // Encrypted saves: this checkpoint's cipher (same salt and key on every rank), and the
  // tags of this rank's chunks, in the order of `mine`, filled by the write.
  std::shared_ptr<const internal_transform::CheckpointCipher> cipher;
  std::string salt;
  std::vector<std::string> tags;
};

// Collective: every rank's state dict lists the same tensors, dtypes, shapes and layouts
// in the same order (so rank 0 can plan for all from its own). One allreduce of
// fingerprints decides; descriptions are gathered only to explain a mismatch. Errors,
// identical on all ranks: kInvalidArgument naming the first rank and tensor that differ.
Status agree_on_state(Comm& comm, const StateDict& state);

// Collective: every rank encrypts alike (mode, and a key compared by fingerprint) or
// none does; when encrypting, rank 0 draws the checkpoint's salt and every rank derives
// its cipher. Errors, identical on all ranks: kInvalidArgument (ranks differ, a mode
// without a key, a key the mode does not take), kInternal (OpenSSL).
Status agree_on_encryption(Comm& comm, const Encryption& encryption, std::string* salt,
                           std::shared_ptr<const internal_transform::CheckpointCipher>* cipher);

// Collective. Takes everything the index needs from `state` (names, layouts, info).
Result<SaveSession> begin_save(Comm& comm, const StateDict& state, const std::string& root,
                               const SaveOptions& options);
// Local: writes this rank's chunks from `state`'s buffers (encrypted when asked: their
// tags go to session.tags) and fsyncs; returns their CRCs.
Result<std::vector<uint32_t>> write_session(SaveSession& session, const StateDict& state, const Comm& comm,
                                            uint64_t* bytes);
// Collective. `crcs` is this rank's write outcome (an error still takes part).
Result<SaveResult> finish_save(Comm& comm, SaveSession& session, const Result<std::vector<uint32_t>>& crcs);

std::string rank_prefix(const Comm& comm);

// The I/O steps shared by the synchronous and the asynchronous write: this rank's data
// file (opened with direct I/O when asked for), the stream offsets where its chunks end,
// and the copy of its chunks into a stream writer.
std::string data_file_path(const SaveSession& session, const Comm& comm);
Result<std::unique_ptr<WritableFile>> open_data_file(const SaveSession& session, const Comm& comm);
std::vector<uint64_t> chunk_ends(const std::vector<internal_plan::WriteItem>& items);
// Encrypted sessions encrypt each chunk on its way into the stream and append its tag
// to `tags`.
Status stage_chunks(internal_storage::StreamWriter& writer, const SaveSession& session, const StateDict& state,
                    const Comm& comm, uint64_t* bytes, std::vector<std::string>* tags);

}  // namespace distckpt::internal_runtime
