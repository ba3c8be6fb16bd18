#include "format/metadata_json.h"

#include <google/protobuf/util/json_util.h>

#include <nlohmann/json.hpp>

namespace distckpt::internal_format {

std::string metadata_json(const proto::Index& meta) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(meta, &json, options);
  // Protobuf prints map entries (the info values) in a per-instance random order;
  // sorted keys make equal metadata print equally (reproducible published files).
  const nlohmann::json sorted = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  return sorted.is_discarded() ? json : sorted.dump();
}

Result<proto::Index> parse_metadata_json(const std::string& json, const std::string& where) {
  proto::Index parsed;
  if (!google::protobuf::util::JsonStringToMessage(json, &parsed).ok()) return corruption(where + " does not parse");
  return parsed;
}

}  // namespace distckpt::internal_format
