#include "storage/write_maps.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <list>
#include <mutex>
#include <pthread.h>

namespace distckpt::internal_storage {

namespace {

std::mutex& kept_mutex() {
  static std::mutex mu;
  return mu;
}

// Most recently used first. Guarded by kept_mutex().
std::list<std::shared_ptr<WriteMapping>>& kept() {
  static auto* list = new std::list<std::shared_ptr<WriteMapping>>();  // never destroyed: used until exit
  return *list;
}

bool has_no_name(const WriteMapping& m) {
  struct stat st;
  return ::fstat(m.fd, &st) != 0 || st.st_nlink == 0;
}

// Reuses of a kept mapping (tests).
std::atomic<uint64_t> reuses{0};

// A forked child (a data loader's worker) must not keep removed files' pages alive: the
// mappings are not inherited (MADV_DONTFORK), and the child drops its copies of the
// descriptors. The list's lock is held across fork, so the child finds it whole.
void forget_in_child() {
  for (const auto& m : kept()) ::close(m->fd);
  for (auto& m : kept()) new std::shared_ptr<WriteMapping>(std::move(m));  // never destroyed: nothing to unmap here
  kept().clear();
  kept_mutex().unlock();
}

void register_fork_handlers() {
  static std::once_flag once;
  std::call_once(once, [] {
    ::pthread_atfork([] { kept_mutex().lock(); }, [] { kept_mutex().unlock(); }, forget_in_child);
  });
}

}  // namespace

WriteMapping::~WriteMapping() {
  ::munmap(addr, length);
  ::close(fd);
}

Result<std::shared_ptr<WriteMapping>> map_file_for_write(int fd, uint64_t size) {
  prune_write_mappings();  // first, whatever follows: a failed save's files give their pages back
  struct stat st;
  if (::fstat(fd, &st) != 0) return io_error(std::string("fstat: ") + std::strerror(errno));
  struct statfs fs;
  if (size == 0 || !S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) != size || ::fstatfs(fd, &fs) != 0 ||
      fs.f_type != TMPFS_MAGIC)
    return std::shared_ptr<WriteMapping>();
  // Every page of the bytes exists: on tmpfs st_blocks counts the pages the file holds,
  // and none of the files written here holds pages past its end (nothing fallocates with
  // KEEP_SIZE), so a full count means no hole.
  const auto page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  if (static_cast<uint64_t>(st.st_blocks) * 512 < (size + page - 1) / page * page) return std::shared_ptr<WriteMapping>();
  register_fork_handlers();
  std::lock_guard<std::mutex> lock(kept_mutex());
  auto& list = kept();
  for (auto it = list.begin(); it != list.end(); ++it) {
    if ((*it)->dev != st.st_dev || (*it)->ino != st.st_ino) continue;
    std::shared_ptr<WriteMapping> found = *it;
    list.erase(it);
    if (found->length != size) break;  // sized for another save: mapped again below
    list.push_front(found);
    ++reuses;
    return found;
  }
  // A new mapping: the exact test for holes too (huge tmpfs pages can outlive a truncation
  // past the end and make st_blocks overcount). Once per file, not per save: a kept
  // mapping's file was written whole through it and nothing here punches holes.
  const off_t hole = ::lseek(fd, 0, SEEK_HOLE);
  if (hole < 0 || static_cast<uint64_t>(hole) < size) return std::shared_ptr<WriteMapping>();
  const int own = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (own < 0) return std::shared_ptr<WriteMapping>();
  // Populated at once: one pass that maps every page (read faults map pages in batches)
  // costs less than a write fault per page.
  void* addr = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, own, 0);
  if (addr == MAP_FAILED) {
    ::close(own);
    return std::shared_ptr<WriteMapping>();
  }
  ::madvise(addr, size, MADV_DONTFORK);  // best effort: see forget_in_child
  auto made = std::make_shared<WriteMapping>(static_cast<char*>(addr), size, own, st.st_dev, st.st_ino);
  list.push_front(made);
  while (list.size() > kMaxKept) list.pop_back();
  return made;
}

bool keeps_mapping_of(dev_t dev, ino_t ino, uint64_t size) {
  std::lock_guard<std::mutex> lock(kept_mutex());
  return std::any_of(kept().begin(), kept().end(), [&](const std::shared_ptr<WriteMapping>& m) {
    return m->dev == dev && m->ino == ino && m->length == size;
  });
}

void prune_write_mappings() {
  std::lock_guard<std::mutex> lock(kept_mutex());
  kept().remove_if([](const std::shared_ptr<WriteMapping>& m) { return has_no_name(*m); });
}

void drop_write_mappings() {
  std::lock_guard<std::mutex> lock(kept_mutex());
  kept().clear();
}

void copy_into_mapping(char* dst, const char* src, std::size_t n) {
#if defined(__x86_64__)
  // Up to the first 16-byte boundary of the destination with memcpy, then 64 bytes per
  // step with streaming stores (SSE2: every x86-64 has it), the tail with memcpy.
  const std::size_t head = std::min(n, (16 - reinterpret_cast<std::uintptr_t>(dst) % 16) % 16);
  std::memcpy(dst, src, head);
  std::size_t i = head;
  for (; i + 64 <= n; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
  }
  std::memcpy(dst + i, src + i, n - i);
  _mm_sfence();  // the streamed stores are ordered before whatever follows (another thread's CRC)
#else
  std::memcpy(dst, src, n);
#endif
}

uint64_t kept_mapping_reuses() { return reuses.load(); }

std::size_t kept_write_mappings() {
  std::lock_guard<std::mutex> lock(kept_mutex());
  return kept().size();
}

}  // namespace distckpt::internal_storage
