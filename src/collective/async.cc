// Asynchronous save (distckpt/async.h).
//
// The caller's thread runs the planning collectives (begin_save) on the foreground
// communicator and copies this rank's chunks into the staging pool through a
// StreamWriter, whose own thread already writes full slabs while later ones are being
// filled. Once every byte is staged the call returns; the background thread then waits
// for the stream (finish: tail, trim, fsync) and runs the agreement and the commit
// (finish_save) on the background communicator.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <optional>
#include <exception>
#include <thread>

#include "base/guard.h"
#include "base/timer.h"
#include "collective/save_session.h"
#include "collective/save_strategies.h"
#include "collective/staged_save.h"
#include "comm/agree.h"
#include "distckpt/async.h"
#include "distckpt/mpi_async.h"
#include "format/format.h"
#include "layout/strided.h"
#include "storage/staging.h"
#include "storage/stream_writer.h"

namespace distckpt {

using internal_base::guarded;
using internal_base::Timer;
using internal_collective::SaveSession;
using internal_storage::StagingPool;
using internal_storage::StreamWriter;

// A rank's slices copied for a background single-file save.
struct StagedCopy {
  explicit StagedCopy(int rank) : state(rank) {}
  std::vector<std::vector<unsigned char>> bytes;
  StateDict state;
};

class AsyncCheckpointer::Impl {
 public:
  Impl(std::unique_ptr<Comm> fg, std::unique_ptr<Comm> bg, AsyncOptions options, std::unique_ptr<StagingPool> pool)
      : fg_(std::move(fg)), bg_(std::move(bg)), options_(options), pool_(std::move(pool)) {}

  ~Impl() { join(); }

  Status save_async(const StateDict& state, const std::string& root, const SaveOptions& options) {
    DISTCKPT_RETURN_IF_ERROR(prepare("save_async"));
    // Single files (and integrated native ones) are gathered and written from a copy of
    // this rank's slices, in the background, by save() on the background communicator.
    // Every rank takes the same branch.
    DISTCKPT_RETURN_IF_ERROR(internal_collective::agree_save_shape(*fg_, state, options));
    if (internal_collective::save_shape(options) != internal_collective::SaveShape::kSharded)
      return save_gathered_async(state, root, options);

    DISTCKPT_ASSIGN_OR_RETURN(SaveSession session, internal_collective::begin_save(*fg_, state, root, options));
    // Stage this rank's share. A local failure is not returned here: the background
    // thread carries it to the agreement, so every rank reports it alike.
    Timer stage_timer;
    std::unique_ptr<StreamWriter> writer;
    const Status staged = stage(session, state, &writer);
    const double stage_s = stage_timer.seconds();

    running_ = true;
    auto finish = [this, session = std::move(session), writer = std::move(writer), staged, stage_s,
                   fsync = options.fsync]() mutable {
      Timer write_timer;
      Result<std::vector<uint32_t>> crcs = staged.ok() ? Result<std::vector<uint32_t>>(std::vector<uint32_t>{})
                                                       : Result<std::vector<uint32_t>>(staged);
      if (staged.ok() && writer)
        crcs = guarded(internal_collective::rank_prefix(*bg_) + ": write", [&] {
          return written_by(*writer, fsync);
        });
      writer.reset();  // joins the stream's thread; its slabs are back in the pool
      session.frame.result.write_s = stage_s + write_timer.seconds();
      settle(internal_collective::finish_save(*bg_, session, crcs));
    };
    run_in_background(std::move(finish));
    return Status();
  }

  // A copy of this rank's slices (and the state's info values), then save() of it in
  // the background: the gather to the writing rank and the write overlap training.
  Status save_gathered_async(const StateDict& state, const std::string& root, const SaveOptions& options) {
    auto copy = std::make_shared<StagedCopy>(state.rank());
    Status staged = guarded(internal_collective::rank_prefix(*fg_) + ": stage", [&]() -> Status {
      for (const TensorEntry& e : state.tensors()) {
        std::vector<void*> buffers;
        for (std::size_t b = 0; b < e.boxes.size(); ++b) {
          const std::size_t bytes = static_cast<std::size_t>(e.boxes[b].num_elements()) * dtype_size(e.dtype);
          copy->bytes.emplace_back(std::max<std::size_t>(bytes, 1));
          internal_layout::copy_packed_out(e, b, 0, bytes, reinterpret_cast<char*>(copy->bytes.back().data()));
          buffers.push_back(copy->bytes.back().data());
        }
        if (buffers.empty()) buffers.push_back(nullptr);  // not in the tensor's group
        DISTCKPT_RETURN_IF_ERROR(buffers.size() == 1 && e.boxes.size() <= 1
                                     ? copy->state.add_tensor(e.name, e.dtype, buffers[0], e.layout)
                                     : copy->state.add_tensor(e.name, e.dtype, buffers, e.layout));
      }
      for (const auto& [k, v] : state.info()) DISTCKPT_RETURN_IF_ERROR(copy->state.set_info(k, v));
      return Status();
    });
    // A rank that could not copy (out of memory) must not leave the others in the gather.
    DISTCKPT_RETURN_IF_ERROR(internal_comm::agree(*fg_, staged));
    running_ = true;
    auto finish = [this, copy, root, options]() {
      settle(save(*bg_, copy->state, root, options));
    };
    run_in_background(std::move(finish));
    return Status();
  }

  Result<SaveResult> wait() {
    DISTCKPT_ASSIGN_OR_RETURN(LocalSaveResult r, wait_local());
    return r.save;
  }

  Result<LocalSaveResult> wait_local() {
    join();
    if (!pending_) return not_found("wait: no save in flight or unreported");
    Result<LocalSaveResult> r = std::move(*pending_);
    pending_.reset();
    return r;
  }

  // A save whose data file is staged here and whose finish runs in the background
  // (the local tier's: tier/async_local.cc). The same frame as save_async.
  Status start_staged(std::unique_ptr<internal_collective::StagedSave> job, const StateDict& state) {
    Timer stage_timer;
    std::unique_ptr<StreamWriter> writer;
    const Status staged = stage(job->session(), state, &writer);
    const double stage_s = stage_timer.seconds();
    running_ = true;
    auto finish = [this, job = std::move(job), writer = std::move(writer), staged, stage_s]() mutable {
      Timer write_timer;
      Result<std::vector<uint32_t>> crcs = staged.ok() ? Result<std::vector<uint32_t>>(std::vector<uint32_t>{})
                                                       : Result<std::vector<uint32_t>>(staged);
      const bool fsync = job->session().frame.options.fsync;
      if (staged.ok() && writer)
        crcs = guarded(internal_collective::rank_prefix(*bg_) + ": write", [&] { return written_by(*writer, fsync); });
      writer.reset();
      job->session().frame.result.write_s = stage_s + write_timer.seconds();
      pending_ = job->finish(*bg_, crcs);
      running_ = false;
    };
    run_in_background(std::move(finish));
    return Status();
  }

  // Runs `finish` on the worker thread or, when this rank can have no thread (or no
  // memory for its state), here, synchronously: the other ranks' background threads meet
  // this one in the save's collectives, so every rank still gets the same result (from
  // wait()), only later than usual. Nothing thrown escapes to leave them waiting.
  template <typename F>
  void run_in_background(F finish) {
    std::shared_ptr<F> task;  // shared, so that it is still here to run if the thread is not
    try {
      task = std::make_shared<F>(std::move(finish));  // moved from only once allocated
      worker_ = std::thread([task] { (*task)(); });
    } catch (const std::exception&) {
      if (task)
        (*task)();
      else
        finish();
    }
  }

  // What starts every background save: a save in flight is waited for (or refused), and
  // the previous one's unreported failure is returned on every rank.
  Status prepare(const char* what) {
    if (options_.refuse_when_busy) {
      // Ranks finish the background commit at slightly different times: agree.
      const bool busy = fg_->allreduce_one(running_.load() ? 1 : 0, ReduceOp::kMax) != 0;
      if (busy) return Status(StatusCode::kBusy, std::string(what) + ": a save is still in flight");
    }
    join();
    // The previous save failed and was not reported on some rank: report it on every
    // rank (agreed, since a rank that already returned it from wait() has cleared it),
    // and start nothing. Deciding locally could send ranks different ways here.
    const Status previous = pending_ && !pending_->ok() ? pending_->status() : Status();
    pending_.reset();
    return internal_comm::agree(*fg_, previous);
  }
  Comm& foreground() { return *fg_; }

  bool in_flight() const { return running_.load(); }

  Status end() {
    join();
    if (!pending_) return Status();
    Status st = pending_->status();
    pending_.reset();
    return st;
  }

 private:
  // Copies this rank's chunks into the staging pool, through a stream writer that writes
  // them to the session's data file. Through the page cache (a memory file system, or
  // no direct I/O) nothing is written until every byte is staged or the pool is full:
  // the kernel's copy into the page cache would otherwise slow the caller's copy down
  // (stream_writer.h).
  Status stage(SaveSession& session, const StateDict& state, std::unique_ptr<StreamWriter>* writer) {
    return guarded(internal_collective::rank_prefix(*fg_) + ": stage", [&]() -> Status {
      DISTCKPT_RETURN_IF_ERROR(session.local_error);
      if (session.mine.empty()) return Status();
      DISTCKPT_ASSIGN_OR_RETURN(auto file, internal_collective::open_data_file(session, *fg_, /*from_staging=*/true));
      std::vector<internal_storage::ByteRange> ranges = internal_collective::chunk_ranges(session.mine);
      const uint64_t size = internal_collective::file_end(session.mine);
      const std::string path = internal_collective::data_file_path(session, *fg_);
      const bool checksum = session.frame.options.checksum;
      // A recycled file on a memory file system: staged straight into it (its mapping is
      // the staging), and its CRCs are taken in the background.
      DISTCKPT_ASSIGN_OR_RETURN(char* view, file->map_for_write(size));
      const bool hold = !file->direct();
      if (view != nullptr)
        *writer = std::make_unique<StreamWriter>(std::move(file), view, std::move(ranges), path, checksum);
      else
        *writer = std::make_unique<StreamWriter>(std::move(file), *pool_, std::move(ranges), path, checksum, hold);
      Status st = internal_collective::stage_chunks(**writer, session, state, *fg_,
                                                    &session.frame.result.rank_bytes_written, &session.tags);
      (*writer)->release_hold();
      return st;
    });
  }

  void join() {
    if (worker_.joinable()) worker_.join();
  }
  // The stream's end on the background thread; its error names this rank, as the
  // synchronous save's does (every rank reports the agreed one).
  Result<std::vector<uint32_t>> written_by(StreamWriter& writer, bool fsync) {
    auto crcs = writer.finish(fsync);
    if (!crcs.ok()) return crcs.status().with_context(internal_collective::rank_prefix(*bg_));
    return crcs;
  }
  // The worker's last act: a global save's outcome for wait(), and not running.
  void settle(Result<SaveResult> saved) {
    if (saved.ok()) {
      LocalSaveResult wrapped;
      wrapped.save = std::move(saved).value();
      pending_ = std::move(wrapped);
    } else {
      pending_ = Result<LocalSaveResult>(saved.status());
    }
    running_ = false;
  }

  std::unique_ptr<Comm> fg_;
  std::unique_ptr<Comm> bg_;
  AsyncOptions options_;
  std::unique_ptr<StagingPool> pool_;
  std::thread worker_;
  std::atomic<bool> running_{false};
  // Written by the worker, read by the caller's thread only after joining it.
  std::optional<Result<LocalSaveResult>> pending_;  // a global save's result is its .save
};

Result<std::unique_ptr<AsyncCheckpointer>> AsyncCheckpointer::create(std::unique_ptr<Comm> foreground,
                                                                     std::unique_ptr<Comm> background,
                                                                     const AsyncOptions& options) {
  Comm& fg = *foreground;
  std::unique_ptr<StagingPool> pool;
  Status local;
  if (options.slab_bytes == 0 || options.slab_bytes % kDirectIoAlignment != 0)
    local = invalid_argument("async: slab_bytes must be a positive multiple of " +
                             std::to_string(kDirectIoAlignment));
  if (local.ok())
    local = guarded("async: rank " + std::to_string(fg.rank()), [&]() -> Status {
      pool = std::make_unique<StagingPool>(options.staging_bytes, options.slab_bytes, /*grow=*/true);
      return Status();
    });
  if (local.code() == StatusCode::kIoError)
    local = io_error("async: rank " + std::to_string(fg.rank()) + ": cannot allocate " +
                     std::to_string(options.staging_bytes) + " bytes of staging memory");
  DISTCKPT_RETURN_IF_ERROR(internal_comm::agree(fg, local));
  return std::unique_ptr<AsyncCheckpointer>(new AsyncCheckpointer(
      std::make_unique<Impl>(std::move(foreground), std::move(background), options, std::move(pool))));
}

Result<std::unique_ptr<AsyncCheckpointer>> make_async_checkpointer(MPI_Comm comm, const AsyncOptions& options) {
  // Every rank initialised MPI the same way, so this check needs no agreement.
  int provided = MPI_THREAD_SINGLE;
  MPI_Query_thread(&provided);
  if (provided < MPI_THREAD_MULTIPLE)
    return unsupported(
        "async: MPI provides thread level " + std::to_string(provided) +
        "; asynchronous saves need MPI_THREAD_MULTIPLE (initialise MPI with MPI_Init_thread(..., "
        "MPI_THREAD_MULTIPLE, ...)): the background thread makes MPI calls while the training loop does");
  auto fg = make_mpi_comm(comm);
  auto bg = make_mpi_comm(comm);
  return AsyncCheckpointer::create(std::move(fg), std::move(bg), options);
}

AsyncCheckpointer::AsyncCheckpointer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
AsyncCheckpointer::~AsyncCheckpointer() = default;
Status AsyncCheckpointer::save_async(const StateDict& state, const std::string& root, const SaveOptions& options) {
  return impl_->save_async(state, root, options);
}
Result<SaveResult> AsyncCheckpointer::wait() { return impl_->wait(); }
Result<LocalSaveResult> AsyncCheckpointer::wait_local() { return impl_->wait_local(); }
Status AsyncCheckpointer::start_staged(const char* what,
                                       const std::function<Result<std::unique_ptr<internal_collective::StagedSave>>(Comm&)>& begin,
                                       const StateDict& state) {
  DISTCKPT_RETURN_IF_ERROR(impl_->prepare(what));
  DISTCKPT_ASSIGN_OR_RETURN(auto job, begin(impl_->foreground()));
  return impl_->start_staged(std::move(job), state);
}
bool AsyncCheckpointer::in_flight() const { return impl_->in_flight(); }
Status AsyncCheckpointer::end() { return impl_->end(); }

}  // namespace distckpt
