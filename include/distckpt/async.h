/// Asynchronous sharded save: the training loop is blocked only while this rank's share
/// of the state is copied into staging memory; a background thread writes it, fsyncs,
/// agrees with the other ranks and commits, exactly as save() does (checkpoint.h).
///
/// Threads and MPI: an AsyncCheckpointer is used from one thread (the training loop's).
/// Its background thread makes MPI calls on a communicator of its own while the loop
/// makes its own MPI calls, so MPI must be initialised with MPI_THREAD_MULTIPLE; create()
/// checks. Neither thread ever uses the caller's communicator: create() duplicates it
/// twice (one for the loop's side of the collectives, one for the background's), so the
/// two can never match each other's messages. Over MPI, make one with
/// make_async_checkpointer (mpi_comm.h); this header needs no MPI.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "distckpt/checkpoint.h"
#include "distckpt/comm.h"
#include "distckpt/local_tier.h"
#include "distckpt/state_dict.h"
#include "distckpt/status.h"

namespace distckpt {

namespace internal_collective {
class StagedSave;
}

struct AsyncOptions {
  /// Staging memory per rank, at most: aligned slabs made (and touched once) as saves
  /// need them, 2 by create(), and kept for the next saves, so a rank holds about the
  /// largest share it staged, capped by this. A rank only stages the bytes it writes
  /// (replicas are removed first). When its share is larger, save_async() blocks until
  /// the excess has been written: copying is pipelined with writing, and memory stays
  /// bounded.
  std::size_t staging_bytes = std::size_t{1} << 30;
  std::size_t slab_bytes = std::size_t{8} << 20;  ///< unit of staging and of each write
  /// A save_async() while another save is in flight: wait for it (false), or refuse with
  /// kBusy on every rank (true).
  bool refuse_when_busy = false;
};

class AsyncCheckpointer {
 public:
  /// Collective over an MPI communicator: the same as make_async_checkpointer (mpi_comm.h,
  /// which defines this for MPI_Comm, so that this header needs no <mpi.h>).
  template <typename MpiComm>
  static Result<std::unique_ptr<AsyncCheckpointer>> create(MpiComm comm, const AsyncOptions& options = {});
  /// Collective over two communicators the caller provides, spanning the same ranks in
  /// the same order and used by nothing else (make_async_checkpointer duplicates an MPI
  /// communicator twice; tests use in-process ones). Takes ownership. kIoError on every
  /// rank when the staging memory cannot be allocated.
  static Result<std::unique_ptr<AsyncCheckpointer>> create(std::unique_ptr<Comm> foreground,
                                                           std::unique_ptr<Comm> background,
                                                           const AsyncOptions& options = {});

  /// Local (no collective of its own): waits for a save in flight, which the other ranks'
  /// background threads finish with this one (see end()); its result is dropped.
  ~AsyncCheckpointer();
  AsyncCheckpointer(const AsyncCheckpointer&) = delete;
  AsyncCheckpointer& operator=(const AsyncCheckpointer&) = delete;

  /// Collective. Starts saving `state` as save(comm, state, root, options) would and
  /// returns once this rank's share is staged (sharded native saves: the bytes it
  /// writes, in the staging pool; single files and integrated saves, which are gathered
  /// to a writing rank: a copy of every slice this rank holds, allocated per save
  /// outside the pool, so extra memory = this rank's state bytes + save()'s own for the
  /// gather, on the background thread). Extra memory per rank for a sharded save (docs/guide/cpp.md
  /// "Memory"; mpi_tests/memory_bound checks it): the pool, which holds at most
  /// min(staging_bytes, the bytes this rank writes) rounded up to slabs, never less than
  /// the 2 slabs made by create(); plus O(index) on rank 0. From then on the caller may modify its
  /// tensors and the state dict. A save still in flight is waited for first (or refused,
  /// see AsyncOptions). Errors, identical on every rank: the previous save's failure if
  /// it was not reported yet (reported once; no new save starts), kBusy, and any error
  /// save() reports before writing (bad name, inconsistent state dicts, name taken, ...).
  /// Errors while writing or committing are reported by the next wait(), end() or
  /// save_async().
  Status save_async(const StateDict& state, const std::string& root, const SaveOptions& options);

  /// Blocks until the save in flight is committed or has failed, and returns its result,
  /// the same on every rank (ranks agreed in the background). kNotFound when no save was
  /// started since the last result was returned. Not collective: a rank may call it
  /// alone; a failure it returns is still reported by the next save_async on the ranks
  /// that did not call it, and that save_async returns it on every rank.
  Result<SaveResult> wait();

  /// Collective. save_async for the node-local tier: starts save_local(comm, state, root,
  /// options, tier) and returns once this rank's share is staged; the write, the
  /// redundancy (partner copies, parity) and the commit run in the background.
  /// wait_local() reports it (wait() gives its SaveResult part). Errors as save_async.
  Status save_local_async(const StateDict& state, const std::string& root, const SaveOptions& options,
                          const LocalTier& tier);
  /// wait() for a save_local_async: its LocalSaveResult (not collective, as wait()).
  /// kNotFound when no save is in flight or unreported; its errors as wait().
  Result<LocalSaveResult> wait_local();

  /// Whether a save is in flight on this rank (local: ranks may briefly disagree).
  bool in_flight() const;

  /// Completes the save in flight, if any, and returns its outcome (or that of the last
  /// save if it failed and was not reported yet); ok when there is nothing to report.
  /// Not collective, as wait(): the outcome is the same on every rank that calls it.
  Status end();

 private:
  class Impl;
  explicit AsyncCheckpointer(std::unique_ptr<Impl> impl);
  /// Collective: waits for (or refuses) the save in flight, runs `begin` on the
  /// foreground communicator, stages the job's data file and finishes it in the
  /// background (save_local_async, in src/tier/).
  Status start_staged(const char* what,
                      const std::function<Result<std::unique_ptr<internal_collective::StagedSave>>(Comm&)>& begin,
                      const StateDict& state);
  std::unique_ptr<Impl> impl_;
};

}  // namespace distckpt
