// Offline verification: every file's size and every chunk's CRC32C, streaming; for
// single files, the whole-file CRC-32 (MindSpore's footer) and the per-tensor CRC32C
// distckpt records in safetensors metadata. A single file without any checksum (HDF5,
// a safetensors or .ckpt written by another tool) is checked for structure only.
#include <algorithm>
#include <map>

#include "distckpt/checkpoint.h"
#include "format/stored.h"
#include "format/native/index_io.h"
#include "transform/cipher.h"
#include "transform/crc32c.h"

namespace distckpt {

Result<VerifyReport> verify_checkpoint(const std::string& path, std::shared_ptr<FileSystem> fs) {
  return verify_checkpoint(path, VerifyOptions{}, std::move(fs));
}

Result<VerifyReport> verify_checkpoint(const std::string& path, const VerifyOptions& options,
                                       std::shared_ptr<FileSystem> fs) {
  if (!fs) fs = posix_filesystem();
  // --deep: every file read comes from storage where the file system can evict it. A
  // failure to evict is not an error (the bytes are still checked), but then the report
  // does not claim it.
  bool evicted = options.deep;
  auto evict = [&](const std::string& file) {
    if (options.deep && !fs->evict_cached(file).ok()) evicted = false;
  };
  const auto stored_format = internal_format::detect_format(*fs, path);
  if (options.deep && stored_format)
    evict(*stored_format == Format::kNative ? path + "/" + internal_storage::kIndexFileName : path);
  DISTCKPT_ASSIGN_OR_RETURN(proto::Index index, internal_format::read_stored_index(*fs, path));
  auto opened = internal_storage::open_index(&index, options.key.get(), path);
  if (!opened.ok()) return opened.status().with_context("verify");
  const std::shared_ptr<const internal_transform::CheckpointCipher> cipher = *opened;
  const bool single = !(index.format().empty() || index.format() == "native");
  const bool checksums = index.transforms().checksum() == "crc32c";
  // Files of a single-file checkpoint are named relative to its directory.
  std::string dir = path;
  if (single) {
    const auto slash = path.find_last_of('/');
    dir = slash == std::string::npos ? "." : path.substr(0, slash);
  }
  VerifyReport report;
  report.checksums = checksums;
  report.authenticated = cipher != nullptr;
  // Chunks grouped by file, so that one file is open at a time whatever the number of
  // writers, and each file is read front to back.
  std::vector<std::vector<std::pair<int, int>>> by_file(static_cast<std::size_t>(index.files_size()));
  for (int t = 0; t < index.tensors_size(); ++t)
    for (int c = 0; c < index.tensors(t).chunks_size(); ++c)
      by_file[index.tensors(t).chunks(c).file_id()].emplace_back(t, c);
  report.tensors = static_cast<uint64_t>(index.tensors_size());
  // Chunks are read in pieces so memory stays bounded whatever the index claims.
  constexpr uint64_t kPiece = 16 << 20;
  std::vector<char> buf;
  for (int f = 0; f < index.files_size(); ++f) {
    const auto& meta = index.files(f);
    const std::string file_path = dir + "/" + meta.name();
    auto file = fs->open_readable(file_path);
    if (!file.ok()) {
      if (file.status().code() == StatusCode::kNotFound)
        return not_found("verify: data file '" + file_path + "' is missing");
      return file.status().with_context("verify");
    }
    evict(file_path);  // after the open: a missing or non-regular file is reported as such
    DISTCKPT_ASSIGN_OR_RETURN(uint64_t size, (*file)->size());
    auto& chunks = by_file[static_cast<std::size_t>(f)];
    std::sort(chunks.begin(), chunks.end(), [&](const auto& a, const auto& b) {
      return index.tensors(a.first).chunks(a.second).byte_offset() < index.tensors(b.first).chunks(b.second).byte_offset();
    });
    if (size != meta.size()) {
      // Name the first tensor whose bytes the truncation (or extension) affects.
      std::string victim;
      for (const auto& [t, c] : chunks) {
        const auto& chunk = index.tensors(t).chunks(c);
        if (chunk.byte_offset() + chunk.length() > size) {
          victim = ": tensor '" + index.tensors(t).name() + "' is affected";
          break;
        }
      }
      return corruption("verify: data file '" + file_path + "' has " + std::to_string(size) +
                        " bytes, the index records " + std::to_string(meta.size()) +
                        (size < meta.size() ? " (truncated)" : "") + victim);
    }
    ++report.files;
    if (meta.crc32_covered() > 0) {
      uint32_t crc = 0;
      for (uint64_t done = 0; done < meta.crc32_covered();) {
        const uint64_t n = std::min(kPiece, meta.crc32_covered() - done);
        buf.resize(n);
        DISTCKPT_RETURN_IF_ERROR((*file)->read_at(buf.data(), n, done).with_context("verify"));
        crc = internal_transform::crc32_zlib(crc, buf.data(), n);
        done += n;
      }
      if (crc != meta.crc32())
        return corruption("verify: '" + file_path + "': CRC-32 " + internal_transform::crc32c_hex(crc) + " != footer " +
                          internal_transform::crc32c_hex(meta.crc32()));
      report.bytes_checked += meta.crc32_covered();
    }
    if (!checksums && !cipher) continue;
    for (const auto& [t, c] : chunks) {
      const auto& tensor = index.tensors(t);
      const auto& chunk = tensor.chunks(c);
      const std::string where = "verify: '" + path + "': tensor '" + tensor.name() + "': chunk " + std::to_string(c) +
                                " of " + meta.name();
      uint32_t state = internal_transform::kCrc32cInit;
      if (cipher) {
        // Authenticated whole: a chunk's tag covers all of it (memory: its size).
        buf.resize(chunk.length());
        DISTCKPT_RETURN_IF_ERROR((*file)->read_at(buf.data(), chunk.length(), chunk.byte_offset()).with_context("verify"));
        state = internal_transform::crc32c_extend(state, buf.data(), buf.size());
        DISTCKPT_RETURN_IF_ERROR(internal_storage::open_chunk(*cipher, tensor, c, single ? "" : meta.name(),
                                                              buf.data(), buf.data(), where));
      } else {
        for (uint64_t done = 0; done < chunk.length();) {
          const uint64_t n = std::min(kPiece, chunk.length() - done);
          buf.resize(n);
          DISTCKPT_RETURN_IF_ERROR((*file)->read_at(buf.data(), n, chunk.byte_offset() + done).with_context("verify"));
          state = internal_transform::crc32c_extend(state, buf.data(), n);
          done += n;
        }
      }
      const uint32_t crc = internal_transform::crc32c_finish(state);
      if (checksums && crc != chunk.crc32c())
        return corruption("verify: '" + path + "': tensor '" + tensor.name() + "': chunk " + std::to_string(c) + " of " +
                          meta.name() + ": " + internal_transform::crc32c_mismatch(crc, chunk.crc32c()));
      ++report.chunks;
      report.bytes_checked += chunk.length();
    }
  }
  report.deep = evicted;
  return report;
}

}  // namespace distckpt
