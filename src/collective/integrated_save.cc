// Single-file saves (ckpt, safetensors, HDF5) and integrated native saves.
//
// Planning is the sharded save's (every rank describes its boxes, rank 0 checks that
// the ranks agree and assigns each unique slice to one holder). Then:
//  * ckpt, safetensors, native + integrated: tensors are reconstructed region by region
//    (rows of dim 0, at most SaveOptions::gather_bytes each) on the writer rank with
//    gather_region, and written while the next region is gathered (two buffers);
//  * HDF5: every rank writes the slices assigned to it as hyperslabs of one shared
//    file, collectively (no gather).
// The file is written as <root>/<file>.tmp-<id>, fsynced, agreed on, and published by
// rank 0 with the same rename + pointer protocol as directories (commit.cc).
#include <algorithm>
#include <chrono>
#include <future>

#include "comm/agree.h"
#include "distckpt/checkpoint.h"
#include "distckpt/gather.h"
#include "format/hdf5/hdf5_io.h"
#include "format/stored.h"
#include "format/writers.h"
#include "layout/region.h"
#include "plan/save_plan.h"
#include "catalog/commit.h"
#include "base/guard.h"
#include "catalog/listing.h"
#include "collective/save_session.h"
#include "base/timer.h"
#include "format/native/index_io.h"

namespace distckpt::internal_runtime {

using internal_comm::agree;

namespace {

std::string file_name_for(const SaveOptions& options) {
  const std::string ext(internal_format::format_extension(options.format));
  const std::string& n = options.name;
  if (ext.empty() || (n.size() > ext.size() && n.compare(n.size() - ext.size(), ext.size(), ext) == 0)) return n;
  return n + ext;
}

struct Plan {
  proto::Index meta;
  std::string tmp;  // the file (or, native, the directory) being written
  std::vector<internal_plan::WriteItem> mine;  // HDF5: the slices this rank writes
  std::vector<int64_t> rounds;                 // HDF5: per tensor, the most slices a rank writes
};

}  // namespace

Result<SaveResult> save_integrated(Comm& comm, const StateDict& state, const std::string& root,
                                   const SaveOptions& options) {
  Timer timer;
  std::shared_ptr<FileSystem> fs = options.fs ? options.fs : posix_filesystem();
  const std::string where = "save: rank " + std::to_string(comm.rank());
  const Format format = options.format;
  const bool hdf5 = format == Format::kHdf5;
  const std::string file_name = file_name_for(options);
  SaveResult result;
  result.path = root + "/" + file_name;
  const void* mpi_handle = comm.mpi_comm_handle();

  // Options every rank must share (each rank's own copy decides its path): one
  // allreduce of min and max finds any rank that differs.
  std::vector<int64_t> shared{static_cast<int64_t>(format), options.integrated ? 1 : 0, options.writer_rank,
                              static_cast<int64_t>(options.gather_bytes >> 1)};
  std::vector<int64_t> low = shared, high = shared;
  comm.allreduce(low, ReduceOp::kMin);
  comm.allreduce(high, ReduceOp::kMax);
  Status local = low == high ? Status()
                             : invalid_argument("format, integrated, writer_rank and gather_bytes must be the "
                                                "same on every rank");
  if (local.ok()) local = internal_storage::validate_checkpoint_name(file_name);
  if (local.ok() && root.empty()) local = invalid_argument("empty root directory");
  if (local.ok() && state.rank() != comm.rank())
    local = invalid_argument("the state dict was built for rank " + std::to_string(state.rank()));
  if (local.ok() && (options.writer_rank < 0 || options.writer_rank >= comm.size()))
    local = invalid_argument("writer_rank " + std::to_string(options.writer_rank) + " is not a rank");
  if (local.ok() && options.gather_bytes == 0) local = invalid_argument("gather_bytes must be positive");
  if (local.ok() && options.encryption.enabled()) local = internal_format::encryption_refused(format);
  if (local.ok() && hdf5 && mpi_handle == nullptr && comm.size() > 1)
    local = unsupported("HDF5 saves over several ranks need an MPI communicator (make_mpi_comm)");
  DISTCKPT_RETURN_IF_ERROR(agree(comm, local.with_context(where)));

  // Plan on rank 0 from its own layouts, once the ranks agree their state dicts match.
  Plan plan;
  DISTCKPT_RETURN_IF_ERROR(agree_on_state(comm, state));
  std::string salt;
  std::shared_ptr<const internal_transform::CheckpointCipher> cipher;
  DISTCKPT_RETURN_IF_ERROR(agree_on_encryption(comm, options.encryption, &salt, &cipher));
  std::vector<std::string> parts;
  if (comm.rank() == 0) {
    local = guarded("save: rank 0: plan", [&]() -> Status {
      DISTCKPT_ASSIGN_OR_RETURN(internal_plan::SavePlan sp,
                                internal_plan::plan_save(internal_plan::planned_tensors(state), comm.size(), true));
      plan.meta = internal_format::metadata_of(sp.index);
      proto::Index& meta = plan.meta;
      meta.set_name(file_name);
      meta.set_step(options.step);
      meta.set_epoch(options.epoch);
      meta.set_format(std::string(format_name(format)));
      if (format != Format::kNative) meta.mutable_transforms()->set_checksum("none");
      internal_storage::set_info_values(state.info(), &meta);
      if (format == Format::kCkpt) {  // MindSpore's append info
        if (options.epoch >= 0 && !meta.info().count("epoch_num")) (*meta.mutable_info())["epoch_num"].set_int_value(options.epoch);
        if (options.step >= 0 && !meta.info().count("step_num")) (*meta.mutable_info())["step_num"].set_int_value(options.step);
      }
      DISTCKPT_RETURN_IF_ERROR(internal_format::check_writable(format, meta));
      DISTCKPT_RETURN_IF_ERROR(fs->create_dirs(root));
      if (fs->exists(result.path)) return already_exists("save: checkpoint '" + result.path + "' already exists");
      meta.set_commit_seq(next_commit_seq(*fs, root));
      meta.set_advances_latest(options.update_latest);
      meta.set_created_unix_ms(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::system_clock::now().time_since_epoch()).count());
      plan.tmp = make_tmp_dir_name(root, file_name);
      if (format == Format::kNative) DISTCKPT_RETURN_IF_ERROR(fs->create_dir(plan.tmp));
      if (hdf5) {
        plan.rounds.assign(static_cast<std::size_t>(meta.tensors_size()), 0);
        for (const auto& w : sp.writes) {
          std::vector<int64_t> count(plan.rounds.size(), 0);
          for (const auto& item : w) ++count[item.tensor];
          for (std::size_t t = 0; t < count.size(); ++t) plan.rounds[t] = std::max(plan.rounds[t], count[t]);
          parts.push_back(internal_plan::encode_writes(w));
        }
      }
      return Status();
    });
  }
  DISTCKPT_RETURN_IF_ERROR(agree(comm, local));
  std::string meta_bytes;
  if (comm.rank() == 0) plan.meta.SerializeToString(&meta_bytes);
  comm.broadcast_string(meta_bytes, 0);
  comm.broadcast_string(plan.tmp, 0);
  local = plan.meta.ParseFromString(meta_bytes) ? Status() : internal_error("save: bad metadata from rank 0");
  if (hdf5) {
    auto mine = internal_plan::decode_writes(comm.scatter(parts, 0));
    if (mine.ok()) plan.mine = std::move(mine).value();
    else local = mine.status();
    plan.rounds.resize(static_cast<std::size_t>(plan.meta.tensors_size()));
    comm.broadcast(plan.rounds.data(), plan.rounds.size() * sizeof(int64_t), 0);
  }
  for (const TensorEntry& e : state.tensors())
    result.bytes_unique += static_cast<uint64_t>(full_box(e.layout.global_shape()).num_elements()) * dtype_size(e.dtype);
  result.plan_s = timer.seconds();
  auto cleanup = [&] {
    if (comm.rank() != 0) return;
    if (format == Format::kNative) (void)fs->remove_all(plan.tmp);
    else (void)fs->remove_file(plan.tmp);
  };
  if (Status st = agree(comm, local.with_context(where)); !st.ok()) {
    cleanup();
    return st;
  }

  // Write.
  Timer write_timer;
  proto::Index final_index;
  if (hdf5) {
    MPI_Comm mpi = mpi_handle != nullptr ? *static_cast<const MPI_Comm*>(mpi_handle) : MPI_COMM_NULL;
    // Attribute bytes must be identical on every rank: rank 0's JSON for all.
    std::string meta_json = comm.rank() == 0 ? internal_format::metadata_json(plan.meta) : std::string();
    comm.broadcast_string(meta_json, 0);
    auto writer = internal_format::Hdf5Writer::create(plan.tmp, mpi, plan.meta, meta_json);
    if (Status st = agree(comm, writer.status().with_context(where)); !st.ok()) {
      cleanup();
      return st;
    }
    Status written;
    for (int t = 0; t < plan.meta.tensors_size(); ++t) {
      std::vector<std::pair<Box, const void*>> pieces;
      for (const auto& item : plan.mine)
        if (static_cast<int>(item.tensor) == t) {
          const TensorEntry& e = state.tensors()[item.tensor];
          pieces.emplace_back(e.boxes[item.local_box], e.buffers[item.local_box]);
          result.rank_bytes_written += item.length;
        }
      Status st = (*writer)->write(t, pieces, static_cast<int>(plan.rounds[static_cast<std::size_t>(t)]));
      if (written.ok()) written = st;
    }
    Status closed = (*writer)->finish();
    if (written.ok()) written = closed;
    // Every rank: on a parallel file system each node flushes what it wrote.
    if (written.ok() && options.fsync) written = fs->sync_file(plan.tmp);
    if (Status st = agree(comm, written.with_context(where)); !st.ok()) {
      cleanup();
      return st;
    }
  } else {
    const int writer_rank = options.writer_rank;
    const bool writing = comm.rank() == writer_rank;
    std::unique_ptr<internal_format::SequentialWriter> writer;
    std::vector<char> buffers[2];
    Status wst;
    if (writing) {
      wst = guarded(where, [&]() -> Status {
        const std::string path =
            format == Format::kNative ? plan.tmp + "/" + internal_storage::data_file_name(writer_rank) : plan.tmp;
        DISTCKPT_ASSIGN_OR_RETURN(writer, internal_format::make_sequential_writer(format, *fs, path, plan.meta,
                                                                                  options.ckpt_crc_footer, cipher.get()));
        uint64_t largest = 0;
        for (const TensorEntry& e : state.tensors())
          for (const Box& r : internal_layout::row_blocks(e.layout.global_shape(), dtype_size(e.dtype), options.gather_bytes))
            largest = std::max<uint64_t>(largest, static_cast<uint64_t>(r.num_elements()) * dtype_size(e.dtype));
        for (auto& b : buffers) b.resize(largest);
        return Status();
      });
    }
    if (Status st = agree(comm, wst.with_context(where)); !st.ok()) {
      cleanup();
      return st;
    }
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
    if (writing && wst.ok() && gathered_ok.ok()) {
      auto done = guarded(where, [&] { return writer->finish(options.fsync); });
      if (done.ok()) final_index = std::move(done).value();
      else wst = done.status();
      result.rank_bytes_written = writer->bytes_written();
    }
    if (!gathered_ok.ok()) {  // identical on every rank (gather_region agrees)
      cleanup();
      return gathered_ok;
    }
    if (Status st = agree(comm, wst.with_context(where)); !st.ok()) {
      cleanup();
      return st;
    }
    if (format == Format::kNative) {
      std::string bytes;
      if (writing) final_index.SerializeToString(&bytes);
      comm.broadcast_string(bytes, writer_rank);
      if (!final_index.ParseFromString(bytes)) local = internal_error("save: bad index from the writer");
    }
  }
  result.write_s = write_timer.seconds();

  // Commit on rank 0, then agree.
  Timer commit_timer;
  if (comm.rank() == 0) {
    local = guarded("save: rank 0: commit", [&]() -> Status {
      DISTCKPT_RETURN_IF_ERROR(local);
      if (cipher && format == Format::kNative)  // a .ckpt's writer sealed its own metadata
        DISTCKPT_RETURN_IF_ERROR(internal_storage::seal_index(&final_index, *cipher, salt));
      Result<CommitResult> committed =
          format == Format::kNative
              ? commit_checkpoint(*fs, root, plan.tmp, file_name, final_index, options.fsync, options.update_latest)
              : publish_checkpoint(*fs, root, plan.tmp, file_name, options.fsync, options.update_latest);
      if (!committed.ok()) return committed.status().with_context("save: rank 0: commit");
      result.index_bytes = committed->index_bytes;
      result.warning = committed->warning;
      return Status();
    });
    if (!local.ok() && fs->exists(plan.tmp)) cleanup();
  }
  DISTCKPT_RETURN_IF_ERROR(agree(comm, local));
  result.commit_s = commit_timer.seconds();
  comm.broadcast_string(result.warning, 0);
  std::vector<int64_t> sums{static_cast<int64_t>(result.rank_bytes_written), static_cast<int64_t>(result.index_bytes)};
  comm.allreduce(sums, ReduceOp::kSum);
  result.bytes_written = static_cast<uint64_t>(sums[0]);
  result.index_bytes = static_cast<uint64_t>(sums[1]);
  return result;
}

}  // namespace distckpt::internal_runtime
