#include "collective/incremental.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include "base/guard.h"
#include "catalog/listing.h"
#include "catalog/references.h"
#include "format/chunk_reader.h"
#include "format/format.h"
#include "format/native/index_codec.h"
#include "format/stored.h"
#include "layout/strided.h"
#include "transform/content_hash.h"

namespace distckpt::internal_collective {

namespace {

// The content hash of a box's packed bytes (a strided box: packed a piece at a time).
std::string box_hash(const TensorEntry& e, std::size_t b, uint64_t length) {
  if (e.packed(b)) return internal_transform::content_hash(e.buffers[b], static_cast<std::size_t>(length));
  constexpr std::size_t kPiece = 1 << 20;
  internal_transform::ContentHasher hasher;
  std::vector<char> scratch;
  for (uint64_t done = 0; done < length;) {
    const std::size_t n = static_cast<std::size_t>(std::min<uint64_t>(kPiece, length - done));
    hasher.update(internal_layout::packed_piece(e, b, done, n, scratch), n);
    done += n;
  }
  return hasher.digest();
}

using internal_plan::WriteItem;
using internal_transform::kContentHashBytes;

constexpr std::size_t kMarkBytes = kContentHashBytes + 1;  // the hash, then 'w' or 'r'

// What identifies a chunk across checkpoints: tensor name, dtype and box.
std::string chunk_key(const std::string& tensor, const std::string& dtype, const int64_t* offset, const int64_t* shape,
                      int dims) {
  std::string k = tensor;
  k.push_back('\0');
  k += dtype;
  k.push_back('\0');
  k.append(reinterpret_cast<const char*>(offset), sizeof(int64_t) * static_cast<std::size_t>(dims));
  k.append(reinterpret_cast<const char*>(shape), sizeof(int64_t) * static_cast<std::size_t>(dims));
  return k;
}

std::string chunk_key(const proto::Tensor& t, const proto::Chunk& c) {
  return chunk_key(t.name(), t.dtype(), c.offset().data(), c.shape().data(), c.offset_size());
}

// The base's hashed chunks by key: (tensor, chunk) indexes into the base index.
std::map<std::string, std::pair<int, int>> chunk_table(const proto::Index& base) {
  std::map<std::string, std::pair<int, int>> table;
  for (int t = 0; t < base.tensors_size(); ++t)
    for (int c = 0; c < base.tensors(t).chunks_size(); ++c)
      if (!base.tensors(t).chunks(c).content_hash().empty())
        table.emplace(chunk_key(base.tensors(t), base.tensors(t).chunks(c)), std::make_pair(t, c));
  return table;
}

// Why a committed checkpoint cannot be a base of this save ("" when it can).
std::string unusable_base(const proto::Index& base, const SaveFrame& frame) {
  if (base.has_encryption()) return "it is encrypted";
  if (internal_format::stored_format(base) != Format::kNative || internal_format::is_per_rank_set(base))
    return "it is not a sharded native checkpoint";
  if (base.transforms().checksum() != (frame.options.checksum ? "crc32c" : "none"))
    return "its chunks are checksummed otherwise";
  for (const auto& t : base.tensors())
    for (const auto& c : t.chunks())
      if (!c.content_hash().empty()) return "";
  return "it records no content hashes (it was not saved incrementally)";
}

}  // namespace

Status prepare_base(SaveFrame& frame) {
  FileSystem& fs = *frame.fs;
  const bool named = !frame.options.incremental_base.empty();
  const std::string base = named                                  ? frame.options.incremental_base
                           : frame.options.incremental_from_latest ? internal_catalog::read_latest_pointer(fs, frame.root)
                                                                   : std::string();
  if (base.empty()) return Status();  // no base: everything is written (and hashed)
  const std::string where = "save: rank 0: incremental base '" + frame.root + "/" + base + "'";
  auto index = internal_format::read_stored_index(fs, frame.root + "/" + base);
  const bool required = named && frame.options.incremental_base_required;
  // A base that cannot be used: an error when it was required, else a full save.
  auto without = [&](const Status& why) -> Status {
    if (required) return why;
    if (named) frame.result.warning = "incremental base '" + base + "' was not used: " + why.message();
    return Status();
  };
  if (!index.ok()) {
    if (!named) return Status();  // `latest` names something unreadable: a full save
    if (index.status().code() == StatusCode::kNotFound) return without(not_found(where + " is not a committed checkpoint"));
    return without(index.status().with_context(where));
  }
  if (const std::string why = unusable_base(*index, frame); !why.empty()) {
    if (named) frame.result.warning = "incremental base '" + base + "' was not used: " + why;
    return Status();
  }
  // Under the root's references lock (catalog/references.h): the base is marked as
  // referenced, the files it may give are listed in this save's temporary entry, and only
  // then is it checked to be still the committed checkpoint read above.
  auto lock = internal_catalog::lock_references(fs, frame.root);
  if (!lock.ok()) return without(lock.status().with_context(where));
  if (!fs.exists(frame.root + "/" + base + "/" + internal_format::kIndexFileName))
    return without(not_found(where + " was retired as the save began"));
  DISTCKPT_RETURN_IF_ERROR(internal_catalog::mark_referenced(fs, frame.root, base).with_context(where));
  std::set<std::string> files;
  for (const auto& f : index->files())
    files.insert(internal_catalog::reference_key(f.checkpoint().empty() ? base : f.checkpoint(), f.name()));
  DISTCKPT_RETURN_IF_ERROR(
      internal_catalog::write_references(fs, frame.entry.tmp, files, frame.options.fsync).with_context(where));
  auto again = internal_format::read_stored_index(fs, frame.root + "/" + base);
  if (!again.ok() || again->commit_seq() != index->commit_seq())
    return without(not_found(where + " was retired or replaced as the save began"));
  // A file whose chunks in the base are less than half of it is not referenced again:
  // its chunks are rewritten, so that the file can go once older checkpoints retire (a
  // file is kept whole while any of its chunks is referenced).
  std::map<uint32_t, uint64_t> live;  // with the gap before each chunk (kChunkAlignment)
  for (const auto& t : index->tensors())
    for (const auto& c : t.chunks()) live[c.file_id()] += internal_format::chunk_start(c.length());
  for (auto& t : *index->mutable_tensors())
    for (auto& c : *t.mutable_chunks())
      if (2 * live[c.file_id()] < index->files(static_cast<int>(c.file_id())).size()) c.clear_content_hash();
  frame.base_name = base;
  frame.base_index = std::move(index).value();
  return Status();
}

void apply_base(Comm& comm, SaveSession& session, const StateDict& state) {
  SaveFrame& frame = session.frame;
  // Rank 0 looks up every planned chunk in the base and sends each rank, per chunk of
  // its write list, the base's hash of the same tensor, dtype, box and length (or none):
  // no rank but rank 0 holds the base's index.
  std::vector<std::string> parts;
  Status planned;
  if (comm.rank() == 0) {
    planned = internal_base::guarded("save: rank 0: incremental", [&]() -> Status {
      const proto::Index& base = frame.base_index;
      const auto table = chunk_table(base);
      const proto::Index& index = frame.plan.index;
      for (const auto& items : frame.plan.writes) {
        std::string part;
        for (const WriteItem& w : items) {
          const proto::Tensor& t = index.tensors(static_cast<int>(w.tensor));
          auto it = table.find(chunk_key(t, t.chunks(static_cast<int>(w.chunk))));
          const proto::Chunk* from =
              it == table.end() ? nullptr : &base.tensors(it->second.first).chunks(it->second.second);
          if (from != nullptr && from->length() == w.stored_length) {
            part.push_back('b');
            part += from->content_hash();
          } else {
            part.push_back('-');
            part.append(kContentHashBytes, '\0');
          }
        }
        parts.push_back(std::move(part));
      }
      return Status();
    });
    if (!planned.ok()) parts.assign(static_cast<std::size_t>(comm.size()), std::string());
  }
  const std::string candidates = comm.scatter(parts, 0);
  Status local = internal_base::guarded(rank_prefix(comm) + ": incremental", [&]() -> Status {
    DISTCKPT_RETURN_IF_ERROR(planned);
    DISTCKPT_RETURN_IF_ERROR(session.local_error);
    if (candidates.size() != session.mine.size() * kMarkBytes)
      return internal_error("rank 0 sent " + std::to_string(candidates.size()) + " bytes of base hashes for " +
                            std::to_string(session.mine.size()) + " chunks");
    std::vector<WriteItem> written;
    session.marks.clear();
    session.marks.reserve(session.mine.size() * kMarkBytes);
    uint64_t cursor = 0;
    for (std::size_t i = 0; i < session.mine.size(); ++i) {
      WriteItem item = session.mine[i];
      const TensorEntry& e = state.tensors()[item.tensor];
      const std::string hash = box_hash(e, item.local_box, item.length);
      const bool same = candidates[i * kMarkBytes] == 'b' &&
                        candidates.compare(i * kMarkBytes + 1, kContentHashBytes, hash) == 0;
      session.marks += hash;
      session.marks.push_back(same ? 'r' : 'w');
      if (same) continue;
      item.byte_offset = internal_format::chunk_start(cursor);  // the written chunks, in their planned order
      cursor = item.byte_offset + item.stored_length;
      written.push_back(item);
    }
    session.mine = std::move(written);
    return Status();
  });
  if (!local.ok()) session.local_error = local;
}

Status fill_references(SaveFrame& frame, const std::vector<std::string>& all_crcs,
                       const std::vector<std::string>& all_marks, uint64_t* referenced) {
  internal_plan::SavePlan& plan = frame.plan;
  proto::Index& index = plan.index;
  const proto::Index& base = frame.base_index;
  const auto table = chunk_table(base);
  const int own_files = index.files_size();
  std::vector<uint64_t> own_size(static_cast<std::size_t>(own_files), 0);
  std::vector<bool> own_used(static_cast<std::size_t>(own_files), false);
  std::map<std::string, uint32_t> reference_ids;
  *referenced = 0;
  for (std::size_t r = 0; r < plan.writes.size(); ++r) {
    const auto& items = plan.writes[r];
    const std::string& marks = all_marks[r];
    if (marks.size() != items.size() * kMarkBytes)
      return internal_error("save: rank " + std::to_string(r) + " returned a wrong number of content hashes");
    std::size_t next_crc = 0;
    uint64_t cursor = 0;
    for (std::size_t i = 0; i < items.size(); ++i) {
      const WriteItem& w = items[i];
      const proto::Tensor& t = index.tensors(static_cast<int>(w.tensor));
      proto::Chunk* chunk = index.mutable_tensors(static_cast<int>(w.tensor))->mutable_chunks(static_cast<int>(w.chunk));
      chunk->set_content_hash(marks.substr(i * kMarkBytes, kContentHashBytes));
      if (marks[i * kMarkBytes + kContentHashBytes] == 'w') {
        if ((next_crc + 1) * sizeof(uint32_t) > all_crcs[r].size())
          return internal_error("save: rank " + std::to_string(r) + " returned too few checksums");
        uint32_t crc;
        std::memcpy(&crc, all_crcs[r].data() + next_crc++ * sizeof(uint32_t), sizeof(crc));
        chunk->set_crc32c(crc);
        chunk->set_byte_offset(internal_format::chunk_start(cursor));  // as the rank laid it out (apply_base)
        cursor = chunk->byte_offset() + w.stored_length;
        own_size[chunk->file_id()] = cursor;
        own_used[chunk->file_id()] = true;
        continue;
      }
      auto it = table.find(chunk_key(t, *chunk));
      if (it == table.end())
        return internal_error("save: rank " + std::to_string(r) + " referenced a chunk of tensor '" + t.name() +
                              "' that the base does not hold");
      const proto::Chunk& from = base.tensors(it->second.first).chunks(it->second.second);
      if (from.content_hash() != chunk->content_hash() || from.length() != chunk->length())
        return internal_error("save: rank " + std::to_string(r) + " referenced a chunk of tensor '" + t.name() +
                              "' whose hash or length differs from the base's");
      const proto::File& file = base.files(static_cast<int>(from.file_id()));
      const std::string checkpoint = file.checkpoint().empty() ? frame.base_name : file.checkpoint();
      const uint64_t checkpoint_seq = file.checkpoint().empty() ? base.commit_seq() : file.checkpoint_seq();
      const std::string key = internal_catalog::reference_key(checkpoint, file.name());
      auto [ref, added] = reference_ids.emplace(key, static_cast<uint32_t>(index.files_size()));
      if (added) {
        proto::File* f = index.add_files();
        f->set_name(file.name());
        f->set_size(file.size());
        f->set_checkpoint(checkpoint);
        f->set_checkpoint_seq(checkpoint_seq);
      }
      chunk->set_file_id(ref->second);
      chunk->set_byte_offset(from.byte_offset());
      chunk->set_crc32c(from.crc32c());
      *referenced += from.length();
    }
    if (next_crc * sizeof(uint32_t) != all_crcs[r].size())
      return internal_error("save: rank " + std::to_string(r) + " returned a wrong number of checksums");
  }
  // Own files: their sizes as written; those left empty go (nothing was written there).
  std::vector<uint32_t> new_id(static_cast<std::size_t>(index.files_size()));
  google::protobuf::RepeatedPtrField<proto::File> kept;
  for (int f = 0; f < index.files_size(); ++f) {
    proto::File file = index.files(f);
    if (f < own_files) {
      if (!own_used[static_cast<std::size_t>(f)]) continue;
      file.set_size(own_size[static_cast<std::size_t>(f)]);
    }
    new_id[static_cast<std::size_t>(f)] = static_cast<uint32_t>(kept.size());
    *kept.Add() = std::move(file);
  }
  for (auto& t : *index.mutable_tensors())
    for (auto& c : *t.mutable_chunks()) c.set_file_id(new_id[c.file_id()]);
  *index.mutable_files() = std::move(kept);
  return Status();
}

Status check_references(FileSystem& fs, const std::string& root, const proto::Index& index) {
  internal_format::InsideCheck real_dirs(fs, root);  // a referenced checkpoint is a real directory
  std::set<std::string> checked;                      // ... and the one the reference was made to
  for (const auto& f : index.files()) {
    if (f.checkpoint().empty()) continue;
    const std::string path = root + "/" + f.checkpoint() + "/" + f.name();
    if (Status inside = real_dirs.check(f.checkpoint() + "/" + f.name()); !inside.ok())
      return not_found("incremental save: the checkpoint '" + f.checkpoint() + "' it references is gone (" +
                       inside.to_string() + "); nothing was committed");
    auto size = fs.file_size(path);
    if (!size.ok())
      return not_found("incremental save: the file '" + path + "' it references is gone (" + size.status().to_string() +
                       "); nothing was committed");
    if (!checked.count(f.checkpoint())) {
      DISTCKPT_RETURN_IF_ERROR(internal_format::check_reference_identity(fs, root, f).with_context("incremental save"));
      checked.insert(f.checkpoint());
    }
    if (*size != f.size())
      return corruption("incremental save: the file '" + path + "' it references has " + std::to_string(*size) +
                        " bytes, not " + std::to_string(f.size()));
  }
  return Status();
}

}  // namespace distckpt::internal_collective
