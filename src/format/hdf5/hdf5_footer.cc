#include "format/hdf5/hdf5_footer.h"

#include <algorithm>
#include <cstring>

#include "format/format.h"
#include "transform/crc32c.h"

namespace distckpt::internal_format {

namespace {

constexpr char kMagic[8] = {'D', 'C', 'K', 'P', 'T', 'H', '5', 'F'};
constexpr uint32_t kVersion = 1;
constexpr uint64_t kCovered = kHdf5FooterBytes - 4;  // of the footer: all but its CRC

// The CRC32C state over [0, end) minus the data ranges, read in bounded pieces.
Result<uint32_t> structure_state(const ReadableFile& file, uint64_t end, std::vector<std::pair<uint64_t, uint64_t>> data) {
  std::sort(data.begin(), data.end());
  uint32_t state = internal_transform::kCrc32cInit;
  std::vector<char> buf;
  uint64_t at = 0;
  auto take = [&](uint64_t from, uint64_t to) -> Status {
    constexpr uint64_t kPiece = 1 << 20;
    for (uint64_t p = from; p < to;) {
      const uint64_t n = std::min(kPiece, to - p);
      buf.resize(n);
      DISTCKPT_RETURN_IF_ERROR(file.read_at(buf.data(), n, p));
      state = internal_transform::crc32c_extend(state, buf.data(), n);
      p += n;
    }
    return Status();
  };
  for (const auto& [from, to] : data) {
    if (from > at) DISTCKPT_RETURN_IF_ERROR(take(at, std::min(from, end)));
    at = std::max(at, to);
  }
  if (at < end) DISTCKPT_RETURN_IF_ERROR(take(at, end));
  return state;
}

}  // namespace

Status append_hdf5_footer(FileSystem& fs, const std::string& path, const proto::Index& meta,
                          const std::vector<uint64_t>& offsets, bool fsync) {
  const std::string where = "hdf5 '" + path + "': its footer";
  if (offsets.size() != static_cast<std::size_t>(meta.tensors_size()))
    return internal_error(where + ": " + std::to_string(offsets.size()) + " offsets for " +
                          std::to_string(meta.tensors_size()) + " tensors");
  std::vector<std::pair<uint64_t, uint64_t>> data;
  for (int t = 0; t < meta.tensors_size(); ++t)
    data.emplace_back(offsets[static_cast<std::size_t>(t)],
                      offsets[static_cast<std::size_t>(t)] + tensor_bytes(meta.tensors(t)));
  DISTCKPT_ASSIGN_OR_RETURN(uint64_t size, fs.file_size(path));
  uint32_t state = 0;
  {
    DISTCKPT_ASSIGN_OR_RETURN(auto in, fs.open_readable(path));
    DISTCKPT_ASSIGN_OR_RETURN(state, structure_state(*in, size, std::move(data)));
  }
  char footer[kHdf5FooterBytes];
  std::memcpy(footer, kMagic, sizeof(kMagic));
  std::memcpy(footer + 8, &kVersion, 4);  // little-endian hosts only (x86-64, aarch64)
  const uint32_t crc = internal_transform::crc32c_finish(internal_transform::crc32c_extend(state, footer, kCovered));
  std::memcpy(footer + kCovered, &crc, 4);
  WriteOpenOptions open;
  open.truncate = false;
  DISTCKPT_ASSIGN_OR_RETURN(auto out, fs.open_writable(path, open));
  DISTCKPT_RETURN_IF_ERROR(out->write_at(footer, sizeof(footer), size).with_context(where));
  if (fsync) DISTCKPT_RETURN_IF_ERROR(out->sync().with_context(where));
  return out->close().with_context(where);
}

bool has_hdf5_footer(const ReadableFile& file, uint64_t size) {
  char footer[kCovered];
  if (size < kHdf5FooterBytes || !file.read_at(footer, sizeof(footer), size - kHdf5FooterBytes).ok()) return false;
  uint32_t version = 0;
  std::memcpy(&version, footer + 8, 4);
  return std::memcmp(footer, kMagic, sizeof(kMagic)) == 0 && version == kVersion;
}

Status check_hdf5_footer(const ReadableFile& file, uint64_t size, const proto::Index& index, const std::string& path) {
  const std::string where = "hdf5 '" + path + "'";
  if (size < kHdf5FooterBytes) return corruption(where + ": too short for distckpt's footer");
  char footer[kHdf5FooterBytes];
  DISTCKPT_RETURN_IF_ERROR(file.read_at(footer, sizeof(footer), size - kHdf5FooterBytes).with_context(where));
  uint32_t version = 0, recorded = 0;
  std::memcpy(&version, footer + 8, 4);
  std::memcpy(&recorded, footer + kCovered, 4);
  if (std::memcmp(footer, kMagic, sizeof(kMagic)) != 0 || version != kVersion)
    return corruption(where + ": its metadata records checksums, but distckpt's footer is missing or damaged (a "
                      "file opened for writing by another HDF5 program loses it)");
  std::vector<std::pair<uint64_t, uint64_t>> data;
  const uint64_t end = size - 4;
  for (const auto& t : index.tensors())
    for (const auto& c : t.chunks()) {
      if (c.length() == 0) continue;
      if (c.byte_offset() > size - kHdf5FooterBytes || c.length() > size - kHdf5FooterBytes - c.byte_offset())
        return corruption(where + ": tensor '" + t.name() + "' lies over distckpt's footer");
      data.emplace_back(c.byte_offset(), c.byte_offset() + c.length());
    }
  DISTCKPT_ASSIGN_OR_RETURN(uint32_t state, structure_state(file, end, std::move(data)));
  const uint32_t crc = internal_transform::crc32c_finish(state);
  if (crc != recorded)
    return corruption(where + ": its structure (the bytes outside the datasets' data): " +
                      internal_transform::crc32c_mismatch(crc, recorded));
  return Status();
}

}  // namespace distckpt::internal_format
