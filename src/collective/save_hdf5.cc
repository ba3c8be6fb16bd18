// HDF5 files written collectively: every rank writes the unique slices the plan gives
// it as hyperslabs of one shared file (parallel HDF5 over the communicator's MPI), no
// gather.
#include <algorithm>

#include "base/timer.h"
#include "collective/save_strategies.h"
#include "comm/mpi_interop.h"
#include "format/hdf5/hdf5_io.h"
#include "format/metadata_json.h"

namespace distckpt::internal_collective {

Result<SaveResult> save_hdf5(Comm& comm, const StateDict& state, const std::string& root, const SaveOptions& options,
                             const Status& checks) {
  const std::string where = rank_prefix(comm);
  DISTCKPT_ASSIGN_OR_RETURN(SaveFrame frame, open_save(comm, state, root, options, single_file_spec(options, checks)));
  SaveResult& result = frame.result;
  // Every rank needs the metadata, its slices, and per tensor the most slices any rank
  // writes (the number of collective write rounds).
  std::string meta_bytes;
  std::vector<std::string> parts;
  std::vector<int64_t> rounds;
  if (comm.rank() == 0) {
    frame.plan.index.SerializeToString(&meta_bytes);
    rounds.assign(static_cast<std::size_t>(frame.plan.index.tensors_size()), 0);
    for (const auto& w : frame.plan.writes) {
      std::vector<int64_t> count(rounds.size(), 0);
      for (const auto& item : w) ++count[item.tensor];
      for (std::size_t t = 0; t < count.size(); ++t) rounds[t] = std::max(rounds[t], count[t]);
      parts.push_back(internal_plan::encode_writes(w));
    }
  }
  comm.broadcast_string(meta_bytes, 0);
  proto::Index meta;
  Status local = meta.ParseFromString(meta_bytes) ? Status() : internal_error("save: bad metadata from rank 0");
  std::vector<internal_plan::WriteItem> mine;
  auto decoded = internal_plan::decode_writes(comm.scatter(parts, 0));
  if (decoded.ok()) mine = std::move(decoded).value();
  else if (local.ok()) local = decoded.status();
  rounds.resize(static_cast<std::size_t>(meta.tensors_size()));
  comm.broadcast(rounds.data(), rounds.size() * sizeof(int64_t), 0);
  result.plan_s = frame.timer.seconds();
  DISTCKPT_RETURN_IF_ERROR(agree_or_discard(comm, frame, local.with_context(where)));

  internal_base::Timer write_timer;
  const MPI_Comm mpi = internal_comm::as_mpi(comm).value_or(MPI_COMM_NULL);
  // Attribute bytes must be identical on every rank: rank 0's JSON for all.
  std::string meta_json = comm.rank() == 0 ? internal_format::metadata_json(meta) : std::string();
  comm.broadcast_string(meta_json, 0);
  auto writer = internal_format::Hdf5Writer::create(frame.entry.target(), mpi, meta, meta_json);
  DISTCKPT_RETURN_IF_ERROR(agree_or_discard(comm, frame, writer.status().with_context(where)));
  Status written;
  for (int t = 0; t < meta.tensors_size(); ++t) {
    std::vector<std::pair<Box, const void*>> pieces;
    for (const auto& item : mine)
      if (static_cast<int>(item.tensor) == t) {
        const TensorEntry& e = state.tensors()[item.tensor];
        pieces.emplace_back(e.boxes[item.local_box], e.buffers[item.local_box]);
        result.rank_bytes_written += item.length;
      }
    Status st = (*writer)->write(t, pieces, static_cast<int>(rounds[static_cast<std::size_t>(t)]));
    if (written.ok()) written = st;
  }
  Status closed = (*writer)->finish();
  if (written.ok()) written = closed;
  // Every rank: on a parallel file system each node flushes what it wrote.
  if (written.ok() && options.fsync) written = frame.fs->sync_file(frame.entry.target());
  result.write_s = write_timer.seconds();
  return close_save(comm, frame, written.with_context(where), nullptr);
}

}  // namespace distckpt::internal_collective
