// The HDF5 writer (hdf5_io.h's Hdf5Writer): one process lays a file out through libhdf5
// and records the checksums; parallel saves then write their slices into it.
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
#include "format/describe.h"
#include "format/hdf5/hdf5_footer.h"
#include "format/hdf5/hdf5_lib.h"
#include "format/format.h"
#include "format/metadata_json.h"
#include "format/native/index_codec.h"
#include "format/sequential_writer.h"
#include "layout/region.h"
#include "layout/tiling.h"
#include "transform/crc32c.h"

namespace distckpt::internal_format {

using namespace hdf5lib;

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

}  // namespace distckpt::internal_format
