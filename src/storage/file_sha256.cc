#include "storage/file_sha256.h"

#include <algorithm>
#include <vector>

#include "transform/sha256.h"

namespace distckpt::internal_storage {

Result<std::string> sha256_file(FileSystem& fs, const std::string& path) {
  DISTCKPT_ASSIGN_OR_RETURN(auto file, fs.open_readable(path));
  DISTCKPT_ASSIGN_OR_RETURN(uint64_t size, file->size());
  auto digest = internal_transform::Sha256::start();
  if (!digest.ok()) return digest.status().with_context("sha256 '" + path + "'");
  std::vector<char> buf(std::min<uint64_t>(size, uint64_t{8} << 20));
  for (uint64_t done = 0; done < size;) {
    const std::size_t n = static_cast<std::size_t>(std::min<uint64_t>(buf.size(), size - done));
    DISTCKPT_RETURN_IF_ERROR(file->read_at(buf.data(), n, done));
    DISTCKPT_RETURN_IF_ERROR(digest->update(buf.data(), n).with_context("sha256 '" + path + "'"));
    done += n;
  }
  auto hex = digest->finish_hex();
  if (!hex.ok()) return hex.status().with_context("sha256 '" + path + "'");
  return hex;
}

}  // namespace distckpt::internal_storage
