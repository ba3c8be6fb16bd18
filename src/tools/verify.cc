// Offline verification: every file's size and every chunk's CRC32C, streaming; for
// single files, the whole-file CRC-32 (MindSpore's footer) and the per-tensor CRC32C
// distckpt records in safetensors metadata. A single file without any checksum (HDF5,
// a safetensors or .ckpt written by another tool) is checked for structure only.
#include <algorithm>
#include <map>

#include "distckpt/inspect.h"
#include "format/chunk_reader.h"
#include "format/ckpt/ms_ckpt.h"
#include "format/format.h"
#include "format/native/index_codec.h"
#include "format/native/sealing.h"
#include "format/stored.h"
#include "transform/cipher.h"
#include "transform/crc32c.h"
#include "format/ckpt/framed_file.h"
#include "storage/object_fs.h"

namespace distckpt {
namespace {

// Reads bytes [begin, end) of `file` into `buf` a piece at a time (at most 8 MiB held),
// calling check(offset, piece length) after each read.
template <typename Check>
Status read_pieces(const ReadableFile& file, const std::string& path, uint64_t begin, uint64_t end,
                   std::vector<char>& buf, Check&& check) {
  constexpr uint64_t kPiece = 8 << 20;
  for (uint64_t at = begin; at < end;) {
    const std::size_t n = static_cast<std::size_t>(std::min(kPiece, end - at));
    buf.resize(n);
    DISTCKPT_RETURN_IF_ERROR(file.read_at(buf.data(), n, at).with_context("verify: '" + path + "'"));
    DISTCKPT_RETURN_IF_ERROR(check(at, n));
    at += n;
  }
  return Status();
}

// Bytes [begin, end) of `file` must be zeros.
Status check_gap(const ReadableFile& file, const std::string& path, uint64_t begin, uint64_t end, std::vector<char>& buf) {
  return read_pieces(file, path, begin, end, buf, [&](uint64_t at, std::size_t n) -> Status {
    const auto bad = std::find_if(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(n), [](char c) { return c != 0; });
    if (bad != buf.begin() + static_cast<std::ptrdiff_t>(n))
      return corruption("verify: data file '" + path + "': byte " + std::to_string(at + static_cast<uint64_t>(bad - buf.begin())) +
                        ", between chunks, is not zero (the file was modified or damaged)");
    return Status();
  });
}

}  // namespace

Result<VerifyReport> verify_checkpoint(const std::string& path, const VerifyOptions& options) {
  const std::shared_ptr<FileSystem> fs = internal_format::with_key(internal_storage::filesystem_for(path, options.fs), options.key.get());
  // --deep: every file read comes from storage where the file system can evict it. A
  // failure to evict is not an error (the bytes are still checked), but then the report
  // does not claim it.
  bool evicted = options.deep;
  auto evict = [&](const std::string& file) {
    if (options.deep && !fs->evict_cached(file).ok()) evicted = false;
  };
  const internal_format::FormatDriver* stored_format = internal_format::detect(*fs, path);
  if (options.deep && stored_format)
    evict(stored_format->single_file ? path : path + "/" + internal_format::kIndexFileName);
  DISTCKPT_ASSIGN_OR_RETURN(proto::Index index, internal_format::read_stored_index(*fs, path));
  auto opened = internal_format::open_index(&index, options.key.get(), path);
  if (!opened.ok()) return opened.status().with_context("verify");
  const std::shared_ptr<const internal_transform::CheckpointCipher> cipher = *opened;
  const bool single = internal_format::is_single_file(index);
  const bool checksums = internal_format::has_chunk_checksums(index);
  const std::string dir = internal_format::files_dir(index, path);
  VerifyReport report;
  // A .ckpt's CRC-32 footer is a checksum too: only files with neither are unchecked.
  report.checksums = checksums;
  for (const auto& f : index.files()) report.checksums = report.checksums || f.crc32_covered() > 0;
  report.checked = internal_format::data_checks_text(index);
  DISTCKPT_RETURN_IF_ERROR(
      internal_format::check_unchecked(index, path, options.allow_unchecked, &report.warning).with_context("verify"));
  report.authenticated = cipher != nullptr || internal_format::authenticated_whole_file(index);
  // Chunks grouped by file, so that one file is open at a time whatever the number of
  // writers, and each file is read front to back.
  std::vector<std::vector<std::pair<int, int>>> by_file(static_cast<std::size_t>(index.files_size()));
  for (int t = 0; t < index.tensors_size(); ++t)
    for (int c = 0; c < index.tensors(t).chunks_size(); ++c)
      by_file[index.tensors(t).chunks(c).file_id()].emplace_back(t, c);
  report.tensors = static_cast<uint64_t>(index.tensors_size());
  std::vector<char> buf;
  internal_format::InsideCheck inside(*fs, dir);
  internal_format::InsideCheck referenced(*fs, internal_format::references_root(dir));
  for (int f = 0; f < index.files_size(); ++f) {
    const auto& meta = index.files(f);
    // A reference (incremental saves) is checked as this checkpoint's own files are.
    const std::string file_path = single ? dir + "/" + meta.name() : internal_format::data_file_location(index, dir, f);
    if (!single && meta.checkpoint().empty()) DISTCKPT_RETURN_IF_ERROR(inside.check(meta.name()).with_context("verify"));
    if (!single && !meta.checkpoint().empty()) {
      DISTCKPT_RETURN_IF_ERROR(referenced.check(meta.checkpoint() + "/" + meta.name()).with_context("verify"));
      DISTCKPT_RETURN_IF_ERROR(internal_format::check_reference_identity(*fs, internal_format::references_root(dir), meta)
                                   .with_context("verify"));
    }
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
    // A native data file of this checkpoint holds its chunks and, before each, a gap
    // of zeros (kChunkAlignment): no checksum covers the gaps, so they are read here.
    // A referenced file is another checkpoint's: its other chunks are not in this index.
    if (internal_format::stored_format(index) == Format::kNative && !internal_format::is_per_rank_set(index) &&
        meta.checkpoint().empty()) {
      uint64_t at = 0;
      for (std::size_t k = 0; k <= chunks.size(); ++k) {
        const uint64_t next = k < chunks.size() ? index.tensors(chunks[k].first).chunks(chunks[k].second).byte_offset() : size;
        if (next > at) DISTCKPT_RETURN_IF_ERROR(check_gap(**file, file_path, at, next, buf));
        if (k < chunks.size()) at = std::max(at, next + index.tensors(chunks[k].first).chunks(chunks[k].second).length());
      }
    }
    if (meta.crc32_covered() > 0) {
      auto computed = internal_format::file_crc32(**file, 0, meta.crc32_covered());
      if (!computed.ok()) return computed.status().with_context("verify");
      const uint32_t crc = *computed;
      if (crc != meta.crc32())
        return corruption("verify: '" + file_path + "': CRC-32 " + internal_transform::crc32c_hex(crc) +
                          (internal_format::is_single_file(index) ? " != footer " : " != recorded ") +
                          internal_transform::crc32c_hex(meta.crc32()));
      report.bytes_checked += meta.crc32_covered();
      // A per-rank .ckpt file's own footer, as MindSpore's loader checks it: the set's
      // index holds the CRC the writer computed, the file the footer MindSpore reads.
      if (internal_format::is_per_rank_set(index) && size == meta.crc32_covered() + internal_format::kCkptFooterBytes) {
        std::string tail(internal_format::kCkptFooterBytes, '\0');
        DISTCKPT_RETURN_IF_ERROR((*file)->read_at(tail.data(), tail.size(), meta.crc32_covered()).with_context("verify"));
        if (tail != internal_format::ckpt_footer(crc))
          return corruption("verify: '" + file_path + "': its CRC-32 footer does not hold the file's CRC-32 " +
                            internal_transform::crc32c_hex(crc) + " (damaged: MindSpore would refuse the file)");
      }
    }
    if (!checksums && !cipher) {
      // Nothing to check the bytes against (HDF5, a .ckpt without its footer): each is
      // still read once, so that a read error of the storage is found and --deep means
      // what it says.
      if (meta.crc32_covered() == 0) {
        DISTCKPT_RETURN_IF_ERROR(read_pieces(**file, file_path, 0, size, buf, [](uint64_t, std::size_t) { return Status(); }));
        report.bytes_checked += size;
      }
      continue;
    }
    for (const auto& [t, c] : chunks) {
      const auto& tensor = index.tensors(t);
      const auto& chunk = tensor.chunks(c);
      internal_format::ChunkCheck check;
      check.crc = checksums;
      check.cipher = cipher.get();
      check.file_identity = single ? "" : internal_format::file_identity(meta.name());
      // A referenced file is named with its checkpoint: the same name may be this one's too.
      check.where = "verify: '" + path + "': tensor '" + tensor.name() + "': chunk " + std::to_string(c) + " of " +
                    (meta.checkpoint().empty() ? meta.name() : "'" + file_path + "' (referenced)");
      // Read whole only when authenticated (a tag covers all of it); else in pieces.
      DISTCKPT_RETURN_IF_ERROR(internal_format::read_chunk(**file, tensor, c, nullptr, check, buf));
      ++report.chunks;
      report.bytes_checked += chunk.length();
    }
  }
  report.deep = evicted;
  return report;
}

}  // namespace distckpt
