// MindSpore's protobuf checkpoint (.ckpt), written and read as a stream of records.
//
// A .ckpt file is a serialized `Checkpoint { repeated Value value = 1; }` (schema in
// proto/mindspore_checkpoint.proto). Concatenated serialized Checkpoints parse as one,
// so MindSpore writes one `Value` record at a time and splits tensors over 512 MiB into
// several records with the same tag (rows split as numpy.array_split does); readers join
// consecutive records of a tag. An optional footer follows: "crc_num" and the zlib
// CRC-32 of everything before it, as 10 big-endian bytes.
//
// distckpt adds fields MindSpore does not know, which protobuf parsers skip: field 1000
// of Checkpoint, holding a serialized distckpt.proto.Index without chunks (step, epoch,
// commit sequence, layouts at save, typed info values, tensor order), first; after the
// records, field 1002 with each chunk's CRC32C. Files of distckpt 0.1.0 encrypted chunk by
// chunk carry field 1001 instead (nonces, tags and seal), and are still read; an
// encrypted file is now written whole in MindSpore's framing (framed_file.h).
// Info values are also written as MindSpore writes append info: scalar records
// (dims [0]) of type Int64, Float64, Bool or "str" (the text as numpy stores a str:
// UTF-32LE, which MindSpore's load_checkpoint decodes).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "distckpt/dtype.h"
#include "distckpt/filesystem.h"
#include "distckpt/layout.h"
#include "distckpt_index.pb.h"

namespace distckpt::internal_format {

inline constexpr uint64_t kCkptRecordBytes = uint64_t{512} << 20;  // MindSpore's SLICE_SIZE
inline constexpr uint32_t kCkptMetaField = 1000;
// An encrypted file's parameters, nonces and tags (proto::CkptEncryption).
inline constexpr uint32_t kCkptEncryptionField = 1001;
// The CRC32C of every chunk of an unencrypted file we write (proto::CkptChecks), after the
// records: MindSpore's footer is optional (crc_check), our files are always checked.
inline constexpr uint32_t kCkptChecksField = 1002;
inline constexpr std::size_t kCkptFooterBytes = 17;  // "crc_num" + 10 bytes

// MindSpore's tensor_type strings ("Float32", "BFloat16", "Bool", ...).
std::string_view ms_type_name(DType t);
std::optional<DType> ms_type_from_name(std::string_view name);

// Bytes of one record up to (not including) its tensor_content; `dims` as stored
// (scalars: {0}). The content must follow, exactly `content_bytes` long.
std::string ckpt_record_header(const std::string& tag, const Shape& dims, std::string_view type,
                               uint64_t content_bytes);
// A whole scalar or small record (info values).
std::string ckpt_record(const std::string& tag, const Shape& dims, std::string_view type, const std::string& content);
// numpy's str encoding (UTF-32LE) from UTF-8 text, and back (nullopt when invalid).
std::string utf8_to_utf32le(const std::string& s);
std::optional<std::string> utf32le_to_utf8(const std::string& s);
// The meta field (kCkptMetaField) holding `meta`.
std::string ckpt_meta_field(const proto::Index& meta);
std::string ckpt_footer(uint32_t crc32);
// The checks field (kCkptChecksField) holding `checks`.
std::string ckpt_checks_field(const proto::CkptChecks& checks);
// In a file distckpt 0.1.0 encrypted chunk by chunk, tensor records have this
// tensor_type (their dtype is in distckpt's metadata), so that readers which do not know
// about that encryption refuse them instead of loading ciphertext as weights.
inline constexpr const char* kCkptEncryptedType = "distckpt-encrypted";
// The bytes a chunk-encrypted file's seal authenticates: `meta_bytes` (the serialized
// metadata) and `encryption` without its seal (its plaintext is "distckpt ckpt").
std::string ckpt_sealed_aad(const std::string& meta_bytes, const proto::CkptEncryption& encryption);

// How a tensor of `shape` is split into records: element ranges [begin, end), split on
// dim 0 into ceil(bytes / 512 MiB) parts as numpy.array_split does (flat elements when
// dim 0 has fewer rows than parts). One range for small tensors.
std::vector<std::pair<int64_t, int64_t>> ckpt_record_ranges(const Shape& shape, std::size_t item_size);

struct CkptRecord {
  std::string tag, type;
  Shape dims;  // as stored
  uint64_t content_offset = 0, content_bytes = 0;
  std::string small_content;  // the content itself when at most 64 bytes (info values)
};
struct CkptScan {
  std::vector<CkptRecord> records;
  std::optional<proto::Index> meta;
  std::string meta_bytes;  // the meta field's bytes as stored (what an encrypted file's seal covers)
  std::optional<proto::CkptEncryption> encryption;
  std::optional<proto::CkptChecks> checks;
  uint32_t structure_crc32c = 0;  // with `checks`: the CRC32C of the structure before them
  uint64_t data_end = 0;           // where the records end (the footer starts)
  std::optional<uint32_t> footer;  // CRC-32 from the footer
};

// Reads the record structure (not the tensor bytes) of a .ckpt file of `size` bytes.
// Every length, dim and type is checked; kCorruption names the byte offset.
Result<CkptScan> scan_ckpt(const ReadableFile& file, uint64_t size, const std::string& path);

// The description of a scanned .ckpt as an index (format "ckpt", one file named
// `file_name`, a chunk per record). Without distckpt's meta field (a file written by
// MindSpore), scalar Int records tagged epoch_num / step_num give step and epoch and,
// with "str" records, become info values rather than tensors. An encrypted file (its
// encryption field present, written by distckpt with its meta field) is described with
// one chunk per box of each record, its stored (encrypted) length, nonce and tag.
Result<proto::Index> ckpt_index(const CkptScan& scan, const std::string& file_name, uint64_t size,
                                const std::string& path);

// The .ckpt writer (ckpt_writer.cc), for the format table.
struct WriterOptions;
class SequentialWriter;
Result<std::unique_ptr<SequentialWriter>> open_ckpt_writer(FileSystem& fs, const std::string& path,
                                                           const proto::Index& meta, const WriterOptions& options);

// The ckpt format's row of the format table (format.h).
const struct FormatDriver& ckpt_driver();

// distckpt's metadata field when it is the file's first field (as distckpt writes it),
// read alone; nullopt when the file starts otherwise (MindSpore's own files).
// kCorruption for a metadata field that does not parse or runs past `size`.
Result<std::optional<proto::Index>> read_leading_meta(const ReadableFile& file, uint64_t size, const std::string& path);

// The summary of a .ckpt encrypted whole and opened with its key (framed_file.h): its
// metadata (step, epoch, commit order, info values) and the file, without tensors; only
// the first block is decrypted, where describing the records would decrypt them all.
// Nullopt for any other file, or one whose metadata is not first.
Result<std::optional<proto::Index>> describe_framed_ckpt_summary(FileSystem& fs, const std::string& path);

}  // namespace distckpt::internal_format
