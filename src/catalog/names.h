// Every name in a checkpoint root (LevelDB's db/filename.h): the checkpoints' own
// names, the `latest` pointer, the temporary names of saves in flight and of removals,
// and the statistics file. Names inside a checkpoint directory (index.pb, data files)
// belong to its format (format/native/index_codec.h).
#pragma once

#include <optional>
#include <string>

#include "distckpt/status.h"

namespace distckpt::internal_catalog {

inline constexpr const char* kLatestFileName = "latest";
inline constexpr const char* kStatsFileName = "stats.jsonl";
// What the catalog keeps for itself in a root (claims.h, tier records): never a
// checkpoint's name, never listed.
inline constexpr const char* kMetaDir = ".distckpt";
// "<name>.tmp-<16 hex>": a save (or a `latest` update) in flight, or abandoned.
inline constexpr const char* kTmpMarker = ".tmp-";
// "<name>.tmp-deleting-<16 hex>": a checkpoint being removed (retire.h).
inline constexpr const char* kTrashMarker = ".tmp-deleting-";

// The local tier's records: "<root>/.distckpt/tier/<name>" (tier/record.h). A global
// save never takes a name with a record: its drain would commit a second, unrelated
// checkpoint under it.
std::string local_records_dir(const std::string& root);
std::string local_record_path(const std::string& root, const std::string& name);

// "s-<16 hex>": the prefix a save into an object root writes its data objects under
// (object_root.h; format/native/index_codec.h: valid_save_dir).
std::string make_save_dir();

// kInvalidArgument unless `name` can be a checkpoint's name in a root: printable UTF-8,
// non-empty, at most 255 bytes, no '/', not "." / ".." / "latest", no ".tmp-", not
// starting with ".distckpt".
Status validate_checkpoint_name(const std::string& name);

// A fresh "<root>/<name>.tmp-<random hex>" path.
std::string make_tmp_name(const std::string& root, const std::string& name);
// A fresh "<root>/<name>.tmp-deleting-<random hex>" path.
std::string make_trash_name(const std::string& root, const std::string& name);
// The checkpoint name a trash entry was made from ("x.tmp-deleting-<16 hex>" -> "x"),
// or nullopt for any other entry name.
std::optional<std::string> trashed_name(const std::string& entry);
// Whether an entry of a root is a save in flight (or abandoned), or a removal.
bool is_in_flight_name(const std::string& entry);
// Whether a file (not a directory) in a root is a checkpoint of a single-file format,
// committed or in flight, by its extension.
bool is_checkpoint_file_name(const std::string& entry);

}  // namespace distckpt::internal_catalog
