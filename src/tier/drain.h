// The drain (tier.h): a committed local checkpoint written to the global root as a
// normal checkpoint, while training and further local saves go on.
//
//   start  (collective, the caller's thread) rank 0 reads the record and opens the
//          global temporary entry; every rank plans the global checkpoint from the
//          record alike (each distinct chunk once, by the least loaded rank whose own
//          node file holds it) and starts copying its chunks in a background thread;
//   poll   (collective) one allreduce: when every rank's copy is done, the commit
//          (agreement, the index on rank 0, catalog/commit.cc's protocol);
//   wait   (collective) the same, waiting for the copies.
// The background thread does file I/O only, never communication.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "catalog/commit.h"
#include "distckpt/tier.h"
#include "distckpt_index.pb.h"

namespace distckpt::internal_transform {
class CheckpointCipher;
}

namespace distckpt::internal_tier {

class DrainJob {
 public:
  static Result<std::unique_ptr<DrainJob>> start(Comm& comm, const std::string& root, const LocalTier& tier,
                                                 const std::string& name, const SaveOptions& options);
  // Collective. Returns true (and *out) once committed; false while copies run.
  // Errors: the drain failed (the global root shows nothing new); the job is over.
  Result<bool> poll(Comm& comm, DrainResult* out);
  Result<DrainResult> wait(Comm& comm);
  const std::string& name() const { return name_; }
  // Joins the thread; an unfinished drain's temporary entry is removed (rank 0).
  ~DrainJob();

  struct Item {
    int tensor = 0;
    int source_chunk = 0;  // in the record
    int chunk = 0;         // in the global index
    uint64_t byte_offset = 0, length = 0, stored_length = 0;
  };

 private:
  DrainJob() = default;
  Result<DrainResult> finish(Comm& comm);
  void copy();  // the background thread

  std::string name_, root_;
  LocalTier tier_;
  SaveOptions options_;
  std::shared_ptr<FileSystem> fs_;
  proto::Index record_, index_;
  std::shared_ptr<const internal_transform::CheckpointCipher> record_cipher_, cipher_;
  std::string salt_;
  internal_catalog::Entry entry_;  // rank 0
  std::string tmp_;                // every rank
  int rank_ = 0;
  std::vector<Item> mine_;
  std::thread thread_;
  std::atomic<bool> done_{false};
  bool finished_ = false;
  Status copied_;
  std::vector<uint32_t> crcs_;
  std::string tags_;
  uint64_t bytes_ = 0;
  double copy_s_ = 0;
  double started_ = 0;
};

}  // namespace distckpt::internal_tier
