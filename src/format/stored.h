// Opening any checkpoint for reading: a native checkpoint directory (index.pb) or a
// single file in one of the integrated formats (.ckpt, .safetensors, .h5). Each is
// described by the same proto::Index, so load, verify, inspect and convert share one
// path: a single file is a checkpoint with one file and, per tensor, chunks that are
// byte ranges of it (records of a .ckpt, the tensor's bytes in safetensors, the
// contiguous storage of an HDF5 dataset).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "distckpt/checkpoint.h"
#include "distckpt/filesystem.h"
#include "distckpt_index.pb.h"

namespace distckpt::internal_format {

// The format a path holds: a directory is native; a file by its extension (.ckpt,
// .safetensors, .h5 / .hdf5), else by its first bytes. nullopt when neither tells.
std::optional<Format> detect_format(FileSystem& fs, const std::string& path);

// File extension of a single-file format, with the dot (".ckpt"); "" for native.
std::string_view format_extension(Format format);

// The description of the checkpoint at `path` (a directory or a file), validated
// (validate_index). kNotFound, kCorruption, kUnsupported, kIoError.
Result<proto::Index> read_stored_index(FileSystem& fs, const std::string& path);

// For format readers: orders `found` tensors and applies distckpt's metadata (layouts
// at save, tensor order) when the file has it, checking that the metadata and the file
// agree on names, dtypes and shapes. Without metadata, `order` is kept. The result is
// checked as a native index is (validate_index): kCorruption otherwise.
Status attach_tensors(proto::Index& index, std::map<std::string, proto::Tensor> found,
                      const std::vector<std::string>& order, const std::optional<proto::Index>& meta,
                      const std::string& path);

// For format readers: the description of a single file before its tensors are
// attached: distckpt's metadata when the file has it (step, epoch, info, layouts...),
// the format, the checksum kind, and the file itself (`file_name`, `size` bytes).
proto::Index describe_single_file(const std::optional<proto::Index>& meta, const std::string& format,
                                  const std::string& checksum, const std::string& file_name, uint64_t size);

// A tensor stored whole and contiguous: one chunk covering it, `length` bytes at
// `byte_offset` of file 0.
proto::Tensor whole_tensor(const std::string& name, DType dtype, const Shape& shape, uint64_t byte_offset,
                           uint64_t length);

// The metadata distckpt stores in single files: `index` without chunks and files.
proto::Index metadata_of(const proto::Index& index);

}  // namespace distckpt::internal_format
