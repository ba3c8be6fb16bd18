// Names of the files in a native checkpoint directory besides its data files (no
// protobuf here: the catalog and the tool use them without the index schema).
#pragma once

namespace distckpt::internal_format {

inline constexpr const char* kIndexFileName = "index.pb";
// A retired checkpoint's index (catalog/references.h): kept while the directory holds
// files that later checkpoints reference, to check those references' identity.
inline constexpr const char* kRetiredIndexFileName = "index.retired";
// In a checkpoint that an incremental save took as its base: its files may be
// referenced, so retiring it must find out which (catalog/references.h).
inline constexpr const char* kReferencedMarkerName = "referenced";

}  // namespace distckpt::internal_format
