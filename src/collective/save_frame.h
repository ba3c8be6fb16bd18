// The frame every save runs in, whatever writes the bytes (ADIOS2 keeps one file per
// write strategy of an engine; the strategies here share this frame):
//
//   open_save   (collective) the checks every rank makes, agreement that the state
//               dicts match and on encryption (one allreduce: agree_to_open), the plan
//               on rank 0, the index's common fields, the temporary entry in the root,
//               and rank 0's outcome sent to all (sharded: with each rank's write list,
//               in one scatter);
//   ...         the strategy writes (sharded: save.cc; gathered onto one writer:
//               save_gathered.cc; HDF5 hyperslabs: save_hdf5.cc; in the background:
//               async.cc);
//   close_save  (collective) agreement that every rank wrote, the commit on rank 0
//               (catalog/commit.cc), agreement on it, the warning and the sums.
//
// Each collective phase returns the same Status on every rank; after a failure the
// temporary entry is gone and nothing new is visible in the root.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "base/timer.h"
#include "catalog/commit.h"
#include "distckpt/checkpoint.h"
#include "format/format.h"
#include "plan/save_plan.h"
#include "transform/cipher.h"

namespace distckpt::internal_collective {

struct SaveFrame;

// Where a save's copies go and what it commits, when not a temporary entry in the root
// that rank 0 commits with the index (the local tier: a directory on every node, and a
// record in the root; tier/local_save.cc). open_save and close_save call it; the frame
// keeps the rest (checks, agreements, the plan, the scatter, the discard on failure).
struct EntrySeam {
  // Rank 0, after the plan: the entry's temporary name (checked against the root), sent
  // to every rank with the plan.
  std::function<Result<std::string>(SaveFrame&)> name;
  // Collective, once every rank holds the plan and the name: makes the entry and sets
  // frame.entry. Returns an agreed Status, having removed what it made after a failure.
  std::function<Status(Comm&, SaveFrame&, const std::string& name)> open;
  // Collective, right after the write agreement, whatever its outcome.
  std::function<void(Comm&, SaveFrame&)> after_write;
  // Collective, once every rank wrote: commits, and fills frame.result's commit figures
  // and sums. Returns an agreed Status, having removed what it made after a failure.
  std::function<Status(Comm&, SaveFrame&)> commit;
  // Every rank, after an agreed failure before the commit: removes what it made.
  std::function<void(const SaveFrame&)> discard;
};

struct SaveFrame {
  std::shared_ptr<FileSystem> fs;
  std::string root;
  SaveOptions options;  // `checksum` as the ranks agreed on it
  const internal_format::FormatDriver* format = nullptr;
  std::string name;  // the entry's name in the root (a single file's with its extension)
  // path, tmp and directory on every rank; commit_seq on rank 0.
  internal_catalog::Entry entry;
  // Encrypted saves: this checkpoint's cipher (same salt and key on every rank).
  std::shared_ptr<const internal_transform::CheckpointCipher> cipher;
  std::string salt;
  // Rank 0 only: the plan; its index is what the strategy commits (or, for a single
  // file, the metadata it writes into it).
  internal_plan::SavePlan plan;
  SaveResult result;
  internal_base::Timer timer;  // since open_save began
  // Incremental saves (collective/incremental.h): the base's name and index on rank 0
  // (name empty: no base); `incremental` on every rank once open_save agreed on it.
  bool incremental = false;
  std::string base_name;
  proto::Index base_index;
  // Rank 0: called by close_save as soon as the commit returned (whatever its outcome),
  // before the agreement that follows (an incremental save releases the references
  // lock there). May be null.
  std::function<void()> after_commit;
  // Sharded saves (FrameSpec::scatter_writes): this rank's write list, in file order, as
  // rank 0 planned it; or why rank 0's message could not be read (a bug), carried to the
  // write agreement rather than returned early.
  std::vector<internal_plan::WriteItem> my_writes;
  Status my_writes_error;
  // Where this node keeps files to overwrite (the local tier's spares,
  // storage/spare_files.h); empty: every data file is new.
  std::string spare_dir;
  // FrameSpec::seam, for close_save and agree_or_discard.
  std::shared_ptr<const EntrySeam> seam;
};

// What a write strategy adds to the frame.
struct FrameSpec {
  std::string name;     // the entry's name (validate_checkpoint_name)
  Status extra_checks;  // this rank's checks of the strategy's own options
  bool remove_redundancy = true;
  // Which holder writes a replicated slice (plan_save).
  internal_plan::WriterChoice writers = internal_plan::WriterChoice::kBalanced;
  // Checksums are on unless every rank turned them off (sharded saves, which compute
  // them), so that the index never records "crc32c" for a chunk nobody checksummed.
  bool agree_on_checksum = false;
  // Rank 0, after the plan and the common fields: makes plan.index what this strategy
  // commits. Null: the plan's index as it is.
  std::function<Status(SaveFrame&)> shape_index;
  // Whether this strategy can reference a base's chunks (SaveOptions::incremental):
  // sharded native saves only; the others refuse incremental (kInvalidArgument).
  bool references_allowed = false;
  // Whether rank 0 sends each rank its write list (frame.my_writes) with the plan's
  // outcome, in the one scatter that ends open_save (sharded saves).
  bool scatter_writes = false;
  // The format of the entry committed, when not the options' (a per-rank .ckpt set is
  // committed as a native directory).
  std::optional<Format> entry_format;
  // One copy of each slice per node (the local tier): plan_save's node_of. Null: one
  // copy in all.
  const std::vector<int>* node_of = nullptr;
  // Options of the strategy that must be the same on every rank, as words of the same
  // count everywhere, and what they are (for the message); agreed with the opening.
  std::vector<int64_t> same_words;
  std::string same_what;
  // Collective, after the opening's agreement and before the plan (the local tier: the
  // nodes' ids). Returns an agreed Status. May be null.
  std::function<Status(Comm&, SaveFrame&)> before_plan;
  // Whether every rank receives the planned index (frame.plan.index) after the scatter.
  bool share_index = false;
  // Where the copies go and what is committed; null: the root's temporary entry.
  std::shared_ptr<const EntrySeam> seam;
};

// Collective. See the top of this file. Errors: those of save() before writing
// (checkpoint.h), identical on every rank.
Result<SaveFrame> open_save(Comm& comm, const StateDict& state, const std::string& root, const SaveOptions& options,
                            const FrameSpec& spec);

// Collective: agrees on `local`; after a failure rank 0 removes the temporary entry (with
// a seam: every rank its part). Returns the agreed Status.
Status agree_or_discard(Comm& comm, const SaveFrame& frame, const Status& local);

// Collective. `written`: this rank's outcome of the write (an error still takes part).
// When every rank wrote, rank 0 commits: a directory with the index `final_index()`
// returns (called on rank 0 only; sealed when encrypted), a single file as written; with
// a seam, the seam commits (final_index unused).
Result<SaveResult> close_save(Comm& comm, SaveFrame& frame, const Status& written,
                              const std::function<Result<proto::Index>()>& final_index);

// What the opening of a save decides besides success (agree_to_open).
struct Opening {
  std::string name;          // the checkpoint's, for messages
  bool checksum = true;      // in: this rank's option; out: on unless every rank turned it off
  bool incremental = false;  // in: this rank's option; must be the same on every rank
  // in: more options that must be the same on every rank (the local tier's redundancy),
  // as words of the same count on every rank, and what they are, for the message.
  std::vector<int64_t> same_words;
  std::string same_what;
  // in: whether an encrypted save needs the checkpoint's cipher (salt and derived keys):
  // a native one; a .ckpt is encrypted with the key itself (MindSpore's framing).
  bool chunk_cipher = true;
};

// Collective, one allreduce (and, when encrypting, the salt's round): `checks` (this
// rank's own checks of its options), agree_on_state and agree_on_encryption's questions,
// and the flags of `opening`, asked together. Errors, identical on all ranks: the lowest
// failing rank's `checks` (or its failure to describe its state or read its key: with
// every question in one round, an invalid key on one rank is reported before state
// dicts that differ, where separate rounds reported the state first), then those of
// agree_on_state, agree_on_encryption, and kInvalidArgument for an incremental flag
// or same_words that differ.
Status agree_to_open(Comm& comm, const Status& checks, const StateDict& state, const Encryption& encryption,
                     Opening* opening, std::string* salt,
                     std::shared_ptr<const internal_transform::CheckpointCipher>* cipher);

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

// "save: rank N", the prefix of this rank's messages.
std::string rank_prefix(const Comm& comm);

}  // namespace distckpt::internal_collective
