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
#include <type_traits>

#include "base/guard.h"
#include "base/timer.h"
#include "collective/save_strategies.h"
#include "format/hdf5/hdf5_footer.h"
#include "format/hdf5/hdf5_io.h"
#include "layout/region.h"
#include "transform/crc32c.h"

namespace distckpt::internal_collective {

namespace {

// A run of bytes this rank wrote into a dataset, and its CRC32C.
struct WrittenRun {
  uint32_t tensor;
  uint64_t at;  // byte offset in the dataset
  uint64_t length;
  uint32_t crc;
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

// What a rank sends rank 0 per dataset it wrote into: its runs' share of the dataset's
// CRC32C (crc32c.h: the XOR of each run's contribution at its place) and their bytes.
// One per dataset, however many runs (a column split writes one per row).
struct TensorPart {
  uint64_t tensor;
  uint64_t bytes;
  uint32_t part;
  uint32_t pad;
};
static_assert(sizeof(TensorPart) == 24 && std::has_unique_object_representations_v<TensorPart>,
              "sent as bytes: no padding");

// This rank's parts, from its runs. kInternal when two of its runs overlap.
Result<std::string> tensor_parts(const StateDict& state, std::vector<WrittenRun> runs) {
  using namespace internal_transform;
  std::sort(runs.begin(), runs.end(), [](const WrittenRun& a, const WrittenRun& b) {
    return a.tensor != b.tensor ? a.tensor < b.tensor : a.at < b.at;
  });
  std::string out;
  uint64_t last_gap = ~uint64_t{0}, last_length = ~uint64_t{0};
  uint32_t gap_factor = 0, length_zeros = 0;
  for (std::size_t i = 0; i < runs.size();) {
    const TensorEntry& e = state.tensors()[runs[i].tensor];
    uint64_t dataset = dtype_size(e.dtype);
    for (int64_t d : e.layout.global_shape()) dataset *= static_cast<uint64_t>(d);
    // Horner's rule over the runs in place order: acc holds the contributions of the runs
    // so far as if the dataset ended where the last one ends.
    uint32_t acc = 0;
    uint64_t end = 0, bytes = 0;
    const uint32_t tensor = runs[i].tensor;
    for (; i < runs.size() && runs[i].tensor == tensor; ++i) {
      const WrittenRun& r = runs[i];
      if (bytes > 0 && r.at < end) return internal_error("save: tensor '" + e.name + "': two writes overlap");
      if (r.length != last_length) last_length = r.length, length_zeros = crc32c_zeros(r.length);
      const uint32_t raw = r.crc ^ length_zeros;
      const uint64_t gap = r.at + r.length - end;
      if (gap != last_gap) last_gap = gap, gap_factor = crc32c_shift_factor(gap);
      acc = (bytes == 0 ? 0 : crc32c_multiply(gap_factor, acc)) ^ raw;
      end = r.at + r.length;
      bytes += r.length;
    }
    if (end > dataset) return internal_error("save: tensor '" + e.name + "': a write past its end");
    const TensorPart part{tensor, bytes, crc32c_multiply(crc32c_shift_factor(dataset - end), acc), 0};
    out.append(reinterpret_cast<const char*>(&part), sizeof(part));
  }
  return out;
}

// Rank 0: each dataset's CRC32C from every rank's parts, whose bytes must add up to the
// dataset's (the plan writes each element once). kInternal when they do not.
Result<std::vector<uint32_t>> dataset_crcs(const proto::Index& meta, const std::vector<std::string>& received) {
  const auto count = static_cast<std::size_t>(meta.tensors_size());
  std::vector<uint32_t> sum(count, 0);
  std::vector<uint64_t> bytes(count, 0);
  for (const std::string& from : received) {
    if (from.size() % sizeof(TensorPart) != 0) return internal_error("save: a rank's checksums are cut");
    for (std::size_t at = 0; at < from.size(); at += sizeof(TensorPart)) {
      TensorPart part;
      std::memcpy(&part, from.data() + at, sizeof(part));
      if (part.tensor >= count) return internal_error("save: a rank wrote past the tensors it was given");
      sum[part.tensor] ^= part.part;
      bytes[part.tensor] += part.bytes;
    }
  }
  std::vector<uint32_t> crcs;
  for (std::size_t t = 0; t < count; ++t) {
    const uint64_t dataset = internal_format::tensor_bytes(meta.tensors(static_cast<int>(t)));
    if (bytes[t] != dataset)
      return internal_error("save: tensor '" + meta.tensors(static_cast<int>(t)).name() + "': the ranks wrote " +
                            std::to_string(bytes[t]) + " of its " + std::to_string(dataset) + " bytes");
    crcs.push_back(sum[t] ^ internal_transform::crc32c_zeros(dataset));
  }
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
                                    add_run(*runs, WrittenRun{item.tensor, at, n, internal_transform::crc32c(run, n)});
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
  // Every rank's parts (and whether it wrote) to rank 0, which records each dataset's
  // CRC32C in the metadata attribute, in the room create() reserved, before the commit.
  std::string sent(1, '\0');
  if (written.ok())
    written = internal_base::guarded(where + ": checksums", [&]() -> Status {
      DISTCKPT_ASSIGN_OR_RETURN(std::string parts, tensor_parts(state, std::move(runs)));
      sent = "\1" + parts;
      return Status();
    });
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
        return internal_format::append_hdf5_footer(*frame.fs, frame.entry.target(), meta, offsets, options.fsync);
      });
  }
  result.write_s = write_timer.seconds();
  return close_save(comm, frame, written.with_context(where), nullptr);
}

}  // namespace distckpt::internal_collective
