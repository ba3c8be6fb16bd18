// Helpers for the format readers: every format describes what it stores as a
// proto::Index, so that load, verify, inspect and convert share one path. A single file
// is a checkpoint with one file and, per tensor, chunks that are byte ranges of it
// (records of a .ckpt, the tensor's bytes in safetensors, the contiguous storage of an
// HDF5 dataset).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "distckpt/filesystem.h"
#include "distckpt/dtype.h"
#include "distckpt/layout.h"
#include "distckpt_index.pb.h"

namespace distckpt::internal_format {

// A single file opened for describing: kNotFound ("no checkpoint at ...") when missing.
struct OpenedFile {
  std::unique_ptr<ReadableFile> file;
  uint64_t size = 0;
};
Result<OpenedFile> open_single_file(FileSystem& fs, const std::string& path);

// Why the file at `path` is not a file of `format` at all although it has its
// extension ("a zip archive (a PyTorch or Lightning checkpoint?)", "a Python pickle",
// "text", ...), judged from its first bytes; nullopt when it could be one (including
// files too short to tell, which are damaged rather than foreign).
std::optional<std::string> foreign_reason(const struct FormatDriver& format, const ReadableFile& file, uint64_t size);
// The checks every single-file reader starts with: an empty file is damaged
// (kCorruption: the most common damage after a crash), a foreign one is not this
// format (kCorruption, "not a ... file: ...").
Status check_single_file_head(const struct FormatDriver& format, const ReadableFile& file, uint64_t size,
                              const std::string& path);

// Orders `found` tensors and applies distckpt's metadata (layouts at save, tensor
// order) when the file has it, checking that the metadata and the file agree on names,
// dtypes and shapes. Without metadata, `order` is kept. The result is checked as a
// native index is (validate_index): kCorruption otherwise.
Status attach_tensors(proto::Index& index, std::map<std::string, proto::Tensor> found,
                      const std::vector<std::string>& order, const std::optional<proto::Index>& meta,
                      const std::string& path);

// The description of a single file before its tensors are attached: distckpt's
// metadata when the file has it (step, epoch, info, layouts...), the format, the
// checksum kind, and the file itself (`file_name`, `size` bytes).
proto::Index describe_single_file(const std::optional<proto::Index>& meta, const std::string& format,
                                  const std::string& checksum, const std::string& file_name, uint64_t size);

// A tensor stored whole and contiguous: one chunk covering it, `length` bytes at
// `byte_offset` of file 0.
proto::Tensor whole_tensor(const std::string& name, DType dtype, const Shape& shape, uint64_t byte_offset,
                           uint64_t length);

// The metadata distckpt stores in single files: `index` without chunks and files.
proto::Index metadata_of(const proto::Index& index);

}  // namespace distckpt::internal_format
