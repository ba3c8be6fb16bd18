#include "tier/drain.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <exception>

#include "base/guard.h"
#include "base/kill_point.h"
#include "base/test_seams.h"
#include "base/timer.h"
#include "catalog/object_root.h"
#include "collective/save_frame.h"
#include "comm/agree.h"
#include "format/chunk_reader.h"
#include "format/format.h"
#include "format/native/index_codec.h"
#include "format/native/sealing.h"
#include "tier/nodes.h"
#include "tier/record.h"
#include "transform/cipher.h"
#include "transform/crc32c.h"

namespace distckpt::internal_tier {

using internal_base::guarded;
using internal_comm::agree;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The global checkpoint's index and each rank's items, from the record alone: each
// distinct chunk once, written by the least loaded of the ranks whose own file holds
// it (slices with fewest holders first, then the largest), as save() plans.
Status plan_drain(const proto::Index& record, int world, const internal_transform::CheckpointCipher* cipher,
                  proto::Index* index, std::vector<std::vector<DrainJob::Item>>* items) {
  struct Slice {
    int tensor;
    Box box;
    std::vector<int> chunks;  // record chunks with this box
    uint64_t bytes;
    int writer = -1, source = -1;
  };
  std::vector<Slice> slices;
  for (int t = 0; t < record.tensors_size(); ++t) {
    std::map<Box, std::size_t> at;
    const proto::Tensor& tensor = record.tensors(t);
    const std::size_t item = dtype_size(*dtype_from_name(tensor.dtype()));
    for (int c = 0; c < tensor.chunks_size(); ++c) {
      const Box b = internal_format::chunk_box(tensor.chunks(c));
      auto [it, fresh] = at.emplace(b, slices.size());
      if (fresh) slices.push_back(Slice{t, b, {}, static_cast<uint64_t>(b.num_elements()) * item});
      slices[it->second].chunks.push_back(c);
    }
  }
  std::vector<std::size_t> order(slices.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) {
    const Slice& a = slices[x];
    const Slice& b = slices[y];
    if (a.chunks.size() != b.chunks.size()) return a.chunks.size() < b.chunks.size();
    if (a.bytes != b.bytes) return a.bytes > b.bytes;
    if (a.tensor != b.tensor) return a.tensor < b.tensor;
    return a.box < b.box;
  });
  std::vector<uint64_t> load(static_cast<std::size_t>(world), 0);
  for (std::size_t i : order) {
    Slice& s = slices[i];
    for (int c : s.chunks) {
      const int r = record.tensors(s.tensor).chunks(c).writer_rank();
      if (r < 0 || r >= world) return corruption("a chunk's writer rank is outside the world");
      if (s.writer < 0 || std::tie(load[static_cast<std::size_t>(r)], r) < std::tie(load[static_cast<std::size_t>(s.writer)], s.writer)) {
        s.writer = r;
        s.source = c;
      }
    }
    load[static_cast<std::size_t>(s.writer)] += s.bytes;
  }
  index->Clear();
  index->set_name(record.name());
  index->set_step(record.step());
  index->set_epoch(record.epoch());
  index->set_world_size(world);
  *index->mutable_info() = record.info();
  index->set_format("native");
  index->mutable_transforms()->set_checksum("crc32c");
  index->mutable_transforms()->set_encryption("none");
  index->mutable_transforms()->set_compression("none");
  index->set_advances_latest(record.advances_latest());
  std::vector<int> file_of(static_cast<std::size_t>(world), -1);
  for (int r = 0; r < world; ++r)
    if (load[static_cast<std::size_t>(r)] > 0) {
      file_of[static_cast<std::size_t>(r)] = index->files_size();
      index->add_files()->set_name(internal_format::data_file_name(r));
    }
  for (const proto::Tensor& t : record.tensors()) {
    proto::Tensor* out = index->add_tensors();
    out->set_name(t.name());
    out->set_dtype(t.dtype());
    *out->mutable_global_shape() = t.global_shape();
    *out->mutable_layout() = t.layout();
  }
  std::sort(slices.begin(), slices.end(), [](const Slice& a, const Slice& b) {
    if (a.tensor != b.tensor) return a.tensor < b.tensor;
    return a.box < b.box;
  });
  items->assign(static_cast<std::size_t>(world), {});
  std::vector<uint64_t> cursor(static_cast<std::size_t>(world), 0);
  for (const Slice& s : slices) {
    proto::Tensor* t = index->mutable_tensors(s.tensor);
    const int chunk_no = t->chunks_size();
    proto::Chunk* c = t->add_chunks();
    for (int64_t o : s.box.offset) c->add_offset(o);
    for (int64_t d : s.box.shape) c->add_shape(d);
    const auto w = static_cast<std::size_t>(s.writer);
    const uint64_t stored = cipher ? cipher->stored_length(s.bytes) : s.bytes;
    const uint64_t at = internal_format::chunk_start(cursor[w]);
    c->set_file_id(static_cast<uint32_t>(file_of[w]));
    c->set_byte_offset(at);
    c->set_length(stored);
    c->set_writer_rank(s.writer);
    (*items)[w].push_back(DrainJob::Item{s.tensor, s.source, chunk_no, at, s.bytes, stored});
    cursor[w] = at + stored;
  }
  for (int r = 0; r < world; ++r)
    if (file_of[static_cast<std::size_t>(r)] >= 0) index->mutable_files(file_of[static_cast<std::size_t>(r)])->set_size(cursor[static_cast<std::size_t>(r)]);
  Status valid = internal_format::validate_index(*index, "drain plan");
  if (!valid.ok()) return corruption(valid.message());
  if (cipher)  // nonces after the check, which takes the index for a plain one
    for (int t = 0; t < index->tensors_size(); ++t)
      for (int c = 0; c < index->tensors(t).chunks_size(); ++c)
        index->mutable_tensors(t)->mutable_chunks(c)->set_nonce(
            cipher->chunk_nonce(static_cast<uint32_t>(t), static_cast<uint64_t>(c)));
  return Status();
}

}  // namespace

Result<std::unique_ptr<DrainJob>> DrainJob::start(Comm& comm, const std::string& root, const LocalTier& tier_in,
                                                  const std::string& name, const SaveOptions& options) {
  if (internal_catalog::is_object_root(root))  // the same answer on every rank: the root is the call's
    return unsupported("drain: the node-local tier needs a file-system root; '" + root + "' is an object root");
  const LocalTier tier{node_dir(comm, tier_in.dir, comm.rank()), tier_in.redundancy};
  std::unique_ptr<DrainJob> job(new DrainJob());
  job->name_ = name;
  job->root_ = root;
  job->tier_ = tier;
  job->options_ = options;
  job->fs_ = options.fs ? options.fs : posix_filesystem();
  job->rank_ = comm.rank();
  job->started_ = now_s();
  FileSystem& fs = *job->fs_;
  const std::string where = "drain: rank " + std::to_string(comm.rank());
  std::string record_bytes;
  Status local;
  if (comm.rank() == 0)
    local = guarded(where, [&]() -> Status {
      DISTCKPT_ASSIGN_OR_RETURN(record_bytes, read_whole_file(fs, record_path(root, name), uint64_t{1} << 30));
      return Status();
    });
  DISTCKPT_RETURN_IF_ERROR(agree(comm, local));
  comm.broadcast_string(record_bytes, 0);
  local = guarded(where, [&]() -> Status {
    DISTCKPT_ASSIGN_OR_RETURN(job->record_, internal_format::parse_index(record_bytes, record_path(root, name)));
    DISTCKPT_RETURN_IF_ERROR(validate_placement(job->record_, record_path(root, name)));
    DISTCKPT_ASSIGN_OR_RETURN(job->record_cipher_,
                              internal_format::open_index(&job->record_, options.encryption.key.get(), record_path(root, name)));
    if (job->record_.world_size() != comm.size())
      return invalid_argument("checkpoint '" + name + "' was saved by " + std::to_string(job->record_.world_size()) +
                              " ranks; a drain runs in the job that saved it (" + std::to_string(comm.size()) + " ranks)");
    // Each rank reads its own file: it must be on this node, under the same node id.
    const NodeMap nodes = node_map(comm);
    const std::string id = read_node_id(fs, tier.dir);
    for (const proto::TierNode& n : job->record_.tier().nodes())
      for (int r : n.ranks())
        if (r == comm.rank() && n.node_id() != id)
          return invalid_argument("checkpoint '" + name + "': this rank's node is not the one that saved it");
    (void)nodes;
    return Status();
  });
  DISTCKPT_RETURN_IF_ERROR(agree(comm, local));
  DISTCKPT_RETURN_IF_ERROR(internal_collective::agree_on_encryption(comm, options.encryption, &job->salt_, &job->cipher_));
  std::vector<std::vector<Item>> items;
  local = guarded(where + ": plan", [&] { return plan_drain(job->record_, comm.size(), job->cipher_.get(), &job->index_, &items); });
  DISTCKPT_RETURN_IF_ERROR(agree(comm, local));
  job->mine_ = items[static_cast<std::size_t>(comm.rank())];
  if (comm.rank() == 0)
    local = guarded("drain: rank 0", [&]() -> Status {
      DISTCKPT_ASSIGN_OR_RETURN(job->entry_, internal_catalog::begin_entry(fs, root, name, true, "drain: rank 0", job->fs_,
                                                                              /*drain_of_record=*/true));
      job->index_.set_commit_seq(job->entry_.commit_seq);
      return Status();
    });
  DISTCKPT_RETURN_IF_ERROR(agree(comm, local));
  job->tmp_ = job->entry_.tmp;
  comm.broadcast_string(job->tmp_, 0);
  DrainJob* raw = job.get();
  try {
    job->thread_ = std::thread([raw] { raw->copy(); });
  } catch (const std::exception&) {  // std::system_error, or std::bad_alloc for its state
    raw->copy();  // no thread to be had: copy now (slower for the loop, but the same drain)
  }
  return job;
}

void DrainJob::copy() {
  internal_base::Timer timer;
  copied_ = guarded("drain: rank " + std::to_string(rank_), [&]() -> Status {
    if (mine_.empty()) return Status();
    FileSystem& fs = *fs_;
    const std::string file_name = internal_format::data_file_name(rank_);
    const std::string path = tmp_ + "/" + file_name;
    DISTCKPT_ASSIGN_OR_RETURN(auto out, fs.open_writable(path));
    std::map<uint32_t, std::unique_ptr<ReadableFile>> sources;
    std::vector<char> plain, sealed, scratch;
    uint64_t end = 0;  // of the chunks written so far (they come in file order)
    for (const Item& item : mine_) {
      if (item.byte_offset < end || item.byte_offset - end >= internal_format::kChunkAlignment)
        return internal_error("drain: chunk at byte " + std::to_string(item.byte_offset) + " after one ending at " +
                              std::to_string(end));
      if (item.byte_offset > end)  // the gap's zeros, written as every writer writes them
        DISTCKPT_RETURN_IF_ERROR(
            out->write_at(internal_format::kGapZeros, static_cast<std::size_t>(item.byte_offset - end), end));
      const proto::Tensor& t = record_.tensors(item.tensor);
      const proto::Chunk& src = t.chunks(item.source_chunk);
      const std::string source_path = copy_path(tier_.dir, name_, record_.files(static_cast<int>(src.file_id())).name(), kPrimary);
      auto& file = sources[src.file_id()];
      if (!file) {
        DISTCKPT_ASSIGN_OR_RETURN(file, fs.open_readable(source_path));
      }
      plain.resize(static_cast<std::size_t>(item.length));
      internal_format::ChunkCheck check;
      check.cipher = record_cipher_.get();
      check.file_identity = record_.files(static_cast<int>(src.file_id())).name();
      check.where = "'" + source_path + "'";
      DISTCKPT_RETURN_IF_ERROR(internal_format::read_chunk(*file, t, item.source_chunk, plain.data(), check, scratch));
      const char* stored = plain.data();
      if (cipher_) {
        // Sealed again for its place in the global checkpoint: the associated data names
        // the file and offset, and the global checkpoint has its own salt (keys).
        sealed.resize(static_cast<std::size_t>(item.stored_length) + 32);
        DISTCKPT_ASSIGN_OR_RETURN(
            auto sealer, cipher_->begin_seal(cipher_->chunk_nonce(static_cast<uint32_t>(item.tensor), static_cast<uint64_t>(item.chunk)),
                                             internal_transform::chunk_aad(t.name(), static_cast<uint64_t>(item.chunk), file_name,
                                                                           item.byte_offset, item.stored_length, item.length)));
        std::size_t n = 0, m = 0;
        std::string tag;
        DISTCKPT_RETURN_IF_ERROR(sealer.update(plain.data(), plain.size(), sealed.data(), &n));
        DISTCKPT_RETURN_IF_ERROR(sealer.finish(sealed.data() + n, &m, &tag));
        if (n + m != item.stored_length) return internal_error("drain: a sealed chunk has an unexpected length");
        tags_ += tag;
        stored = sealed.data();
      }
      crcs_.push_back(internal_transform::crc32c_finish(
          internal_transform::crc32c_extend(internal_transform::kCrc32cInit, stored, static_cast<std::size_t>(item.stored_length))));
      DISTCKPT_RETURN_IF_ERROR(out->write_at(stored, static_cast<std::size_t>(item.stored_length), item.byte_offset));
      bytes_ += item.stored_length;
      end = item.byte_offset + item.stored_length;
    }
    internal_base::kill_point("drain-write");
    if (options_.fsync) DISTCKPT_RETURN_IF_ERROR(out->sync());
    return out->close();
  });
  copy_s_ = timer.seconds();
  done_.store(true, std::memory_order_release);
}

Result<DrainResult> DrainJob::finish(Comm& comm) {
  if (thread_.joinable()) thread_.join();
  finished_ = true;
  internal_base::Timer commit_timer;
  auto discard = [&] {
    if (comm.rank() == 0) internal_catalog::discard_entry(*fs_, entry_);
  };
  if (Status st = agree(comm, copied_); !st.ok()) {
    discard();
    return st;
  }
  std::string crcs(reinterpret_cast<const char*>(crcs_.data()), crcs_.size() * sizeof(uint32_t));
  const std::vector<std::string> all_crcs = comm.gather(crcs, 0);
  const std::vector<std::string> all_tags = comm.gather(tags_, 0);
  Status local;
  std::string warning;
  if (comm.rank() == 0) {
    local = guarded("drain: rank 0: commit", [&]() -> Status {
      std::vector<std::vector<Item>> plan;
      proto::Index index;
      DISTCKPT_RETURN_IF_ERROR(plan_drain(record_, comm.size(), cipher_.get(), &index, &plan));
      index.set_commit_seq(entry_.commit_seq);
      const std::size_t tag_bytes = cipher_ ? cipher_->tag_bytes() : 0;
      for (std::size_t r = 0; r < plan.size(); ++r) {
        if (all_crcs[r].size() != plan[r].size() * sizeof(uint32_t) || all_tags[r].size() != plan[r].size() * tag_bytes)
          return internal_error("drain: rank " + std::to_string(r) + " returned a wrong number of checksums");
        for (std::size_t i = 0; i < plan[r].size(); ++i) {
          uint32_t crc;
          std::memcpy(&crc, all_crcs[r].data() + i * sizeof(crc), sizeof(crc));
          proto::Chunk* c = index.mutable_tensors(plan[r][i].tensor)->mutable_chunks(plan[r][i].chunk);
          c->set_crc32c(crc);
          if (cipher_) c->set_tag(all_tags[r].substr(i * tag_bytes, tag_bytes));
        }
      }
      index.set_created_unix_ms(internal_base::wall_clock_ms());
      if (cipher_) DISTCKPT_RETURN_IF_ERROR(internal_format::seal_index(&index, *cipher_, salt_));
      DISTCKPT_ASSIGN_OR_RETURN(auto committed, internal_catalog::finish_entry(*fs_, entry_, &index, options_.fsync,
                                                                               // An exception save's copy moves `latest` no more than the save did.
                                                                               options_.update_latest && record_.advances_latest()));
      warning = committed.warning;
      return Status();
    });
  }
  DISTCKPT_RETURN_IF_ERROR(agree(comm, local));
  comm.broadcast_string(warning, 0);
  std::vector<int64_t> sums{static_cast<int64_t>(bytes_)};
  comm.allreduce(sums, ReduceOp::kSum);
  DrainResult out;
  out.save.path = root_ + "/" + name_;
  out.save.bytes_written = static_cast<uint64_t>(sums[0]);
  out.save.rank_bytes_written = bytes_;
  out.save.write_s = copy_s_;
  out.save.commit_s = commit_timer.seconds();
  out.save.warning = warning;
  out.drain_s = now_s() - started_;
  return out;
}

Result<bool> DrainJob::poll(Comm& comm, DrainResult* out) {
  if (finished_) return internal_error("drain '" + name_ + "': polled after it finished");
  const bool done = done_.load(std::memory_order_acquire);
  if (comm.allreduce_one(done ? 1 : 0, ReduceOp::kMin) == 0) return false;
  DISTCKPT_ASSIGN_OR_RETURN(*out, finish(comm));
  return true;
}

Result<DrainResult> DrainJob::wait(Comm& comm) { return finish(comm); }

DrainJob::~DrainJob() {
  if (thread_.joinable()) thread_.join();
  if (!finished_ && rank_ == 0 && !entry_.tmp.empty()) internal_catalog::discard_entry(*fs_, entry_);
}

}  // namespace distckpt::internal_tier

namespace distckpt {

Result<DrainResult> drain(Comm& comm, const std::string& root, const LocalTier& tier, const std::string& name,
                          const SaveOptions& options) {
  DISTCKPT_ASSIGN_OR_RETURN(auto job, internal_tier::DrainJob::start(comm, root, tier, name, options));
  return job->wait(comm);
}

}  // namespace distckpt
