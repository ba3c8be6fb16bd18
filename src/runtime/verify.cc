// Offline verification: every file's size and every chunk's CRC32C, streaming.
#include <algorithm>
#include <map>

#include "distckpt/checkpoint.h"
#include "storage/index_io.h"
#include "transform/crc32c.h"

namespace distckpt {

Result<VerifyReport> verify_checkpoint(const std::string& path, std::shared_ptr<FileSystem> fs) {
  if (!fs) fs = posix_filesystem();
  DISTCKPT_ASSIGN_OR_RETURN(proto::Index index, internal_storage::read_index(*fs, path));
  VerifyReport report;
  std::map<uint32_t, std::unique_ptr<ReadableFile>> files;
  for (int f = 0; f < index.files_size(); ++f) {
    const auto& meta = index.files(f);
    const std::string file_path = path + "/" + meta.name();
    auto file = fs->open_readable(file_path);
    if (!file.ok()) {
      if (file.status().code() == StatusCode::kNotFound)
        return not_found("verify: data file '" + file_path + "' is missing");
      return file.status().with_context("verify");
    }
    DISTCKPT_ASSIGN_OR_RETURN(uint64_t size, (*file)->size());
    if (size != meta.size()) {
      // Name the first tensor whose bytes the truncation (or extension) affects.
      std::string victim;
      for (const auto& t : index.tensors())
        for (const auto& c : t.chunks())
          if (victim.empty() && c.file_id() == static_cast<uint32_t>(f) && c.byte_offset() + c.length() > size)
            victim = ": tensor '" + t.name() + "' is affected";
      return corruption("verify: data file '" + file_path + "' has " + std::to_string(size) +
                        " bytes, the index records " + std::to_string(meta.size()) +
                        (size < meta.size() ? " (truncated)" : "") + victim);
    }
    files.emplace(static_cast<uint32_t>(f), std::move(*file));
    ++report.files;
  }
  // Chunks are read in pieces so memory stays bounded whatever the index claims.
  constexpr uint64_t kPiece = 16 << 20;
  std::vector<char> buf;
  for (const auto& t : index.tensors()) {
    ++report.tensors;
    for (int c = 0; c < t.chunks_size(); ++c) {
      const auto& chunk = t.chunks(c);
      const ReadableFile& file = *files.at(chunk.file_id());
      uint32_t state = internal_transform::kCrc32cInit;
      for (uint64_t done = 0; done < chunk.length();) {
        const uint64_t n = std::min(kPiece, chunk.length() - done);
        buf.resize(n);
        DISTCKPT_RETURN_IF_ERROR(file.read_at(buf.data(), n, chunk.byte_offset() + done).with_context("verify"));
        state = internal_transform::crc32c_extend(state, buf.data(), n);
        done += n;
      }
      const uint32_t crc = internal_transform::crc32c_finish(state);
      if (crc != chunk.crc32c())
        return corruption("verify: '" + path + "': tensor '" + t.name() + "': chunk " + std::to_string(c) + " of " +
                          index.files(static_cast<int>(chunk.file_id())).name() + ": " +
                          internal_transform::crc32c_mismatch(crc, chunk.crc32c()));
      ++report.chunks;
      report.bytes_checked += chunk.length();
    }
  }
  return report;
}

}  // namespace distckpt
