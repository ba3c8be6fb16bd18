#include "format/hdf5/hdf5_io.h"

#include <hdf5.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>

#include "base/strings.h"
#include "base/text.h"
#include "distckpt/package.h"
#include "format/describe.h"
#include "format/hdf5/hdf5_footer.h"
#include "format/format.h"
#include "format/metadata_json.h"
#include "format/native/index_codec.h"
#include "format/sequential_writer.h"
#include "layout/region.h"
#include "layout/tiling.h"
#include "transform/crc32c.h"

namespace distckpt::internal_format {

namespace {

constexpr const char* kMetaAttr = "distckpt";

// HDF5's error stack (its own printing is turned off): the outermost message, and the
// operating system's reason when the innermost one carries it ("errno = 28, error
// message = 'No space left on device'"), so that a full disk says so.
struct ErrorWalk {
  std::string outer, os_reason;
};
herr_t collect_error(unsigned n, const H5E_error2_t* e, void* out) {
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
std::string hdf5_message() {
  ErrorWalk walk;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect_error, &walk);
  H5Eclear2(H5E_DEFAULT);
  std::string msg = walk.outer.empty() ? "HDF5 error" : walk.outer;
  if (!walk.os_reason.empty()) msg += ": " + walk.os_reason;
  return msg;
}
void quiet_hdf5() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

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

Id make_type(DType t) {
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
std::optional<DType> dtype_of(hid_t type) {
  for (DType t : kAllDTypes) {
    Id ours = make_type(t);
    if (H5Tequal(ours.get(), type) > 0) return t;
  }
  if (H5Tget_class(type) == H5T_ENUM && H5Tget_size(type) == 1) return DType::kBool;
  return std::nullopt;
}

Status write_string_attr(hid_t obj, const char* name, const std::string& value) {
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

Status write_array_attr(hid_t obj, const char* name, const std::vector<int64_t>& values) {
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
herr_t visit_object(hid_t, const char* name, const H5O_info_t* info, void* data) {
  if (info->type == H5O_TYPE_DATASET) static_cast<VisitState*>(data)->datasets.push_back(name);
  return 0;
}

}  // namespace

namespace {

// Closing a file this process writes. H5Fclose flushes the metadata, and when that fails
// (a full disk), libhdf5 1.10 can never close the file: its metadata cache stays in a
// state every later flush refuses ("slist already enabled?"), and its teardown at exit
// or at MPI_Finalize crashed the process (SIGSEGV in H5F__close_cb) after the error was
// reported. So finish() reserves the metadata's places in the file first (fallocate),
// and where that fails, or the file is closed unfinished or after an error, the close
// writes to memory. Where fallocate is not supported (NFS, older Lustre) the metadata
// is flushed unreserved, as before.

// Points the file's descriptor at an anonymous memory file: what libhdf5 writes from
// then on (its metadata, at close) goes nowhere.
void divert_to_memory(hid_t file) {
  void* handle = nullptr;
  if (H5Fget_vfd_handle(file, H5P_DEFAULT, &handle) < 0 || handle == nullptr) return;
  int discard = ::memfd_create("distckpt-hdf5-discard", MFD_CLOEXEC);
  if (discard < 0) discard = ::open("/dev/shm", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (discard < 0) discard = ::open("/tmp", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (discard < 0) return;  // nothing to divert to: the close writes the real file
  while (::dup3(discard, *static_cast<int*>(handle), O_CLOEXEC) < 0 && (errno == EINTR || errno == EBUSY)) {
  }
  ::close(discard);
}

herr_t close_written_file(hid_t file, std::string* error, bool discard) {
  if (discard) divert_to_memory(file);
  if (H5Fclose(file) < 0) {
    if (error != nullptr) *error = hdf5_message();
    return -1;
  }
  return 0;
}

// As the file handle's closer, when a save fails before finish(): the metadata is not
// wanted, and a full disk must not break the file object (see Hdf5Writer::finish).
herr_t close_written_file(hid_t file) { return close_written_file(file, nullptr, true); }

}  // namespace

struct Hdf5Writer::Handles {
  Id file;
  std::vector<Id> datasets;
  std::vector<Id> types;
  Id dxpl;
};

Status check_hdf5_name(const std::string& name) {
  std::size_t start = 0;
  while (true) {
    const auto slash = name.find('/', start);
    const std::string part = name.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
    if (part.empty() || part == "." || part == "..")
      return invalid_argument("tensor '" + name + "' cannot be an HDF5 dataset path (empty, '.' or '..' component)");
    if (slash == std::string::npos) return Status();
    start = slash + 1;
  }
}

std::string hdf5_metadata_json(const proto::Index& meta, const std::vector<uint32_t>* crcs) {
  proto::Index with_crcs = meta;
  with_crcs.mutable_transforms()->set_checksum("crc32c");  // what the chunks below record
  for (int t = 0; t < with_crcs.tensors_size(); ++t) {
    proto::Tensor* tensor = with_crcs.mutable_tensors(t);
    tensor->clear_chunks();
    tensor->add_chunks()->set_crc32c(crcs != nullptr ? (*crcs)[static_cast<std::size_t>(t)] : 0xFFFFFFFFu);
  }
  std::string json = metadata_json(with_crcs);
  if (crcs != nullptr) json.resize(hdf5_metadata_json(meta, nullptr).size(), ' ');
  return json;
}

Result<std::unique_ptr<Hdf5Writer>> Hdf5Writer::create(const std::string& path, const proto::Index& meta) {
  quiet_hdf5();
  std::unique_ptr<Hdf5Writer> w(new Hdf5Writer());
  w->h_ = std::make_unique<Handles>();
  w->path_ = path;
  w->meta_ = meta;
  w->meta_json_ = hdf5_metadata_json(meta, nullptr);
  const std::string where = "hdf5 '" + path + "'";
  Id fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  // 1.8 object headers allow attributes over 64 KiB (the metadata of large models).
  H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V18, H5F_LIBVER_V18);
  // The POSIX driver, named: the file's descriptor is used below (reserve_metadata_space,
  // close_written_file). No sieve buffer: a small write held there would be written only
  // when its dataset closes, where libhdf5 ignores a failure (a full disk lost bytes).
  H5Pset_fapl_sec2(fapl.get());
  H5Pset_sieve_buf_size(fapl.get(), 0);
  // No clock in the bytes (object modification times), so equal content gives equal
  // files (reproducible published files): off for the root group, the groups and the
  // datasets alike.
  Id fcpl(H5Pcreate(H5P_FILE_CREATE), H5Pclose);
  H5Pset_obj_track_times(fcpl.get(), 0);
  // The file exists already, created owner-only by the catalog (catalog/commit.h): HDF5
  // would create it with the umask's mode.
  w->h_->file = Id(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, fcpl.get(), fapl.get()), close_written_file);
  if (!w->h_->file.ok()) return io_error(where + ": cannot create: " + hdf5_message());
  w->h_->dxpl = Id(H5Pcreate(H5P_DATASET_XFER), H5Pclose);
  Id lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  H5Pset_create_intermediate_group(lcpl.get(), 1);
  Id dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  H5Pset_layout(dcpl.get(), H5D_CONTIGUOUS);
  H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY);
  H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER);  // every byte is written by a slice
  H5Pset_obj_track_times(dcpl.get(), 0);
  Id gcpl(H5Pcreate(H5P_GROUP_CREATE), H5Pclose);
  H5Pset_obj_track_times(gcpl.get(), 0);
  // From here on a failure is kept for finish(), which reports it.
  Status& deferred = w->deferred_;
  auto keep = [&](Status st) {
    if (deferred.ok() && !st.ok()) deferred = std::move(st);
  };
  for (const auto& t : meta.tensors()) {
    const DType dtype = *dtype_from_name(t.dtype());
    std::vector<hsize_t> dims(t.global_shape().begin(), t.global_shape().end());
    Id space(dims.empty() ? H5Screate(H5S_SCALAR) : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
             H5Sclose);
    Id type = make_type(dtype);
    // The groups of "a/b/name" first, with our creation properties (the intermediate
    // groups HDF5 would create itself track times). Same calls on every rank.
    for (std::size_t slash = t.name().find('/'); slash != std::string::npos; slash = t.name().find('/', slash + 1)) {
      const std::string group = t.name().substr(0, slash);
      if (H5Lexists(w->h_->file.get(), group.c_str(), H5P_DEFAULT) > 0) continue;
      Id g(H5Gcreate2(w->h_->file.get(), group.c_str(), lcpl.get(), gcpl.get(), H5P_DEFAULT), H5Gclose);
      if (!g.ok()) keep(io_error(where + ": tensor '" + t.name() + "': cannot create group '" + group + "': " + hdf5_message()));
    }
    Id dset(H5Dcreate2(w->h_->file.get(), t.name().c_str(), type.get(), space.get(), lcpl.get(), dcpl.get(),
                       H5P_DEFAULT),
            H5Dclose);
    if (!dset.ok()) {
      keep(io_error(where + ": tensor '" + t.name() + "': cannot create its dataset: " + hdf5_message()));
    } else {
      keep(write_string_attr(dset.get(), "dtype", t.dtype()));
      keep(write_array_attr(dset.get(), "dev_mat", {t.layout().dev_mat().begin(), t.layout().dev_mat().end()}));
      keep(write_array_attr(dset.get(), "tensor_map", {t.layout().tensor_map().begin(), t.layout().tensor_map().end()}));
    }
    w->h_->datasets.push_back(std::move(dset));
    w->h_->types.push_back(std::move(type));
  }
  return w;
}

Hdf5Writer::~Hdf5Writer() = default;

void Hdf5Writer::set_crc32c(const std::vector<uint32_t>& crcs) { meta_json_ = hdf5_metadata_json(meta_, &crcs); }

Status record_hdf5_crc32c(const std::string& path, const proto::Index& meta, const std::vector<uint32_t>& crcs) {
  quiet_hdf5();
  const std::string where = "hdf5 '" + path + "': recording its checksums";
  if (crcs.size() != static_cast<std::size_t>(meta.tensors_size()))
    return internal_error(where + ": " + std::to_string(crcs.size()) + " CRCs for " +
                          std::to_string(meta.tensors_size()) + " tensors");
  const std::string json = hdf5_metadata_json(meta, &crcs);
  Id fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V18, H5F_LIBVER_V18);
  H5Pset_fapl_sec2(fapl.get());
  Id file(H5Fopen(path.c_str(), H5F_ACC_RDWR, fapl.get()), H5Fclose);
  if (!file.ok()) return io_error(where + ": cannot open: " + hdf5_message());
  Status st;
  {
    Id attr(H5Aopen(file.get(), kMetaAttr, H5P_DEFAULT), H5Aclose);
    Id type(attr.ok() ? H5Aget_type(attr.get()) : -1, H5Tclose);
    if (!attr.ok() || !type.ok()) {
      st = io_error(where + ": " + hdf5_message());
    } else if (H5Tget_size(type.get()) != json.size()) {
      st = internal_error(where + ": the attribute holds " + std::to_string(H5Tget_size(type.get())) +
                          " bytes, not the " + std::to_string(json.size()) + " reserved");
    } else if (H5Awrite(attr.get(), type.get(), json.data()) < 0) {
      st = io_error(where + ": " + hdf5_message());
    }
  }
  if (H5Fclose(file.release()) < 0 && st.ok()) st = io_error(where + ": closing: " + hdf5_message());
  return st;
}

uint64_t Hdf5Writer::dataset_bytes(int tensor) const {
  uint64_t bytes = dtype_size(*dtype_from_name(meta_.tensors(tensor).dtype()));
  for (int64_t d : meta_.tensors(tensor).global_shape()) bytes *= static_cast<uint64_t>(d);
  return bytes;
}

std::vector<std::pair<uint64_t, uint64_t>> Hdf5Writer::data_ranges() const {
  std::vector<std::pair<uint64_t, uint64_t>> data;  // [offset, end) of each dataset's bytes
  for (int t = 0; t < meta_.tensors_size() && static_cast<std::size_t>(t) < h_->datasets.size(); ++t) {
    const uint64_t bytes = dataset_bytes(t);
    const haddr_t at = bytes > 0 ? H5Dget_offset(h_->datasets[static_cast<std::size_t>(t)].get()) : HADDR_UNDEF;
    if (at != HADDR_UNDEF) data.emplace_back(at, at + bytes);
  }
  std::sort(data.begin(), data.end());
  return data;
}

Status Hdf5Writer::reserve_metadata_space(std::vector<std::pair<uint64_t, uint64_t>> data) {
  const hid_t file = h_->file.get();
  const std::string where = "hdf5 '" + path_ + "'";
  hsize_t end = 0;
  void* handle = nullptr;
  if (H5Fget_filesize(file, &end) < 0 || H5Fget_vfd_handle(file, H5P_DEFAULT, &handle) < 0 || handle == nullptr)
    return io_error(where + ": " + hdf5_message());
  const int fd = *static_cast<int*>(handle);
  bool unsupported = false;
  auto reserve = [&](uint64_t from, uint64_t to) -> Status {
    if (to <= from || unsupported) return Status();
    while (::fallocate(fd, FALLOC_FL_KEEP_SIZE, static_cast<off_t>(from), static_cast<off_t>(to - from)) != 0) {
      if (errno == EINTR) continue;
      if (errno == ENOSPC || errno == EDQUOT)
        return io_error(where + ": reserving room for its metadata: " + std::strerror(errno));
      unsupported = true;  // NFS, older Lustre, FUSE...: flushed unreserved, as before
      return Status();
    }
    return Status();
  };
  uint64_t at = 0;
  for (const auto& [from, to] : data) {
    DISTCKPT_RETURN_IF_ERROR(reserve(at, std::min<uint64_t>(from, end)));
    at = std::max(at, to);
  }
  DISTCKPT_RETURN_IF_ERROR(reserve(at, end));
  // The close also places heap blocks (dense links and attributes: a group of more than 8
  // tensors, the metadata attribute over 64 KiB) past today's end: room for them too.
  reserved_end_ = end + kCloseSlack + 2 * meta_json_.size() + 512 * static_cast<uint64_t>(meta_.tensors_size());
  return reserve(std::max<uint64_t>(at, end), reserved_end_);
}

void Hdf5Writer::trim_reserved_tail() {
  // The room reserved past the file's final end is given back (ext4 and XFS keep it).
  if (reserved_end_ == 0) return;
  const int fd = ::open(path_.c_str(), O_WRONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return;
  struct stat st;
  if (::fstat(fd, &st) == 0 && static_cast<uint64_t>(st.st_size) < reserved_end_)
    (void)::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, st.st_size,
                      static_cast<off_t>(reserved_end_ - static_cast<uint64_t>(st.st_size)));
  ::close(fd);
}

Result<std::vector<uint64_t>> Hdf5Writer::data_offsets() const {
  DISTCKPT_RETURN_IF_ERROR(deferred_);
  std::vector<uint64_t> offsets;
  for (int t = 0; t < meta_.tensors_size(); ++t) {
    const hid_t dset = h_->datasets[static_cast<std::size_t>(t)].get();
    const haddr_t at = dataset_bytes(t) > 0 ? H5Dget_offset(dset) : 0;
    if (at == HADDR_UNDEF)
      return io_error("hdf5 '" + path_ + "': tensor '" + meta_.tensors(t).name() + "': its storage has no offset");
    offsets.push_back(static_cast<uint64_t>(at));
  }
  return offsets;
}

Status Hdf5Writer::write(int tensor, const std::vector<std::pair<Box, const void*>>& pieces) {
  const int rounds = static_cast<int>(pieces.size());
  const hid_t dset = h_->datasets[static_cast<std::size_t>(tensor)].get();
  const hid_t type = h_->types[static_cast<std::size_t>(tensor)].get();
  if (dset < 0) return deferred_;  // creation failed on every rank alike (collective)
  const std::string where = "hdf5 '" + path_ + "': tensor '" + meta_.tensors(tensor).name() + "'";
  Status status;
  for (int r = 0; r < rounds; ++r) {
    Id fspace(H5Dget_space(dset), H5Sclose);
    Id mspace;
    const void* data = nullptr;
    const bool mine = r < static_cast<int>(pieces.size()) && pieces[static_cast<std::size_t>(r)].first.num_elements() > 0;
    if (mine) {
      const Box& box = pieces[static_cast<std::size_t>(r)].first;
      data = pieces[static_cast<std::size_t>(r)].second;
      if (box.shape.empty()) {
        mspace = Id(H5Screate(H5S_SCALAR), H5Sclose);
        H5Sselect_all(fspace.get());
      } else {
        std::vector<hsize_t> start(box.offset.begin(), box.offset.end()), count(box.shape.begin(), box.shape.end());
        mspace = Id(H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr), H5Sclose);
        H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr);
      }
    } else {
      continue;  // an empty piece
    }
    if (H5Dwrite(dset, type, mspace.get(), fspace.get(), h_->dxpl.get(), data) < 0 && status.ok())
      status = io_error(where + ": write failed: " + hdf5_message());
  }
  return status;
}

Status Hdf5Writer::finish() {
  const hid_t file = h_->file.get();
  const std::string where = "hdf5 '" + path_ + "'";
  // Attributes in a fixed order (info values sorted by key): equal metadata, equal files.
  Status st = deferred_;
  auto keep = [&](Status s) {
    if (st.ok() && !s.ok()) st = std::move(s);
  };
  keep(write_string_attr(file, kMetaAttr, meta_json_));
  if (meta_.step() >= 0) keep(write_scalar_attr(file, "step_num", H5T_NATIVE_INT64, meta_.step()));
  if (meta_.epoch() >= 0) keep(write_scalar_attr(file, "epoch_num", H5T_NATIVE_INT64, meta_.epoch()));
  for (const auto& [key, value] : info_values(meta_)) {
    if (key == kMetaAttr || key == "step_num" || key == "epoch_num") continue;
    if (auto* i = std::get_if<int64_t>(&value)) {
      keep(write_scalar_attr(file, key, H5T_NATIVE_INT64, *i));
    } else if (auto* d = std::get_if<double>(&value)) {
      keep(write_scalar_attr(file, key, H5T_NATIVE_DOUBLE, *d));
    } else if (auto* b = std::get_if<bool>(&value)) {
      Id type = make_type(DType::kBool);
      const int8_t v = *b ? 1 : 0;
      keep(write_scalar_attr(file, key, type.get(), v));
    } else {
      keep(write_string_attr(file, key.c_str(), std::get<std::string>(value)));
    }
  }
  // The datasets' places are read before they close; each close is checked.
  std::vector<std::pair<uint64_t, uint64_t>> data = data_ranges();
  for (Id& dataset : h_->datasets)
    if (H5Dclose(dataset.release()) < 0) keep(io_error(where + ": closing a dataset: " + hdf5_message()));
  h_->datasets.clear();
  h_->types.clear();
  h_->dxpl.reset();
  // Closed explicitly to see the error: closing flushes the metadata, into places
  // reserved first (see close_written_file). After any error the file is given up.
  if (st.ok()) keep(reserve_metadata_space(std::move(data)));
  std::string close_error;
  if (close_written_file(h_->file.release(), &close_error, !st.ok()) < 0)
    keep(io_error(where + ": writing its metadata failed: " + close_error));
  if (st.ok()) trim_reserved_tail();
  return st.with_context(where);
}

Result<proto::Index> hdf5_index(const std::string& path, const std::string& file_name) {
  quiet_hdf5();
  const std::string where = "hdf5 '" + path + "'";
  if (H5Fis_hdf5(path.c_str()) <= 0) {
    FILE* f = std::fopen(path.c_str(), "rb");
    if (f == nullptr) return not_found(where + ": no such file");
    std::fclose(f);
    return corruption(where + ": not an HDF5 file HDF5 can open (truncated or damaged?)");
  }
  Id file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!file.ok()) return corruption(where + ": cannot open: " + hdf5_message());
  hsize_t size = 0;
  if (H5Fget_filesize(file.get(), &size) < 0) return corruption(where + ": " + hdf5_message());

  proto::Index index;
  std::optional<proto::Index> meta;
  if (H5Aexists(file.get(), kMetaAttr) > 0) {
    Id attr(H5Aopen(file.get(), kMetaAttr, H5P_DEFAULT), H5Aclose);
    Id type(H5Aget_type(attr.get()), H5Tclose);
    if (H5Tget_class(type.get()) != H5T_STRING || H5Tis_variable_str(type.get()) > 0)
      return corruption(where + ": attribute 'distckpt' is not a fixed-length string");
    const std::size_t n = H5Tget_size(type.get());
    if (n > size) return corruption(where + ": attribute 'distckpt' claims more bytes than the file has");
    std::string json(n, '\0');
    if (H5Aread(attr.get(), type.get(), json.data()) < 0) return corruption(where + ": " + hdf5_message());
    json.resize(json.find('\0') == std::string::npos ? n : json.find('\0'));
    DISTCKPT_ASSIGN_OR_RETURN(meta, parse_metadata_json(json, where + ": attribute 'distckpt'"));
  }
  // Files we write record a CRC32C per dataset (hdf5_metadata_json): all or none.
  std::map<std::string, uint32_t> recorded_crcs;
  if (meta) {
    for (const auto& t : meta->tensors()) {
      if (t.chunks_size() > 1)
        return corruption(where + ": attribute 'distckpt': tensor '" + internal_base::printable(t.name()) + "' has " +
                          std::to_string(t.chunks_size()) + " chunks; a dataset has one");
      if (t.chunks_size() == 1 && !recorded_crcs.emplace(t.name(), t.chunks(0).crc32c()).second)
        return corruption(where + ": attribute 'distckpt' describes tensor '" + internal_base::printable(t.name()) +
                          "' twice");
    }
    if (!recorded_crcs.empty() && recorded_crcs.size() != static_cast<std::size_t>(meta->tensors_size()))
      return corruption(where + ": attribute 'distckpt' records checksums for some tensors only");
  }
  const bool checked = meta && meta->tensors_size() > 0 && !recorded_crcs.empty();
  index = describe_single_file(meta, "hdf5", checked ? "crc32c" : "none", file_name, size);

  VisitState visit;
  if (H5Ovisit2(file.get(), H5_INDEX_NAME, H5_ITER_NATIVE, visit_object, &visit, H5O_INFO_BASIC) < 0)
    return corruption(where + ": cannot list its datasets: " + hdf5_message());
  std::map<std::string, proto::Tensor> found;
  std::vector<std::pair<haddr_t, std::string>> order;
  for (const std::string& name : visit.datasets) {
    const std::string tw = where + ": dataset '" + internal_base::printable(name) + "'";
    Id dset(H5Dopen2(file.get(), name.c_str(), H5P_DEFAULT), H5Dclose);
    if (!dset.ok()) return corruption(tw + ": " + hdf5_message());
    Id type(H5Dget_type(dset.get()), H5Tclose);
    const auto dtype = dtype_of(type.get());
    if (!dtype) return unsupported(tw + ": its element type is not one distckpt reads (little-endian numbers, bool)");
    Id dcpl(H5Dget_create_plist(dset.get()), H5Pclose);
    if (H5Pget_layout(dcpl.get()) != H5D_CONTIGUOUS)
      return unsupported(tw + ": chunked or compact storage (rewrite it contiguous: h5repack -l CONTI)");
    Id space(H5Dget_space(dset.get()), H5Sclose);
    const int rank = H5Sget_simple_extent_ndims(space.get());
    if (rank < 0 || rank > 64) return corruption(tw + ": bad dataspace");
    std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
    H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
    Shape shape(dims.begin(), dims.end());
    const auto count = internal_layout::checked_num_elements(shape);
    if (!count) return corruption(tw + ": its shape overflows");
    const uint64_t bytes = static_cast<uint64_t>(*count) * dtype_size(*dtype);
    const haddr_t offset = H5Dget_offset(dset.get());
    if (bytes > 0 && offset == HADDR_UNDEF) return corruption(tw + ": has no data stored");
    order.emplace_back(bytes > 0 ? offset : 0, name);
    proto::Tensor t = whole_tensor(name, *dtype, shape, bytes > 0 ? offset : 0, bytes);
    if (auto crc = recorded_crcs.find(name); crc != recorded_crcs.end()) t.mutable_chunks(0)->set_crc32c(crc->second);
    found.emplace(name, std::move(t));
  }
  std::sort(order.begin(), order.end());
  std::vector<std::string> names;
  for (const auto& o : order) names.push_back(o.second);
  DISTCKPT_RETURN_IF_ERROR(attach_tensors(index, std::move(found), names, meta, path));
  return index;
}

namespace {

bool sniff_hdf5(std::string_view head) { return head.substr(0, 8) == std::string_view("\x89HDF\r\n\x1a\n", 8); }

// libhdf5 parses a damaged or hostile file at the risk of crashing or looping (its
// decoders trust what they read). So a separate program, distckpt-hdf5-reader, reads
// the file: its crash, or no answer within kParseSeconds, becomes kCorruption here
// instead of taking the caller (a training job's rank 0, `distckpt ls`) down with it.
//
// It is started with posix_spawn, which execs at once, not fork alone. A forked copy
// of a threaded process inherits every lock another thread held at the fork: with
// ranks as threads, GCC 12's AddressSanitizer allocator hung a child (its fork takes
// no allocator lock), and libhdf5 state another thread was changing, or MPI calls in
// libhdf5's first initialization, hang it too. Nor does a training process of many
// GiB, with memory registered for RDMA, copy its page tables (Open MPI warns against
// fork there).
constexpr int kParseSeconds = 60;
// The request and answer format between this file and the reader program: both sides
// are built from this file, and the reader refuses any other number.
constexpr const char* kReaderProtocol = "3";

// An answer: its length (8 bytes, little-endian), then "I" and the serialized index, or
// "S", the status code's byte and the message.
constexpr std::size_t kAnswerPrefix = 8;

std::string encode_reader_answer(const Result<proto::Index>& index) {
  std::string body = index.ok() ? "I" + index->SerializeAsString()
                                : "S" + std::string(1, static_cast<char>(index.status().code())) + index.status().message();
  const uint64_t length = body.size();
  std::string out(kAnswerPrefix, '\0');
  std::memcpy(out.data(), &length, kAnswerPrefix);
  return out + body;
}

// A program found (not named by the user) is started only if it is the user's or root's
// and no other user may change it: a build tree's path compiled in may no longer be the
// same directory.
bool trusted_program(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || ::access(path.c_str(), X_OK) != 0) return false;
  return (st.st_uid == 0 || st.st_uid == ::geteuid()) && (st.st_mode & S_IWOTH) == 0;
}

// set_hdf5_reader_path's (a consumer's package). Built on first use: it is called from
// other translation units' static initializers, which may run before this one's.
struct RegisteredReader {
  std::mutex mu;
  std::string path;
};
RegisteredReader& registered_reader() {
  static RegisteredReader r;
  return r;
}

// The reader program's path: $DISTCKPT_HDF5_READER; else the one a program built against
// an installed package registered (package.h); else an installed program's own
// (libexec/distckpt/ beside its bin/, wherever the install was moved); else this build
// tree's; else where the install was configured to go.
Result<std::string> hdf5_reader_path(const std::string& where) {
  if (const char* env = std::getenv("DISTCKPT_HDF5_READER"); env != nullptr && *env != '\0') {
    if (::access(env, X_OK) == 0) return std::string(env);
    const int saved_errno = errno;
    return not_found(where + ": DISTCKPT_HDF5_READER='" + env + "' is not an executable program: " +
                     std::strerror(saved_errno));
  }
  std::vector<std::string> candidates;
  {
    RegisteredReader& r = registered_reader();
    std::lock_guard<std::mutex> lock(r.mu);
    if (!r.path.empty()) candidates.push_back(r.path);
  }
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n > 0) {
    const std::string program(self, static_cast<std::size_t>(n));
    const std::size_t slash = program.rfind('/');
    if (slash != std::string::npos)
      candidates.push_back(program.substr(0, slash) + "/" + DISTCKPT_HDF5_READER_FROM_BINDIR);
  }
  candidates.push_back(DISTCKPT_HDF5_READER_BUILD_PATH);
  candidates.push_back(DISTCKPT_HDF5_READER_INSTALL_PATH);
  std::string tried;
  for (const std::string& candidate : candidates) {
    if (trusted_program(candidate)) return candidate;
    tried += (tried.empty() ? "" : ", ") + candidate;
  }
  return not_found(where + ": its reader program distckpt-hdf5-reader is at none of " + tried +
                   " (or not executable, or writable by other users; set DISTCKPT_HDF5_READER to where it is)");
}

// Starts the reader with its standard output on `out_fd`, standard input /dev/null and
// no other inherited descriptor beside stderr; no signal ignored or blocked.
Result<pid_t> spawn_reader(const std::string& program, const std::string& path, const std::string& file_name,
                           int out_fd, const std::string& where) {
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  if (::posix_spawn_file_actions_init(&actions) != 0) return io_error(where + ": posix_spawn: out of memory");
  if (::posix_spawnattr_init(&attr) != 0) {
    ::posix_spawn_file_actions_destroy(&actions);
    return io_error(where + ": posix_spawn: out of memory");
  }
  sigset_t none, defaults;
  sigemptyset(&none);
  sigfillset(&defaults);  // every signal the caller ignores is default again there
  int err = ::posix_spawn_file_actions_adddup2(&actions, out_fd, STDOUT_FILENO);
  if (err == 0) err = ::posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  if (err == 0) err = ::posix_spawn_file_actions_addclosefrom_np(&actions, STDERR_FILENO + 1);
  if (err == 0) err = ::posix_spawnattr_setsigmask(&attr, &none);
  if (err == 0) err = ::posix_spawnattr_setsigdefault(&attr, &defaults);
  if (err == 0) err = ::posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  std::vector<char*> argv = {const_cast<char*>("distckpt-hdf5-reader"), const_cast<char*>("--protocol"),
                             const_cast<char*>(kReaderProtocol), const_cast<char*>(path.c_str()),
                             const_cast<char*>(file_name.c_str()), nullptr};
  pid_t child = -1;
  if (err == 0) err = ::posix_spawn(&child, program.c_str(), &actions, &attr, argv.data(), environ);
  ::posix_spawn_file_actions_destroy(&actions);
  ::posix_spawnattr_destroy(&attr);
  if (err != 0) return io_error(where + ": cannot start its reader " + program + ": " + std::strerror(err));
  return child;
}

// The reader's last answer in this process, kept with the identity and change times of
// the file it read: `verify`, `inspect` and a load of one file start the reader once. A
// file changed since (written, truncated, replaced) is read again. One answer, so the
// memory kept is one index.
struct FileVersion {
  std::string path, file_name;
  dev_t dev = 0;
  ino_t ino = 0;
  off_t size = 0;
  int64_t mtime_ns = 0, ctime_ns = 0;
  bool operator==(const FileVersion&) const = default;
};

std::optional<FileVersion> file_version(const std::string& path, const std::string& file_name) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  return FileVersion{path,
                     file_name,
                     st.st_dev,
                     st.st_ino,
                     st.st_size,
                     st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec,
                     st.st_ctim.tv_sec * 1000000000LL + st.st_ctim.tv_nsec};
}

struct LastAnswer {
  std::mutex mu;
  std::optional<FileVersion> version;
  Result<proto::Index> answer = internal_error("no answer yet");
};

LastAnswer& last_answer() {
  static LastAnswer* last = new LastAnswer();  // never destroyed: readers may run at exit
  return *last;
}

Result<proto::Index> spawned_hdf5_index(const std::string& path, const std::string& file_name, bool& answered);

Result<proto::Index> isolated_hdf5_index(const std::string& path, const std::string& file_name) {
  const std::optional<FileVersion> before = file_version(path, file_name);
  LastAnswer& last = last_answer();
  if (before) {
    std::lock_guard<std::mutex> lock(last.mu);
    if (last.version == before) return last.answer;
  }
  // Kept: an index, or damage the reader found; not an error that may pass (a missing
  // file, the reader out of memory). Nor the answer for a file changed within the last
  // second, which a write in the same timestamp tick could change unseen.
  bool answered = false;
  Result<proto::Index> answer = spawned_hdf5_index(path, file_name, answered);
  const bool lasting = answer.ok() || answer.status().code() == StatusCode::kCorruption ||
                       answer.status().code() == StatusCode::kUnsupported;
  struct timespec now;
  ::clock_gettime(CLOCK_REALTIME, &now);
  const bool settled =
      before && now.tv_sec * 1000000000LL + now.tv_nsec - std::max(before->mtime_ns, before->ctime_ns) > 1000000000LL;
  if (answered && lasting && settled && file_version(path, file_name) == before) {
    std::lock_guard<std::mutex> lock(last.mu);
    last.version = before;
    last.answer = answer;
  }
  return answer;
}

// One start of the reader. `answered`: the reader answered (an index or the error it
// found), as opposed to crashing, timing out or not starting, which may not repeat.
Result<proto::Index> spawned_hdf5_index(const std::string& path, const std::string& file_name, bool& answered) {
  const std::string where = "hdf5 '" + path + "'";
  DISTCKPT_ASSIGN_OR_RETURN(std::string program, hdf5_reader_path(where));
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return io_error(where + ": pipe: " + std::strerror(errno));
  if (fds[1] <= STDERR_FILENO) {  // a caller without stdin, stdout or stderr: keep clear of them
    const int moved = ::fcntl(fds[1], F_DUPFD_CLOEXEC, STDERR_FILENO + 1);
    const int saved_errno = errno;
    ::close(fds[1]);
    if (moved < 0) {
      ::close(fds[0]);
      return io_error(where + ": fcntl: " + std::strerror(saved_errno));
    }
    fds[1] = moved;
  }
  Result<pid_t> spawned = spawn_reader(program, path, file_name, fds[1], where);
  ::close(fds[1]);
  if (!spawned.ok()) {
    ::close(fds[0]);
    return spawned.status();
  }
  const pid_t child = *spawned;
  // The answer is complete when its length prefix says so, not at end of file: a fork
  // another thread made meanwhile (a data loader's worker) may hold the pipe open.
  std::string in;
  char buf[65536];
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kParseSeconds);
  auto ms_left = [&] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
  };
  auto complete = [&] {
    if (in.size() < kAnswerPrefix) return false;
    uint64_t length = 0;
    std::memcpy(&length, in.data(), kAnswerPrefix);
    return in.size() - kAnswerPrefix >= length;
  };
  bool timed_out = false;
  while (!complete()) {
    const auto left = ms_left();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    struct pollfd p{fds[0], POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(left));
    if (ready <= 0) continue;  // EINTR, or the deadline (checked above)
    const ssize_t n = ::read(fds[0], buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    in.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fds[0]);
  // Reaped within the same deadline (the reader exits right after its answer).
  int wstatus = 0;
  bool reaped = false, gone = false;  // gone: reaped by no one we can ask (SIGCHLD ignored)
  while (!timed_out && !reaped && !gone) {
    const pid_t r = ::waitpid(child, &wstatus, WNOHANG);
    if (r == child) reaped = true;
    else if (r < 0 && errno != EINTR) gone = true;
    else if (ms_left() <= 0) timed_out = true;
    else if (r == 0) ::usleep(1000);
  }
  if (!reaped && !gone) {
    ::kill(child, SIGKILL);
    while (::waitpid(child, &wstatus, 0) < 0 && errno == EINTR) {
    }
  }
  if (timed_out) return corruption(where + ": HDF5 found no end to it in " + std::to_string(kParseSeconds) + " s");
  if (!complete()) {
    if (reaped && WIFSIGNALED(wstatus))
      return corruption(where + ": libhdf5 crashed reading it (signal " + std::to_string(WTERMSIG(wstatus)) +
                        "): a damaged or hostile file");
    if (reaped && WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 2)
      return internal_error(where + ": the reader " + program +
                            " refused the request (exit 2): a reader from another build? (DISTCKPT_HDF5_READER)");
    return corruption(where + ": reading it failed (the reader " + program +
                      (reaped && WIFEXITED(wstatus) ? " exited " + std::to_string(WEXITSTATUS(wstatus))
                                                    : std::string(" ended without an answer")) +
                      ")");
  }
  const std::string_view answer = std::string_view(in).substr(kAnswerPrefix);
  if (answer.size() >= 2 && answer[0] == 'S') {
    const int code = static_cast<unsigned char>(answer[1]);
    static_assert(static_cast<int>(StatusCode::kAborted) == 11, "the last StatusCode: update the check below");
    if (code == 0 || code > static_cast<int>(StatusCode::kAborted))
      return internal_error(where + ": the reader answered an unknown status code " + std::to_string(code));
    answered = true;
    return Status(static_cast<StatusCode>(code), std::string(answer.substr(2)));
  }
  proto::Index index;
  if (answer.empty() || answer[0] != 'I' ||
      !index.ParseFromArray(answer.data() + 1, static_cast<int>(answer.size() - 1)))
    return internal_error(where + ": the reader's answer does not parse");
  answered = true;
  return index;
}

Result<proto::Index> describe_hdf5(FileSystem& fs, const std::string& path) {
  DISTCKPT_ASSIGN_OR_RETURN(OpenedFile opened, open_single_file(fs, path));
  DISTCKPT_RETURN_IF_ERROR(check_single_file_head(hdf5_driver(), *opened.file, opened.size, path));
  DISTCKPT_ASSIGN_OR_RETURN(proto::Index index, isolated_hdf5_index(path, internal_base::base_name(path)));
  // A file this version of distckpt wrote (its attribute records the writer's version,
  // or its datasets' CRC32C, or the footer is there) has both: the datasets' CRC32C (if
  // it has datasets) and the footer over the rest. Damage to one must not make it pass
  // for another writer's unchecked file.
  const bool ours = has_chunk_checksums(index) || !index.writer_version().empty() ||
                    has_hdf5_footer(*opened.file, opened.size);
  if (!ours) return index;
  if (!has_chunk_checksums(index) && index.tensors_size() > 0)
    return corruption("hdf5 '" + path + "': distckpt wrote it, but its 'distckpt' attribute, which records the "
                      "checksums, is missing or damaged");
  DISTCKPT_RETURN_IF_ERROR(check_hdf5_footer(*opened.file, opened.size, index, path));
  index.mutable_transforms()->set_checksum("crc32c");  // with no dataset: the structure checked
  return index;
}

Status check_hdf5_writable(const proto::Index& meta) {
  for (const auto& t : meta.tensors()) DISTCKPT_RETURN_IF_ERROR(check_hdf5_name(t.name()));
  return Status();
}

// An HDF5 file written by this process alone (serial driver), as a sequential writer:
// each append is written as the boxes of its element range (whole rows when the pieces
// are whole rows, as conversions read them).
class Hdf5SequentialWriter final : public SequentialWriter {
 public:
  Hdf5SequentialWriter(FileSystem& fs, std::string path, std::unique_ptr<Hdf5Writer> writer, proto::Index meta)
      : fs_(fs),
        path_(std::move(path)),
        writer_(std::move(writer)),
        meta_(std::move(meta)),
        progress_(meta_),
        crcs_(static_cast<std::size_t>(meta_.tensors_size()), internal_transform::kCrc32cInit) {}
  Status append(int tensor, const void* data, std::size_t n) override {
    DISTCKPT_ASSIGN_OR_RETURN(uint64_t at, progress_.advance(tensor, n));
    const proto::Tensor& t = meta_.tensors(tensor);
    const std::size_t item = dtype_size(*dtype_from_name(t.dtype()));
    if (n == 0) return Status();
    // Appends come in the dataset's byte order (Progress checks it).
    crcs_[static_cast<std::size_t>(tensor)] = internal_transform::crc32c_extend(crcs_[static_cast<std::size_t>(tensor)], data, n);
    if (at % item != 0 || n % item != 0)
      return internal_error("hdf5 writer: a piece of tensor '" + t.name() + "' is not whole elements");
    const Shape shape(t.global_shape().begin(), t.global_shape().end());
    const auto* p = static_cast<const char*>(data);
    for (const Box& box : internal_layout::flat_range_to_boxes(shape, static_cast<int64_t>(at / item),
                                                               static_cast<int64_t>((at + n) / item))) {
      DISTCKPT_RETURN_IF_ERROR(writer_->write(tensor, {{box, p}}));
      p += static_cast<std::size_t>(box.num_elements()) * item;
    }
    bytes_written_ += n;
    return Status();
  }
  Result<proto::Index> finish(bool fsync) override {
    DISTCKPT_RETURN_IF_ERROR(progress_.check_complete());
    for (uint32_t& crc : crcs_) crc = internal_transform::crc32c_finish(crc);
    writer_->set_crc32c(crcs_);
    DISTCKPT_ASSIGN_OR_RETURN(std::vector<uint64_t> offsets, writer_->data_offsets());
    DISTCKPT_RETURN_IF_ERROR(writer_->finish());
    writer_.reset();
    DISTCKPT_RETURN_IF_ERROR(append_hdf5_footer(fs_, path_, meta_, offsets, fsync));
    return meta_;
  }

 private:
  FileSystem& fs_;
  std::string path_;
  std::unique_ptr<Hdf5Writer> writer_;
  proto::Index meta_;
  Progress progress_;
  std::vector<uint32_t> crcs_;  // per tensor, of the bytes appended so far
};

Result<std::unique_ptr<SequentialWriter>> open_hdf5_writer(FileSystem& fs, const std::string& path,
                                                           const proto::Index& meta, const WriterOptions&) {
  DISTCKPT_ASSIGN_OR_RETURN(auto writer, Hdf5Writer::create(path, meta));
  return std::unique_ptr<SequentialWriter>(new Hdf5SequentialWriter(fs, path, std::move(writer), meta));
}

constexpr std::string_view kHdf5Extensions[] = {".h5", ".hdf5"};

}  // namespace

int hdf5_reader_main(int argc, char** argv) {
  if (argc != 5 || std::string_view(argv[1]) != "--protocol") {
    std::fprintf(stderr, "usage: distckpt-hdf5-reader --protocol %s FILE NAME (distckpt starts it; see hdf5_io.h)\n",
                 kReaderProtocol);
    return 2;
  }
  if (std::string_view(argv[2]) != kReaderProtocol) {
    std::fprintf(stderr, "distckpt-hdf5-reader: asked for protocol %s, speaks %s: a reader from another build\n",
                 argv[2], kReaderProtocol);
    return 2;
  }
  // Limits of its own, should its caller be gone: killed with the thread that started
  // it, and by an alarm past the caller's deadline; and the first to go when memory runs
  // out, not the training process beside it.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() == 1) return 3;  // the caller died before the line above
  ::alarm(kParseSeconds + 10);
  if (FILE* oom = std::fopen("/proc/self/oom_score_adj", "w")) {
    std::fputs("1000", oom);
    std::fclose(oom);
  }
  // The answer goes to the pipe alone (a descriptor above stderr), and whatever a library
  // prints to stderr, which is /dev/null if the caller had none.
  if (::fcntl(STDERR_FILENO, F_GETFD) < 0 && ::open("/dev/null", O_WRONLY) != STDERR_FILENO) return 3;
  const int answer_fd = ::fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, STDERR_FILENO + 1);
  if (answer_fd < 0 || ::dup2(STDERR_FILENO, STDOUT_FILENO) < 0) return 3;
  H5PLset_loading_state(0);  // no filter plugin is loaded for a file's sake
  const std::string out = encode_reader_answer(hdf5_index(argv[3], argv[4]));
  for (std::size_t done = 0; done < out.size();) {
    const ssize_t w = ::write(answer_fd, out.data() + done, out.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return 3;
    done += static_cast<std::size_t>(w);
  }
  // No exit-time work after the answer is out (libhdf5's teardown of what a hostile file
  // built), so that the exit status is the answer's.
  ::_exit(0);
}

const FormatDriver& hdf5_driver() {
  static const FormatDriver kRow{
      .id = Format::kHdf5,
      .name = "hdf5",
      .extension = ".h5",
      .read_extensions = kHdf5Extensions,
      .single_file = true,
      .carries_encryption = false,
      .chunk_checksums = false,
      .sniff = sniff_hdf5,
      .describe = describe_hdf5,
      .check_writable = check_hdf5_writable,
      .add_format_info = nullptr,
      .open_writer = open_hdf5_writer,
  };
  return kRow;
}

}  // namespace distckpt::internal_format

namespace distckpt {

void set_hdf5_reader_path(const std::string& path) {
  internal_format::RegisteredReader& r = internal_format::registered_reader();
  std::lock_guard<std::mutex> lock(r.mu);
  r.path = path;
}

std::string hdf5_reader_program() {
  auto path = internal_format::hdf5_reader_path("hdf5");
  return path.ok() ? *path : std::string();
}

}  // namespace distckpt
