// Bounce buffers: buffered reads and writes that move their bytes through a small buffer
// of the calling thread instead of letting the kernel copy into or out of the caller's
// memory.
//
// Why: on some virtual machines the kernel's first access to each page of a process's
// memory traps to the hypervisor (shadow page tables, as in PVM guests and sandboxes of
// that kind): about 1-3 us per 4 KiB page, whatever the file system. Tensors the kernel has
// never copied are in that state, so a restore (always a process's first load) or a
// process's first save paid it on every page: on this project's VM a pread of 1 GiB from
// tmpfs into freshly touched memory took 0.80-0.93 s, and 0.16-0.17 s into the same
// memory again. Through a buffer the kernel has already touched, with the copy to or from
// the caller's memory in user mode, it takes 0.17-0.21 s the first time and every time
// after (a write: 0.22 s against 1.42 s). Where the kernel's first touch costs nothing,
// the extra copy (from the cache) would only cost about 5%; so the process measures it
// once and bounces only where it pays.
#pragma once

#include <cstddef>
#include <optional>

namespace distckpt::internal_base {

// The bounce buffer's size: small enough to stay in a core's L2 between the kernel's copy
// and ours (and the CRC taken in between by callers that read in pieces of this size or
// less), large enough that a system call moves 128 pages.
inline constexpr std::size_t kBounceBytes = 512 << 10;

// Whether buffered file I/O (and large MPI receives: comm/mpi_comm.cc) go through bounce
// buffers in this process. Decided once, at the first call: DISTCKPT_BOUNCE=1 or 0 forces
// it (to measure both ways); otherwise first_kernel_touch_traps() decides. Thread-safe.
bool bounce_io();

// Transfers under this size never bounce: the kernel's first touch of at most 16 pages
// costs under 50 us, less than deciding (a process that only reads a small index, as
// `distckpt inspect` does, never runs the probe).
inline constexpr std::size_t kBounceMinBytes = 64 << 10;

// Whether a buffered transfer of `bytes` goes through the bounce buffer: bounce_io() for
// kBounceMinBytes or more, false under it. Thread-safe.
bool bounce_io_for(std::size_t bytes);

// DISTCKPT_BOUNCE's choice: true for "1", false for "0", nullopt when unset or anything
// else (the probe decides then). Thread-safe.
std::optional<bool> bounce_io_from_env();

// The probe: reads 256 KiB of /dev/zero into fresh memory (touched in user mode first)
// twice, twice over, and answers whether the kernel's first copy cost at least 0.5 us more
// per page than its second and 4 times as much. About 2 ms where it traps (mostly user
// mode's own first touch of the memory); well under 1 ms where it does not. Thread-safe;
// runs the probe at each call.
bool first_kernel_touch_traps();

// For tests: bounce_io() answers `forced` from now on, or (nullopt) the process's own
// decision again. Thread-safe, but I/O already under way keeps the path it took.
void force_bounce_io_for_testing(std::optional<bool> forced);

// This thread's bounce buffer (kBounceBytes, page-aligned), made at its first use and
// freed when the thread ends; nullptr when it cannot be allocated (the caller then does its
// I/O without one). Callers must not hold it across calls that may use it themselves.
char* bounce_buffer();
// Gives this thread a new bounce buffer and never frees the old one (512 KiB lost): for
// an io_uring ring torn down with reads into the buffer perhaps still in flight, which
// must not land in a buffer in use again.
void abandon_bounce_buffer();

}  // namespace distckpt::internal_base
