#include "storage/spare_files.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <vector>

#include "storage/write_maps.h"

namespace distckpt::internal_storage {

namespace {

// A name for a retired file that no other retirement picks: this process's id, a
// per-process counter and the time.
std::string fresh_spare_name() {
  static std::atomic<uint64_t> counter{0};
  const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
  return "spare-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + "-" + std::to_string(now);
}

void move_files(FileSystem& fs, const std::string& dir, const std::string& spare_dir) {
  auto entries = fs.list_dir(dir);
  if (!entries.ok()) return;
  for (const DirEntry& e : *entries) {
    const std::string path = dir + "/" + e.name;
    if (e.is_dir) {
      move_files(fs, path, spare_dir);
      continue;
    }
    // Only regular files are kept (a symlink would send the next save's writes
    // elsewhere): checked without following links.
    auto file = fs.open_readable(path);
    if (!file.ok() || !fs.rename(path, spare_dir + "/" + fresh_spare_name()).ok()) (void)fs.remove_file(path);
  }
}

}  // namespace

Status retire_into_spares(FileSystem& fs, const std::string& dir, const std::string& spare_dir) {
  drop_spares(fs, spare_dir);
  // Made here, owner-only (create_dir), never an existing one: nobody else's files can be
  // in it.
  if (fs.create_dir(spare_dir).ok()) move_files(fs, dir, spare_dir);
  return fs.remove_all(dir);
}

bool take_spare(FileSystem& fs, const std::string& spare_dir, const std::string& path, uint64_t size) {
  // Only a real directory of ours, owner-only (a local directory may be shared, as /dev/shm
  // is: checkpoint bytes must never go into a file someone else can read).
  struct stat dir_stat;
  if (::lstat(spare_dir.c_str(), &dir_stat) != 0 || !S_ISDIR(dir_stat.st_mode) || dir_stat.st_uid != ::geteuid() ||
      (dir_stat.st_mode & 077) != 0)
    return false;
  auto entries = fs.list_dir(spare_dir);
  if (!entries.ok() || entries->empty()) return false;
  // First a spare of exactly `size` bytes that this process keeps a mapping of (it wrote
  // that file last time: writing it again is a memcpy, storage/write_maps.h); then the
  // best fit, the smallest spare that holds `size` bytes; then the others, largest first
  // (a spare too small still saves its pages). Writers racing for one spare each get
  // another: the rename gives it to one of them.
  std::vector<std::pair<uint64_t, std::string>> mapped, fits, short_ones;
  for (const DirEntry& e : *entries) {
    if (e.is_dir) continue;
    struct stat st;
    if (::lstat((spare_dir + "/" + e.name).c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    const auto bytes = static_cast<uint64_t>(st.st_size);
    if (bytes == size && keeps_mapping_of(st.st_dev, st.st_ino, bytes)) mapped.emplace_back(bytes, e.name);
    else (bytes >= size ? fits : short_ones).emplace_back(bytes, e.name);
  }
  std::sort(fits.begin(), fits.end());
  std::sort(short_ones.rbegin(), short_ones.rend());
  mapped.insert(mapped.end(), fits.begin(), fits.end());
  mapped.insert(mapped.end(), short_ones.begin(), short_ones.end());
  for (const auto& [bytes, name] : mapped) {
    if (!fs.rename_no_replace(spare_dir + "/" + name, path).ok()) continue;  // taken by another writer
    // A regular file of ours with one name (not a link, not a hard link to another file).
    struct stat st;
    if (::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == ::geteuid() && st.st_nlink == 1)
      return true;
    (void)fs.remove_file(path);
  }
  return false;
}

void drop_spares(FileSystem& fs, const std::string& spare_dir) {
  if (fs.exists(spare_dir)) (void)fs.remove_all(spare_dir);
  prune_write_mappings();  // the memory of the spares this process had mapped goes back now
}

}  // namespace distckpt::internal_storage
