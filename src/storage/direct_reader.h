// The read side of the I/O engine: many byte ranges of files read past the page cache
// (O_DIRECT) into aligned staging slabs, then copied out to where each belongs.
//
// A reader thread reads aligned windows of up to one slab (ranges that share a page are
// read together, never the bytes between ranges that do not) while the caller's thread
// copies the previous window out, in pieces of 256 KiB, handing each piece to a callback
// right after its copy, while it is in cache (the load checks CRC32Cs there).
//
// Why: on this project's VM (virtio disk, ext4), four processes each reading a 256 MiB
// file took 0.26-0.34 s with O_DIRECT into 2 MiB-page slabs (one read in flight per
// process, the copy overlapped), against 0.55-0.97 s with buffered preads straight into
// the destination, and 0.5-0.86 s with O_DIRECT into slabs of 4 KiB pages (a virtio
// request holds at most 254 runs of contiguous memory: staging.cc). The page cache costs
// a copy and the allocation of fresh pages on every cold read; the slabs are made once.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "distckpt/filesystem.h"
#include "storage/staging.h"

namespace distckpt::internal_storage {

struct DirectRange {
  uint32_t file = 0;    // the caller's key for the file (OpenRangeFile resolves it)
  uint64_t offset = 0;  // bytes [offset, offset + n) of the file
  uint64_t n = 0;
  char* dst = nullptr;  // n bytes of the caller's memory
};

// Resolves a file key, on the reader thread, when it reaches that file's ranges. The
// file is borrowed: it must stay valid until the next call (or the end of the reads).
// A file that cannot read directly (ReadableFile::can_read_direct) is read with read_at.
using OpenRangeFile = std::function<Result<const ReadableFile*>(uint32_t file)>;
// Called on the caller's thread, in order, for each piece of range `range` (its index in
// `ranges`): `n` bytes at `at` within the range, just copied to `dst + at`.
using CopiedPiece = std::function<Status(std::size_t range, uint64_t at, const char* piece, std::size_t n)>;
// Names range `range` in error messages (a tensor's chunk and its file).
using NameRange = std::function<std::string(std::size_t range)>;

// Not collective. Reads `ranges` (sorted by file, then offset; not overlapping; none
// empty) through `pool`'s slabs (each a multiple of kDirectIoAlignment; the pool serves
// only these reads while they run), with one reader thread, joined before return.
// Errors: the first of `open_file`, a read (kIoError naming the path), a file that ends
// before a range does (kCorruption, "truncated", named by `name_range`), or `on_copied`;
// the reads then stop. Destinations of ranges not yet copied are left as they were.
// Errors of a read name the range it was for (`name_range`). `direct_bytes` (may be
// null): adds the bytes of ranges copied out of windows read with read_direct.
Status read_ranges(std::span<const DirectRange> ranges, const OpenRangeFile& open_file, const CopiedPiece& on_copied,
                   const NameRange& name_range, StagingPool& pool, uint64_t* direct_bytes = nullptr);

}  // namespace distckpt::internal_storage
