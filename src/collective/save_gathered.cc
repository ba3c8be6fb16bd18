// Single files written by one rank from gathered tensors (ckpt, safetensors, and native
// with integrated = true), and the choice between this and the HDF5 strategy.
#include <algorithm>
#include <future>

#include "base/guard.h"
#include "base/strings.h"
#include "base/timer.h"
#include "collective/save_strategies.h"
#include "comm/agree.h"
#include "distckpt/gather.h"
#include "format/describe.h"
#include "format/sequential_writer.h"
#include "layout/region.h"

namespace distckpt::internal_collective {

using internal_base::guarded;
using internal_base::Timer;

namespace {

std::string file_name_for(const SaveOptions& options) {
  const std::string ext(internal_format::driver(options.format).extension);
  if (ext.empty() || (options.name.size() > ext.size() && internal_base::ends_with(options.name, ext)))
    return options.name;
  return options.name + ext;
}

}  // namespace

FrameSpec single_file_spec(const SaveOptions& options, const Status& checks) {
  FrameSpec spec;
  spec.name = file_name_for(options);
  spec.extra_checks = checks;
  spec.remove_redundancy = true;
  spec.shape_index = [](SaveFrame& frame) -> Status {
    const internal_format::FormatDriver& format = *frame.format;
    proto::Index meta = internal_format::metadata_of(frame.plan.index);
    meta.set_format(std::string(format.name));
    if (!format.chunk_checksums) meta.mutable_transforms()->set_checksum("none");
    if (format.add_format_info) format.add_format_info(meta);
    DISTCKPT_RETURN_IF_ERROR(internal_format::check_writable(format.id, meta));
    frame.plan.index = std::move(meta);
    return Status();
  };
  return spec;
}

Result<SaveResult> save_single_file(Comm& comm, const StateDict& state, const std::string& root,
                                    const SaveOptions& options) {
  // Options every rank must share (each rank's own copy decides its path).
  const internal_comm::Compared shared = internal_comm::agree_same(
      comm, Status(),
      {static_cast<int64_t>(options.format), options.integrated.value_or(false) ? 1 : 0, options.writer_rank,
       static_cast<int64_t>(options.gather_bytes)});
  Status checks = shared.same ? Status()
                              : invalid_argument("format, integrated, writer_rank and gather_bytes must be the same "
                                                 "on every rank");
  if (checks.ok() && (options.writer_rank < 0 || options.writer_rank >= comm.size()))
    checks = invalid_argument("writer_rank " + std::to_string(options.writer_rank) + " is not a rank");
  if (checks.ok() && options.gather_bytes == 0) checks = invalid_argument("gather_bytes must be positive");
  if (checks.ok() && options.encryption.enabled()) checks = internal_format::encryption_refused(options.format);
  if (options.format == Format::kHdf5) return save_hdf5(comm, state, root, options, checks);
  return save_gathered(comm, state, root, options, checks);
}

Result<SaveResult> save_gathered(Comm& comm, const StateDict& state, const std::string& root,
                                 const SaveOptions& options, const Status& checks) {
  const std::string where = rank_prefix(comm);
  DISTCKPT_ASSIGN_OR_RETURN(SaveFrame frame, open_save(comm, state, root, options, single_file_spec(options, checks)));
  SaveResult& result = frame.result;
  FileSystem& fs = *frame.fs;
  // The writer needs the metadata (rank 0's plan).
  const int writer_rank = options.writer_rank;
  const bool writing = comm.rank() == writer_rank;
  std::string meta_bytes;
  if (comm.rank() == 0) frame.plan.index.SerializeToString(&meta_bytes);
  comm.broadcast_string(meta_bytes, 0);
  proto::Index meta;
  Status local = meta.ParseFromString(meta_bytes) ? Status() : internal_error("save: bad metadata from rank 0");
  result.plan_s = frame.timer.seconds();
  DISTCKPT_RETURN_IF_ERROR(agree_or_discard(comm, frame, local.with_context(where)));

  // Write.
  Timer write_timer;
  std::unique_ptr<internal_format::SequentialWriter> writer;
  std::vector<char> buffers[2];
  Status wst;
  if (writing) {
    wst = guarded(where, [&]() -> Status {
      internal_format::WriterOptions writer_options;
      writer_options.ckpt_crc_footer = options.ckpt_crc_footer;
      writer_options.cipher = frame.cipher.get();  // native: the checkpoint's cipher
      writer_options.encryption = &options.encryption;  // ckpt: the key itself
      writer_options.writer_rank = writer_rank;
      DISTCKPT_ASSIGN_OR_RETURN(writer, internal_format::make_sequential_writer(options.format, fs, frame.entry.target(),
                                                                                meta, writer_options));
      uint64_t largest = 0;
      for (const TensorEntry& e : state.tensors())
        for (const Box& r : internal_layout::row_blocks(e.layout.global_shape(), dtype_size(e.dtype), options.gather_bytes))
          largest = std::max<uint64_t>(largest, static_cast<uint64_t>(r.num_elements()) * dtype_size(e.dtype));
      for (auto& b : buffers) b.resize(largest);
      return Status();
    });
  }
  DISTCKPT_RETURN_IF_ERROR(agree_or_discard(comm, frame, wst.with_context(where)));
  // Region k is gathered into buffers[k % 2] while region k-1 is written from the other.
  // Writer exceptions (a failed thread start, anything append throws) become a Status
  // on the writer rank: it must keep taking part in the gathers either way.
  std::future<Status> pending;
  auto wait_pending = [&] {
    if (!pending.valid()) return;
    Status st = guarded(where, [&] { return pending.get(); });
    if (wst.ok()) wst = st;
  };
  auto start_append = [&](int tensor, const char* data, std::size_t n) {
    if (!wst.ok()) return;
    wst = guarded(where, [&]() -> Status {
      pending = std::async(std::launch::async, [&writer, tensor, data, n] { return writer->append(tensor, data, n); });
      return Status();
    });
  };
  Status gathered_ok;
  int k = 0;
  for (std::size_t t = 0; t < state.tensors().size() && gathered_ok.ok(); ++t) {
    const TensorEntry& e = state.tensors()[t];
    const std::size_t item = dtype_size(e.dtype);
    const auto blocks = internal_layout::row_blocks(e.layout.global_shape(), item, options.gather_bytes);
    for (const Box& region : blocks) {
      char* buf = writing ? buffers[k % 2].data() : nullptr;
      gathered_ok = gather_region(comm, state, e.name, region, buf, writer_rank);
      if (!gathered_ok.ok()) break;
      if (writing) {
        wait_pending();
        start_append(static_cast<int>(t), buf, static_cast<std::size_t>(region.num_elements()) * item);
      }
      ++k;
    }
    if (writing && blocks.empty()) {  // an empty tensor is still described in the file
      wait_pending();
      start_append(static_cast<int>(t), nullptr, 0);
    }
  }
  wait_pending();
  proto::Index final_index;
  if (writing && wst.ok() && gathered_ok.ok()) {
    auto done = guarded(where, [&] { return writer->finish(options.fsync); });
    if (done.ok()) final_index = std::move(done).value();
    else wst = done.status();
    result.rank_bytes_written = writer->bytes_written();
  }
  // gather_region agrees, so gathered_ok is the same on every rank.
  if (!gathered_ok.ok()) return agree_or_discard(comm, frame, gathered_ok);
  DISTCKPT_RETURN_IF_ERROR(agree_or_discard(comm, frame, wst.with_context(where)));
  // A directory's index is what the writer described (its file, chunks and CRCs).
  Status described;
  if (frame.entry.directory) {
    std::string bytes;
    if (writing) final_index.SerializeToString(&bytes);
    comm.broadcast_string(bytes, writer_rank);
    if (!final_index.ParseFromString(bytes)) described = internal_error("save: bad index from the writer");
  }
  result.write_s = write_timer.seconds();
  return close_save(comm, frame, described, [&]() -> Result<proto::Index> { return final_index; });
}

}  // namespace distckpt::internal_collective
