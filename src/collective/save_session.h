// The sharded save, in phases shared by save() and the asynchronous saver:
//   begin_save   (collective) the frame (save_frame.h) and each rank's write list;
//   write        (local)      this rank's data file, fsynced (or staged, for async);
//   finish_save  (collective) gather the checksums, close the frame (agree, commit).
// Each collective phase returns the same Status on every rank.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "collective/save_frame.h"
#include "storage/stream_writer.h"

namespace distckpt::internal_collective {

struct SaveSession {
  SaveFrame frame;
  std::vector<internal_plan::WriteItem> mine;  // this rank's chunks, in file order
  Status local_error;  // a local failure of begin_save, reported by the write phase
  // Encrypted saves: the tags of this rank's chunks, in the order of `mine`, filled by
  // the write.
  std::vector<std::string> tags;
  // Incremental saves (incremental.h): per planned chunk of this rank, its content hash
  // and whether it is written ('w') or referenced ('r'), for rank 0.
  std::string marks;
};

// Collective. Takes everything the index needs from `state` (names, layouts, info).
Result<SaveSession> begin_save(Comm& comm, const StateDict& state, const std::string& root,
                               const SaveOptions& options);
// The sharded save's frame spec, and begin_save with another spec over the same plan
// (per-rank .ckpt sets write the plan's slices into their own files).
FrameSpec sharded_spec(const SaveOptions& options);
Result<SaveSession> begin_planned_save(Comm& comm, const StateDict& state, const std::string& root,
                                       const SaveOptions& options, const FrameSpec& spec);
// Local: writes this rank's chunks from `state`'s buffers (encrypted when asked: their
// tags go to session.tags) and fsyncs; returns their CRCs.
Result<std::vector<uint32_t>> write_session(SaveSession& session, const StateDict& state, const Comm& comm,
                                            uint64_t* bytes);
// Collective. `crcs` is this rank's write outcome (an error still takes part).
Result<SaveResult> finish_save(Comm& comm, SaveSession& session, const Result<std::vector<uint32_t>>& crcs);

// Rank 0: sets every chunk's CRC32C (and tag) in frame.plan.index from what each rank
// returned (all_crcs[r]: its CRCs in write order, as bytes; all_tags[r]: its tags).
// kInternal for a count that does not match the plan.
Status fill_checksums(SaveFrame& frame, const std::vector<std::string>& all_crcs,
                      const std::vector<std::string>& all_tags);

// The I/O steps shared by the synchronous and the asynchronous write: this rank's data
// file (opened with direct I/O when asked for), where its chunks lie in it and where it
// ends, and the copy of its chunks (and the zeros between them) into a stream writer.
std::string data_file_path(const SaveSession& session, const Comm& comm);
// `from_staging`: every write comes from the staging pool's reused slabs (an async save:
// WriteOpenOptions::from_reused_buffers).
Result<std::unique_ptr<WritableFile>> open_data_file(const SaveSession& session, const Comm& comm,
                                                    bool from_staging = false);
std::vector<internal_storage::ByteRange> chunk_ranges(const std::vector<internal_plan::WriteItem>& items);
uint64_t file_end(const std::vector<internal_plan::WriteItem>& items);  // 0 for none
// Encrypted sessions encrypt each chunk on its way into the stream and append its tag
// to `tags`.
Status stage_chunks(internal_storage::StreamWriter& writer, const SaveSession& session, const StateDict& state,
                    const Comm& comm, uint64_t* bytes, std::vector<std::string>* tags);

}  // namespace distckpt::internal_collective
