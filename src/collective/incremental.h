// Incremental saves (SaveOptions::incremental): unchanged chunks are referenced, not
// written again. The sharded save's phases gain three steps:
//
//   open_save    (rank 0) prepare_base: the base is read; the files its chunks live in
//                are listed in the temporary entry's references file before anyone
//                writes; then the base must still be committed (catalog/references.h
//                says why that order makes retirement safe), else the save has no base;
//   begin_save   (collective) apply_base: every rank hashes its chunks (XXH3-128) and
//                keeps in its write list only those the base does not hold with the same
//                tensor, dtype, box, length and hash; the rest of the file moves up;
//   finish_save  (rank 0) fill_references: each chunk's hash, and for unchanged ones the
//                base's location (a reference, flattened: a reference of the base is
//                copied, never chained), CRC32C and length; own files left empty are
//                dropped; check_references just before the commit: every referenced
//                file exists with its recorded size.
#pragma once

#include <string>
#include <vector>

#include "collective/save_session.h"

namespace distckpt::internal_collective {

// Rank 0, in open_save once frame.entry exists (a sharded native save with
// options.incremental): sets frame.base_name and frame.base_index, or
// leaves them empty when there is no usable base (a note says why in frame.result
// .warning only when the caller named the base). kNotFound for an explicit base that
// is not committed; errors of writing the references file.
Status prepare_base(SaveFrame& frame);

// Collective, after the write lists are scattered: see the top of this file. Records in
// the session what finish_save reports to rank 0. Errors are carried to the write's
// agreement (session.local_error), never returned early.
void apply_base(Comm& comm, SaveSession& session, const StateDict& state);

// Rank 0: sets every chunk's hash, CRC32C and place in frame.plan.index from what each
// rank returned (all_crcs[r]: CRCs of the chunks it wrote; all_marks[r]: per planned
// chunk, its hash and whether it was written). Adds the referenced files, drops own
// files left empty. *referenced: bytes of chunks referenced. kInternal for a count that
// does not match the plan.
Status fill_references(SaveFrame& frame, const std::vector<std::string>& all_crcs,
                       const std::vector<std::string>& all_marks, uint64_t* referenced);

// Rank 0, before the commit: kNotFound (naming the file) unless every file `index`
// references exists, kCorruption unless with its recorded size.
Status check_references(FileSystem& fs, const std::string& root, const proto::Index& index);

}  // namespace distckpt::internal_collective
