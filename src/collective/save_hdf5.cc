// HDF5 files written in parallel: rank 0 lays the file out with HDF5 (every dataset
// contiguous and allocated at creation, attributes, metadata) and closes it; then every
// rank writes the unique slices the plan gives it straight into the datasets' bytes at
// their offsets, through the FileSystem, and fsyncs them; last, rank 0 records each
// dataset's CRC32C, combined from the ranks' runs, in the metadata attribute, and
// appends the footer that covers the rest of the file (hdf5_footer.h).
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
#include <cstring>

#include "base/guard.h"
#include "base/timer.h"
#include "collective/save_strategies.h"
#include "format/hdf5/hdf5_footer.h"
#include "format/hdf5/hdf5_io.h"
#include "layout/region.h"
#include "transform/crc32c.h"

namespace distckpt::internal_collective {

namespace {

// A run of bytes this rank wrote into a dataset, and its CRC32C. Ranks send theirs to
// rank 0, which combines them, in the dataset's byte order, into the dataset's CRC32C.
struct WrittenRun {
  uint64_t tensor;
  uint64_t at;      // byte offset in the dataset
  uint64_t length;
  uint32_t crc;
  uint32_t pad = 0;  // sent as bytes: no indeterminate padding
};

// Appends a run, merged into the last one when it continues it.
void add_run(std::vector<WrittenRun>& runs, const WrittenRun& run) {
  if (!runs.empty() && runs.back().tensor == run.tensor && runs.back().at + runs.back().length == run.at) {
    runs.back().crc = internal_transform::crc32c_combine(runs.back().crc, run.crc, run.length);
    runs.back().length += run.length;
    return;
  }
  runs.push_back(run);
}

// Rank 0: each dataset's CRC32C from every rank's runs, which must tile it exactly (the
// plan writes each element once). kInternal when they do not.
Result<std::vector<uint32_t>> dataset_crcs(const proto::Index& meta, const std::vector<std::string>& parts) {
  std::vector<WrittenRun> runs;
  for (const std::string& part : parts) {
    if (part.size() % sizeof(WrittenRun) != 0) return internal_error("save: a rank's checksums are cut");
    const std::size_t at = runs.size();
    runs.resize(at + part.size() / sizeof(WrittenRun));
    std::memcpy(runs.data() + at, part.data(), part.size());
  }
  std::sort(runs.begin(), runs.end(),
            [](const WrittenRun& a, const WrittenRun& b) { return a.tensor != b.tensor ? a.tensor < b.tensor : a.at < b.at; });
  std::vector<uint32_t> crcs;
  std::size_t next = 0;
  for (int t = 0; t < meta.tensors_size(); ++t) {
    const uint64_t bytes = internal_format::tensor_bytes(meta.tensors(t));
    uint32_t crc = 0;  // of no bytes
    uint64_t done = 0;
    for (; next < runs.size() && runs[next].tensor == static_cast<uint64_t>(t); ++next) {
      if (runs[next].at != done) break;
      crc = internal_transform::crc32c_combine(crc, runs[next].crc, runs[next].length);
      done += runs[next].length;
    }
    if (done != bytes)
      return internal_error("save: tensor '" + meta.tensors(t).name() + "': the ranks' writes cover " +
                            std::to_string(done) + " of its " + std::to_string(bytes) + " bytes contiguously");
    crcs.push_back(crc);
  }
  if (next != runs.size()) return internal_error("save: a rank wrote past the tensors it was given");
  return crcs;
}

// Writes this rank's slices at their datasets' offsets and fsyncs them; `runs` gets the
// CRC32C of what it wrote.
Status write_slices(const SaveFrame& frame, const StateDict& state, const std::vector<internal_plan::WriteItem>& mine,
                    const std::vector<uint64_t>& offsets, uint64_t* bytes, std::vector<WrittenRun>* runs) {
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
                                    const char* run = data + inner_at * static_cast<int64_t>(elem);
                                    const std::size_t n = static_cast<std::size_t>(count) * elem;
                                    const uint64_t at = static_cast<uint64_t>(outer_at) * elem;
                                    st = file->write_at(run, n, offsets[item.tensor] + at);
                                    add_run(*runs, WrittenRun{static_cast<uint64_t>(item.tensor), at, n,
                                                              internal_transform::crc32c(run, n)});
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
        DISTCKPT_ASSIGN_OR_RETURN(auto writer, internal_format::Hdf5Writer::create(frame.entry.target(), meta));
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
  std::vector<WrittenRun> runs;
  if (written.ok())
    written = internal_base::guarded(where + ": write", [&] {
      return write_slices(frame, state, *mine, offsets, &result.rank_bytes_written, &runs);
    });
  // Every rank's runs (and whether it wrote) to rank 0, which records each dataset's
  // CRC32C in the metadata attribute, in the room create() reserved, before the commit.
  std::string sent(1, written.ok() ? '\1' : '\0');
  sent.append(reinterpret_cast<const char*>(runs.data()), runs.size() * sizeof(WrittenRun));
  std::vector<std::string> received = comm.gather(sent, 0);
  if (comm.rank() == 0 && written.ok()) {
    bool all_wrote = true;
    for (std::string& part : received) {
      all_wrote = all_wrote && !part.empty() && part[0] == '\1';
      if (!part.empty()) part.erase(0, 1);
    }
    if (all_wrote)  // else the save fails at the agreement, and nothing is committed
      written = internal_base::guarded(where + ": record checksums", [&]() -> Status {
        const proto::Index& meta = frame.plan.index;
        DISTCKPT_ASSIGN_OR_RETURN(std::vector<uint32_t> crcs, dataset_crcs(meta, received));
        DISTCKPT_RETURN_IF_ERROR(internal_format::record_hdf5_crc32c(frame.entry.target(), meta, crcs));
        std::vector<std::pair<uint64_t, uint64_t>> data;
        for (int t = 0; t < meta.tensors_size(); ++t)
          data.emplace_back(offsets[static_cast<std::size_t>(t)],
                            offsets[static_cast<std::size_t>(t)] + internal_format::tensor_bytes(meta.tensors(t)));
        return internal_format::append_hdf5_footer(*frame.fs, frame.entry.target(), std::move(data), options.fsync);
      });
  }
  result.write_s = write_timer.seconds();
  return close_save(comm, frame, written.with_context(where), nullptr);
}

}  // namespace distckpt::internal_collective
