// Write mappings: the mappings this process keeps of the memory-file-system files it
// writes through them (WritableFile::map_for_write).
//
// Why: a tmpfs file written with pwrite costs the kernel's per-page work on every save
// (1.6-1.9 x a memcpy here, even into a recycled file whose pages exist), and a fresh
// mapping costs its page faults (2.1 x with MAP_POPULATE). A mapping kept from the last
// time this process wrote the same file (a recycled spare: storage/spare_files.h) has
// its page tables filled and marked dirty already, so writing through it is a plain
// memcpy (0.96 x; docs/guide/tiers.md "Surviving node loss"). Steady state for a node-local tier that
// recycles: each rank writes into the file it wrote some saves ago, through the mapping
// it kept.
//
// Safety. A file is mapped only when every page of its bytes exists (no hole: tmpfs
// would allocate a page on the write fault, and a full tmpfs answers that with SIGBUS,
// not an error); files with holes are written with pwrite, which reports ENOSPC. A kept
// mapping is written only after the file was handed out again by a new open of the same
// inode with the same size; nothing else writes through it.
//
// Memory. A kept mapping pins nothing while its file has a name (the pages are the
// file's, and the page tables cost 2 MiB per GiB mapped). Once its file is removed, its
// pages live as long as the mapping: each map_file_for_write and prune drops mappings
// whose files have no name left, and at most kMaxKept are kept (least recently used go).
// A forked child inherits neither the mappings (MADV_DONTFORK) nor, after fork, their
// descriptors.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>

#include "distckpt/status.h"

namespace distckpt::internal_storage {

// One mapping of a file's first `length` bytes, shared and writable. Unmapped (and its
// own descriptor closed) when the last holder lets go.
struct WriteMapping {
  WriteMapping(char* addr, uint64_t length, int fd, dev_t dev, ino_t ino)
      : addr(addr), length(length), fd(fd), dev(dev), ino(ino) {}
  ~WriteMapping();
  WriteMapping(const WriteMapping&) = delete;
  WriteMapping& operator=(const WriteMapping&) = delete;
  char* const addr;
  const uint64_t length;
  const int fd;  // a duplicate, to see whether the file still has a name
  const dev_t dev;
  const ino_t ino;
};

inline constexpr std::size_t kMaxKept = 8;

// A writable mapping of `fd`'s first `size` bytes: the kept one of this file when there is
// one of that size, else a new one (populated), which is kept. nullptr when the file is
// not on tmpfs, is not `size` bytes long, has a hole, is empty, or mmap refuses. `fd` must
// be open for reading and writing. An error only when fstat fails. Thread-safe.
Result<std::shared_ptr<WriteMapping>> map_file_for_write(int fd, uint64_t size);

// Whether this process keeps a mapping of the file (dev, ino) of `size` bytes (a spare
// it may take: writing it again costs a memcpy). Thread-safe.
bool keeps_mapping_of(dev_t dev, ino_t ino, uint64_t size);

// Drops the kept mappings whose files have no name left (removed checkpoints and
// spares), so that their memory goes back now. Thread-safe.
void prune_write_mappings();

// Drops every kept mapping (a job that gives its local tier's memory back). Thread-safe.
void drop_write_mappings();

// Copies `n` bytes into a write mapping with stores that bypass the cache (x86-64's
// non-temporal stores; memcpy elsewhere), fenced before returning: nobody reads the file
// soon, so filling the cache with it (and reading each line before writing it) would only
// cost time. 0.64 x the time of a memcpy into the same mapping here.
void copy_into_mapping(char* dst, const char* src, std::size_t n);

// How many times a kept mapping was handed out again (tests).
uint64_t kept_mapping_reuses();

// How many mappings are kept (tests).
std::size_t kept_write_mappings();

}  // namespace distckpt::internal_storage
