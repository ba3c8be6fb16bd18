// HDF5 files written in parallel: rank 0 lays the file out with HDF5 (every dataset
// contiguous and allocated at creation, attributes, metadata) and closes it; then every
// rank writes the unique slices the plan gives it straight into the datasets' bytes at
// their offsets, through the FileSystem, and fsyncs them.
//
// Why not MPI-IO (parallel HDF5's collective writes), as before: with Open MPI 4.1's
// ompio (Debian 12), a collective write that fails for lack of space is reported to the
// aggregator rank at most ("vulcan_write_all: fbtl_pwritev failed"), and its
// asynchronous path loses errors altogether (open-mpi/ompi#14278, fixed upstream in
// 2026): on a full file system H5Dwrite and H5Fclose then succeeded on every rank, and a
// file with holes in place of data was committed, or the job hung in the retry of a
// partial write. Written here, every failed write is this rank's error, agreed on like
// any other, and the same file system interface (fault injection included) is used as
// for every other format.
#include <algorithm>

#include "base/guard.h"
#include "base/timer.h"
#include "collective/save_strategies.h"
#include "format/hdf5/hdf5_io.h"
#include "format/metadata_json.h"
#include "layout/region.h"

namespace distckpt::internal_collective {

namespace {

// Writes this rank's slices at their datasets' offsets and fsyncs them.
Status write_slices(const SaveFrame& frame, const StateDict& state, const std::vector<internal_plan::WriteItem>& mine,
                    const std::vector<uint64_t>& offsets, uint64_t* bytes) {
  if (mine.empty()) return Status();
  WriteOpenOptions open;
  open.truncate = false;  // the file is laid out already
  DISTCKPT_ASSIGN_OR_RETURN(auto file, frame.fs->open_writable(frame.entry.target(), open));
  for (const auto& item : mine) {
    const TensorEntry& e = state.tensors()[item.tensor];
    const std::size_t elem = dtype_size(e.dtype);
    const Box& box = e.boxes[item.local_box];
    const auto* data = static_cast<const char*>(e.buffers[item.local_box]);
    Status st;
    internal_layout::for_each_run(box, full_box(e.layout.global_shape()),
                                  [&](int64_t outer_at, int64_t inner_at, int64_t count) {
                                    if (!st.ok()) return;
                                    st = file->write_at(data + inner_at * static_cast<int64_t>(elem),
                                                        static_cast<std::size_t>(count) * elem,
                                                        offsets[item.tensor] + static_cast<uint64_t>(outer_at) * elem);
                                  });
    DISTCKPT_RETURN_IF_ERROR(st.with_context("tensor '" + e.name + "'"));
    *bytes += item.length;
  }
  if (frame.options.fsync) DISTCKPT_RETURN_IF_ERROR(file->sync());
  return file->close();
}

}  // namespace

Result<SaveResult> save_hdf5(Comm& comm, const StateDict& state, const std::string& root, const SaveOptions& options,
                             const Status& checks) {
  const std::string where = rank_prefix(comm);
  DISTCKPT_ASSIGN_OR_RETURN(SaveFrame frame, open_save(comm, state, root, options, single_file_spec(options, checks)));
  SaveResult& result = frame.result;

  // Rank 0 lays the file out and tells every rank where each dataset's bytes go, and
  // which slices it writes.
  std::vector<std::string> parts;
  std::vector<uint64_t> offsets;
  Status local;
  if (comm.rank() == 0) {
    local = internal_base::guarded(where + ": lay out", [&]() -> Status {
      auto lay_out = [&]() -> Status {
        const proto::Index& meta = frame.plan.index;
        DISTCKPT_ASSIGN_OR_RETURN(auto writer, internal_format::Hdf5Writer::create(frame.entry.target(), meta,
                                                                                  internal_format::metadata_json(meta)));
        DISTCKPT_ASSIGN_OR_RETURN(offsets, writer->data_offsets());
        DISTCKPT_RETURN_IF_ERROR(writer->finish());
        return options.fsync ? frame.fs->sync_file(frame.entry.target()) : Status();
      };
      return lay_out().with_context(where + ": lay out");  // the error names rank 0
    });
    for (const auto& w : frame.plan.writes) parts.push_back(internal_plan::encode_writes(w));
  }
  DISTCKPT_RETURN_IF_ERROR(agree_or_discard(comm, frame, local));
  int64_t tensors = static_cast<int64_t>(offsets.size());
  comm.broadcast(&tensors, sizeof(tensors), 0);
  offsets.resize(static_cast<std::size_t>(tensors));
  comm.broadcast(offsets.data(), offsets.size() * sizeof(uint64_t), 0);
  auto mine = internal_plan::decode_writes(comm.scatter(parts, 0));
  if (mine.ok() && offsets.size() != state.tensors().size()) mine = internal_error("save: a layout for another state");
  result.plan_s = frame.timer.seconds();

  internal_base::Timer write_timer;
  Status written = mine.status();
  if (written.ok())
    written = internal_base::guarded(where + ": write", [&] {
      return write_slices(frame, state, *mine, offsets, &result.rank_bytes_written);
    });
  result.write_s = write_timer.seconds();
  return close_save(comm, frame, written.with_context(where), nullptr);
}

}  // namespace distckpt::internal_collective
