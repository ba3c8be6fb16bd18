/// The formats a checkpoint can be stored in.
#pragma once

#include <optional>
#include <string_view>

namespace distckpt {

/// What a save writes.
///   kNative: a checkpoint directory (data files + index.pb).
///   kCkpt: one MindSpore-compatible protobuf .ckpt file (MindSpore's load_checkpoint
///     reads it; records over 512 MiB split as MindSpore does; optional CRC-32 footer).
///   kSafetensors: one .safetensors file (standard header, data 8-byte aligned).
///   kHdf5: one .h5 file, a dataset per tensor (h5py and h5dump read it).
/// ckpt and safetensors files are written by one rank from tensors reconstructed region
/// by region (gather_region); HDF5 files are laid out by rank 0 with HDF5 (contiguous
/// datasets), then every rank writes its unique slices at their datasets' offsets. All
/// are loaded by load() into any layout, each rank reading its slice.
enum class Format { kNative, kCkpt, kSafetensors, kHdf5 };

/// "native", "ckpt", "safetensors", "hdf5". The name functions of this header are local,
/// thread-safe and cannot fail; names are views of static storage.
std::string_view format_name(Format format);
/// Inverse of format_name (also accepts "h5"); nullopt for anything else.
std::optional<Format> format_from_name(std::string_view name);

/// What a checkpoint records to check its data with.
///   kCrc32c: a CRC32C per chunk (native checkpoints).
///   kNone: no per-chunk checksum in the index (single files, whose own checksums, where
///     the format has them, cover the file or whole tensors; native saves with
///     SaveOptions::checksum off).
enum class Checksum { kNone, kCrc32c };
std::string_view checksum_name(Checksum checksum);  ///< "none", "crc32c"

}  // namespace distckpt
