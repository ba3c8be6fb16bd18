/// Element types of tensors that distckpt stores.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

namespace distckpt {

enum class DType : int {
  kFloat32 = 0, kFloat16, kBFloat16, kFloat64,
  kInt8, kInt16, kInt32, kInt64,
  kUInt8, kUInt16, kUInt32, kUInt64,
  kBool,
};

inline constexpr DType kAllDTypes[] = {
    DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64, DType::kInt8,
    DType::kInt16,   DType::kInt32,   DType::kInt64,    DType::kUInt8,   DType::kUInt16,
    DType::kUInt32,  DType::kUInt64,  DType::kBool};

/// The functions below are local, thread-safe and cannot fail; names are views of static
/// storage, valid for the life of the program.

/// Bytes per element (bool is one byte).
std::size_t dtype_size(DType t);
/// Canonical lower-case name: "float32", "bfloat16", "uint64", "bool", ...
std::string_view dtype_name(DType t);
/// Inverse of dtype_name; nullopt for an unknown name.
std::optional<DType> dtype_from_name(std::string_view name);

}  // namespace distckpt
