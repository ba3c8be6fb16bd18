// What the HDF5 format's reader and writer share: libhdf5's errors as messages,
// identifiers closed with their owners, dtypes as HDF5 types and back, attributes, the
// datasets of a file. Internal to src/format/hdf5/; every function is local and, as
// libhdf5 itself (a build without thread safety), for one thread at a time.
#pragma once

#include <hdf5.h>

#include <optional>
#include <string>
#include <vector>

#include "distckpt/dtype.h"
#include "distckpt/status.h"

namespace distckpt::internal_format::hdf5lib {

inline constexpr const char* kMetaAttr = "distckpt";

// HDF5's error stack (its own printing is turned off): the outermost message, and the
// operating system's reason when the innermost one carries it ("errno = 28, error
// message = 'No space left on device'"), so that a full disk says so.
struct ErrorWalk {
  std::string outer, os_reason;
};
inline herr_t collect_error(unsigned n, const H5E_error2_t* e, void* out) {
  auto* w = static_cast<ErrorWalk*>(out);
  if (e->desc == nullptr) return 0;
  const std::string desc = e->desc;
  if (n == 0) w->outer = desc;
  const auto at = desc.find("error message = '");
  if (at != std::string::npos) {
    const auto begin = at + 17;
    w->os_reason = desc.substr(begin, desc.find('\'', begin) - begin);
  }
  return 0;
}
inline std::string hdf5_message() {
  ErrorWalk walk;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect_error, &walk);
  H5Eclear2(H5E_DEFAULT);
  std::string msg = walk.outer.empty() ? "HDF5 error" : walk.outer;
  if (!walk.os_reason.empty()) msg += ": " + walk.os_reason;
  return msg;
}
inline void quiet_hdf5() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

// Closes an HDF5 identifier with the matching call when it goes out of scope.
class Id {
 public:
  Id() = default;
  Id(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  Id(Id&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = -1; }
  Id& operator=(Id&& o) noexcept {
    reset();
    id_ = o.id_;
    close_ = o.close_;
    o.id_ = -1;
    return *this;
  }
  ~Id() { reset(); }
  void reset() {
    if (id_ >= 0 && close_ != nullptr) close_(id_);
    id_ = -1;
  }
  hid_t get() const { return id_; }
  bool ok() const { return id_ >= 0; }
  hid_t release() {
    const hid_t id = id_;
    id_ = -1;
    return id;
  }

 private:
  hid_t id_ = -1;
  herr_t (*close_)(hid_t) = nullptr;
};

inline Id make_type(DType t) {
  switch (t) {
    case DType::kFloat32: return Id(H5Tcopy(H5T_IEEE_F32LE), H5Tclose);
    case DType::kFloat64: return Id(H5Tcopy(H5T_IEEE_F64LE), H5Tclose);
    case DType::kInt8: return Id(H5Tcopy(H5T_STD_I8LE), H5Tclose);
    case DType::kInt16: return Id(H5Tcopy(H5T_STD_I16LE), H5Tclose);
    case DType::kInt32: return Id(H5Tcopy(H5T_STD_I32LE), H5Tclose);
    case DType::kInt64: return Id(H5Tcopy(H5T_STD_I64LE), H5Tclose);
    case DType::kUInt8: return Id(H5Tcopy(H5T_STD_U8LE), H5Tclose);
    case DType::kUInt16: return Id(H5Tcopy(H5T_STD_U16LE), H5Tclose);
    case DType::kUInt32: return Id(H5Tcopy(H5T_STD_U32LE), H5Tclose);
    case DType::kUInt64: return Id(H5Tcopy(H5T_STD_U64LE), H5Tclose);
    case DType::kFloat16:
    case DType::kBFloat16: {
      Id id(H5Tcopy(H5T_IEEE_F32LE), H5Tclose);
      const bool half = t == DType::kFloat16;
      // sign bit 15; exponent at 10 (5 bits) or 7 (8 bits); mantissa from bit 0.
      H5Tset_fields(id.get(), 15, half ? 10 : 7, half ? 5 : 8, 0, half ? 10 : 7);
      H5Tset_size(id.get(), 2);
      H5Tset_ebias(id.get(), half ? 15 : 127);
      return id;
    }
    case DType::kBool: {
      Id id(H5Tenum_create(H5T_NATIVE_INT8), H5Tclose);
      int8_t no = 0, yes = 1;
      H5Tenum_insert(id.get(), "FALSE", &no);
      H5Tenum_insert(id.get(), "TRUE", &yes);
      return id;
    }
  }
  return Id();
}

// The dtype an HDF5 dataset type stores, when it is one distckpt can read by offset.
inline std::optional<DType> dtype_of(hid_t type) {
  for (DType t : kAllDTypes) {
    Id ours = make_type(t);
    if (H5Tequal(ours.get(), type) > 0) return t;
  }
  if (H5Tget_class(type) == H5T_ENUM && H5Tget_size(type) == 1) return DType::kBool;
  return std::nullopt;
}

inline Status write_string_attr(hid_t obj, const char* name, const std::string& value) {
  Id type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type.get(), value.empty() ? 1 : value.size());
  H5Tset_cset(type.get(), H5T_CSET_UTF8);
  Id space(H5Screate(H5S_SCALAR), H5Sclose);
  Id attr(H5Acreate2(obj, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  const std::string padded = value.empty() ? std::string(1, '\0') : value;
  if (!attr.ok() || H5Awrite(attr.get(), type.get(), padded.data()) < 0)
    return io_error(std::string("HDF5 attribute '") + name + "': " + hdf5_message());
  return Status();
}

template <typename T>
Status write_scalar_attr(hid_t obj, const std::string& name, hid_t type, const T& value, hsize_t count = 1) {
  Id space(count == 1 ? H5Screate(H5S_SCALAR) : H5Screate_simple(1, &count, nullptr), H5Sclose);
  Id attr(H5Acreate2(obj, name.c_str(), type, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (!attr.ok() || H5Awrite(attr.get(), type, &value) < 0)
    return io_error("HDF5 attribute '" + name + "': " + hdf5_message());
  return Status();
}

inline Status write_array_attr(hid_t obj, const char* name, const std::vector<int64_t>& values) {
  if (values.empty()) return Status();
  const hsize_t n = values.size();
  Id space(H5Screate_simple(1, &n, nullptr), H5Sclose);
  Id attr(H5Acreate2(obj, name, H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (!attr.ok() || H5Awrite(attr.get(), H5T_NATIVE_INT64, values.data()) < 0)
    return io_error(std::string("HDF5 attribute '") + name + "': " + hdf5_message());
  return Status();
}

struct VisitState {
  std::vector<std::string> datasets;
};
inline herr_t visit_object(hid_t, const char* name, const H5O_info_t* info, void* data) {
  if (info->type == H5O_TYPE_DATASET) static_cast<VisitState*>(data)->datasets.push_back(name);
  return 0;
}


}  // namespace distckpt::internal_format::hdf5lib
