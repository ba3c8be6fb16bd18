// HDF5 files: a dataset per tensor (its global shape; '/' in a name makes groups),
// written collectively with parallel HDF5, each unique slice by one rank as a
// hyperslab; the tensor's dtype name and layout as dataset attributes; step, epoch and
// info values as root attributes, with distckpt's metadata as JSON in the root
// attribute "distckpt". float16 and bfloat16 are HDF5 floats of 2 bytes with their
// bit fields, bool an enum {FALSE, TRUE} over int8 (what h5py reads as numpy bool).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "distckpt/layout.h"
#include "distckpt/status.h"
#include "distckpt_index.pb.h"

namespace distckpt::internal_format {

// Describes an HDF5 file (opened read-only, serial driver) as an index: one chunk per
// dataset, its contiguous storage (offset reads then need no HDF5). kUnsupported for
// a chunked or compressed dataset or a type other than the little-endian ones
// distckpt writes; kCorruption for a file HDF5 cannot open or a dataset without data.
Result<proto::Index> hdf5_index(const std::string& path, const std::string& file_name);

// The reader program's whole work (distckpt-hdf5-reader, src/format/hdf5/reader_main.cc):
// `--protocol N FILE NAME` writes hdf5_index(FILE, NAME), encoded, to its stdout. Loads,
// `verify` and `ls` of an .h5 file start it (hdf5_reader.cc says why a separate program), from
// $DISTCKPT_HDF5_READER, this build tree or the install's libexec/distckpt/. Returns the
// exit status: 0 when the answer (an index or an error) is out, 2 for a bad request.
// hdf5_index of the file at `path`, computed by the reader program in a process of its
// own (hdf5_reader.cc says why), which is killed past its deadline: its crash or silence
// is kCorruption naming the file. Any thread; local.
Result<proto::Index> isolated_hdf5_index(const std::string& path, const std::string& file_name);

int hdf5_reader_main(int argc, char** argv);

// Local check: can `name` be an HDF5 dataset path (no empty, "." or ".." component)?
Status check_hdf5_name(const std::string& name);

// Writes an HDF5 file from one process (HDF5's serial driver). Every dataset is
// contiguous and allocated when it is created, so a dataset's bytes have a fixed place
// in the file (data_offsets): parallel saves have rank 0 lay the file out and close it,
// then every rank writes its slices there itself (collective/save_hdf5.cc says why not
// through MPI-IO).
class Hdf5Writer {
 public:
  // Creates (or truncates: the catalog makes it owner-only first) `path` and every
  // dataset of `meta`. The metadata attribute written by finish() holds the widest
  // CRC32C of each dataset until set_crc32c() gives the real ones (or, after the close,
  // record_hdf5_crc32c() writes them in place).
  static Result<std::unique_ptr<Hdf5Writer>> create(const std::string& path, const proto::Index& meta);
  // The CRC32C of each tensor's dataset bytes, for finish() to record (a writer that saw
  // every byte: the sequential one).
  void set_crc32c(const std::vector<uint32_t>& crcs);
  // Per tensor of the metadata, the file offset of its dataset's bytes (0 for an empty
  // tensor). kIoError when HDF5 cannot tell.
  Result<std::vector<uint64_t>> data_offsets() const;
  ~Hdf5Writer();
  // Writes pieces (boxes of tensor `tensor` and their row-major data) through HDF5.
  Status write(int tensor, const std::vector<std::pair<Box, const void*>>& pieces);
  // Writes the attributes and closes the file.
  Status finish();

 private:
  Hdf5Writer() = default;
  // The byte size of tensor `tensor`'s dataset (its global shape).
  uint64_t dataset_bytes(int tensor) const;
  // [offset, end) of each dataset's bytes, sorted.
  std::vector<std::pair<uint64_t, uint64_t>> data_ranges() const;
  // Allocates the file's space outside `data` (its metadata's places) and some past its
  // end for what the close places there, so that a full disk is found before libhdf5
  // flushes (hdf5_writer.cc says why).
  Status reserve_metadata_space(std::vector<std::pair<uint64_t, uint64_t>> data);
  // Gives back what was reserved past the closed file's end.
  void trim_reserved_tail();
  static constexpr uint64_t kCloseSlack = 256 * 1024;
  uint64_t reserved_end_ = 0;
  struct Handles;
  std::unique_ptr<Handles> h_;
  std::string path_;
  proto::Index meta_;
  std::string meta_json_;
  Status deferred_;  // a failure after the file was created: reported by finish()
};

// The "distckpt" attribute of an HDF5 file we write: metadata_json(meta) and one chunk
// per tensor that holds the CRC32C of its dataset's bytes (a dataset is contiguous, its
// one region). Without `crcs` every CRC is the widest number, which reserves the room
// for the real ones: with them the text is padded with spaces to that same size, so the
// attribute is rewritten in place, where nothing new is allocated.
std::string hdf5_metadata_json(const proto::Index& meta, const std::vector<uint32_t>* crcs);

// Writes `crcs` (one per tensor of `meta`, in order) into the metadata attribute of a
// file that Hdf5Writer laid out and closed, in place. Not collective: rank 0 calls it
// after every rank wrote its slices, before the commit. The caller fsyncs the file.
// kIoError when HDF5 cannot open or write it; kInternal when the attribute is not the
// size that create() reserved.
Status record_hdf5_crc32c(const std::string& path, const proto::Index& meta, const std::vector<uint32_t>& crcs);

// The HDF5 format's row of the format table (format.h).
const struct FormatDriver& hdf5_driver();

}  // namespace distckpt::internal_format
