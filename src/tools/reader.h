// Local (one-process) reading of any checkpoint, region by region: what
// `distckpt convert` streams through. Regions are read as load() reads them.
#pragma once

#include <memory>
#include <string>

#include "distckpt/encryption.h"
#include "distckpt/filesystem.h"
#include "distckpt/layout.h"
#include "distckpt_index.pb.h"

namespace distckpt::internal_tools {

class CheckpointReader {
 public:
  // Resolves `path` (a root gives its newest checkpoint) and reads its description;
  // an encrypted one needs its `key` (kAuthFailed otherwise).
  static Result<std::unique_ptr<CheckpointReader>> open(std::shared_ptr<FileSystem> fs, const std::string& path,
                                                        const EncryptionKey* key = nullptr);
  ~CheckpointReader();
  const proto::Index& index() const;
  // Reads `region` of tensor `tensor` (index order) into `dst`, row-major. With
  // `check_partial` (conversions), a chunk read in part is read whole so that its
  // checksum is checked; without it only the region's bytes are read (chunks read whole
  // are checked either way). kInvalidArgument for a region that is not a box inside the
  // tensor (wrong number of dims, negative, out of bounds).
  Status read(int tensor, const Box& region, void* dst, uint64_t* bytes_read, bool check_partial = true);
  // Why reads are not checked, or "" when every chunk read whole is (chunk checksums, an
  // encrypted checkpoint, or check_files() passed): a file MindSpore wrote, whose footer
  // covers the whole file and is not read per tensor, data that records no checksums, or
  // (whatever its checksums) a .ckpt encrypted whole in CBC, which nothing authenticates.
  std::string unchecked_reason() const;
  // Reads every data file whole once and checks its whole-file CRC-32 (a .ckpt's footer);
  // kCorruption naming the file on a mismatch. Then unchecked_reason() is "" for a
  // checkpoint that has those CRCs. Cached: a second call reads nothing.
  Status check_files();

 private:
  CheckpointReader();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace distckpt::internal_tools
