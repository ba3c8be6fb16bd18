// distckpt's metadata (an index without chunks and files) as JSON, the form in which
// HDF5 attributes and safetensors headers carry it.
#pragma once

#include <string>

#include "distckpt/status.h"
#include "distckpt_index.pb.h"

namespace distckpt::internal_format {

// distckpt's metadata as JSON (field names as in the .proto), keys sorted.
std::string metadata_json(const proto::Index& meta);
// Its inverse, for bytes from a file: kCorruption ("<where> does not parse"). The result
// is only a description; attach_tensors checks it against the file's stored tensors.
Result<proto::Index> parse_metadata_json(const std::string& json, const std::string& where);

}  // namespace distckpt::internal_format
