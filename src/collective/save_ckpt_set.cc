// MindSpore's non-integrated save (integrated_save=False): one .ckpt per rank holding
// that rank's slices, committed as one checkpoint by a manifest.
//
// The set is a checkpoint directory <root>/<name>/ with rank_<r>/<name>.ckpt for every
// rank (the layout MindSpore's transform_checkpoints reads) and index.pb. The plan is
// the sharded save's, except that with remove_redundancy each distinct slice goes to the
// rank MindSpore's rule picks (plan_save's WriterChoice::kMindSpore); each rank writes its slices as MindSpore records through the ckpt
// writer, which reports where each record's bytes went with their CRC32C; rank 0 turns
// those reports into a native index whose chunks point into the rank files. So the
// manifest is an index like any other: listing, verify, load onto any layout, convert
// and retention need nothing new, and a set without it is an in-flight save. Beside the
// rank files, strategy.ckpt holds the layouts in MindSpore's strategy format, so that
// MindSpore's merge_sliced_parameter and transform_checkpoints can put them together.
#include <set>

#include "base/guard.h"
#include "base/kill_point.h"
#include "base/strings.h"
#include "base/timer.h"
#include "collective/save_session.h"
#include "collective/save_strategies.h"
#include "format/ckpt/strategy.h"
#include "format/describe.h"
#include "format/native/index_codec.h"
#include "format/sequential_writer.h"
#include "transform/crc32c.h"

namespace distckpt::internal_collective {

using internal_base::guarded;
using internal_base::Timer;
using internal_plan::WriteItem;

SaveShape save_shape(const SaveSettings& settings) {
  if (settings.format == Format::kCkpt && settings.integrated == false) return SaveShape::kPerRankSet;
  if (internal_format::driver(settings.format).single_file || settings.integrated.value_or(false))
    return SaveShape::kOneFile;
  return SaveShape::kSharded;
}

namespace {

// An info value step_num or epoch_num (MindSpore's names) that contradicts the save's own
// step or epoch: the checkpoint would carry two different steps. "" when none does.
std::string counter_conflict(const StateDict& state, const SaveOptions& options) {
  for (const auto& [key, counter] : {std::pair<std::string, int64_t>{"step_num", options.step}, {"epoch_num", options.epoch}}) {
    auto it = state.info().find(key);
    if (it == state.info().end() || counter < 0) continue;
    const int64_t* stored = std::get_if<int64_t>(&it->second);
    if (stored == nullptr || *stored != counter)
      return "info '" + key + "' = " + info_value_to_string(it->second) + " contradicts the save's " +
             (key == "step_num" ? "step " : "epoch ") + std::to_string(counter) +
             " (give the counter once: as the save's argument, or leave it unset there)";
  }
  return "";
}

}  // namespace

Status agree_save_shape(Comm& comm, const StateDict& state, const SaveOptions& options) {
  const std::string conflict = counter_conflict(state, options);
  const std::vector<int64_t> mine{static_cast<int64_t>(save_shape(options)), static_cast<int64_t>(options.format),
                                  options.integrated ? (*options.integrated ? 2 : 1) : 0};
  std::vector<int64_t> highest = mine;
  for (int64_t v : mine) highest.push_back(-v);
  highest.push_back(conflict.empty() ? 0 : comm.rank() + 1);  // one allreduce for both checks
  comm.allreduce(highest, ReduceOp::kMax);
  for (std::size_t i = 0; i < mine.size(); ++i)
    if (highest[i] != -highest[mine.size() + i])
      return invalid_argument("save '" + options.name + "': format and integrated must be the same on every rank");
  if (highest.back() != 0) {
    const int64_t named = conflict.empty() ? highest.back() - 1 : comm.rank();
    return invalid_argument("save '" + options.name + "': rank " + std::to_string(named) + ": " +
                            (conflict.empty() ? std::string("its info contradicts the save's step or epoch") : conflict));
  }
  return Status();
}

std::string_view entry_extension(const SaveSettings& settings) {
  return save_shape(settings) == SaveShape::kOneFile ? internal_format::driver(settings.format).extension
                                                     : std::string_view();
}

std::string per_rank_set_name(const std::string& name) {
  constexpr std::string_view kExt = ".ckpt";
  if (name.size() > kExt.size() && internal_base::ends_with(name, kExt)) return name.substr(0, name.size() - kExt.size());
  return name;
}

namespace {

// Rank 0, in the frame: what only the whole plan can tell.
Status shape_set_index(SaveFrame& frame) {
  const internal_plan::SavePlan& plan = frame.plan;
  for (std::size_t r = 0; r < plan.writes.size(); ++r) {
    std::set<uint32_t> tensors;
    for (const WriteItem& w : plan.writes[r])
      if (!tensors.insert(w.tensor).second)
        return invalid_argument("rank " + std::to_string(r) + " holds two boxes of tensor '" +
                                plan.index.tensors(static_cast<int>(w.tensor)).name() +
                                "': a per-rank .ckpt holds one slice per name (use the native format)");
  }
  DISTCKPT_RETURN_IF_ERROR(
      internal_format::check_writable(Format::kCkpt, internal_format::metadata_of(plan.index)));
  frame.plan.index.set_per_rank_format("ckpt");
  return Status();
}

// This rank's file's metadata: the checkpoint's common fields, one tensor per slice it
// writes (named as the tensor, shaped as the slice), and where the slice lies.
proto::Index rank_file_meta(const proto::Index& common, const std::vector<WriteItem>& mine, const StateDict& state,
                            int rank) {
  proto::Index meta = common;
  meta.clear_tensors();
  meta.set_format("ckpt");
  meta.set_per_rank_format("ckpt");
  meta.set_rank(rank);
  for (const WriteItem& w : mine) {
    const TensorEntry& e = state.tensors()[w.tensor];
    const Box& box = e.boxes[w.local_box];
    const proto::Tensor& global = common.tensors(static_cast<int>(w.tensor));
    proto::Tensor* t = meta.add_tensors();
    t->set_name(e.name);
    t->set_dtype(std::string(dtype_name(e.dtype)));
    for (int64_t d : box.shape) t->add_global_shape(d);
    proto::RankSlice* slice = t->mutable_slice();
    *slice->mutable_global_shape() = global.global_shape();
    for (int64_t d : box.offset) slice->add_offset(d);
    *slice->mutable_layout() = global.layout();
  }
  if (auto* add = internal_format::driver(Format::kCkpt).add_format_info) add(meta);
  return meta;
}

// Rank 0: MindSpore's strategy file beside the rank files, listed in the manifest with
// its CRC-32 (verify checks it; loads do not need it). A layout no strategy expresses
// leaves it out (`ls` says why).
Status add_strategy_file(const SaveFrame& frame, proto::Index& index) {
  Result<std::string> strategy = internal_format::mindspore_strategy(index);
  if (strategy.status().code() == StatusCode::kUnsupported) return Status();
  DISTCKPT_RETURN_IF_ERROR(strategy.status());
  const std::string path = frame.entry.tmp + "/" + internal_format::kStrategyFileName;
  DISTCKPT_ASSIGN_OR_RETURN(auto file, frame.fs->open_writable(path));
  DISTCKPT_RETURN_IF_ERROR(file->write_at(strategy->data(), strategy->size(), 0));
  if (frame.options.fsync) DISTCKPT_RETURN_IF_ERROR(file->sync());
  DISTCKPT_RETURN_IF_ERROR(file->close());
  proto::File* f = index.add_files();
  f->set_name(internal_format::kStrategyFileName);
  f->set_size(strategy->size());
  f->set_crc32_covered(strategy->size());
  f->set_crc32(internal_transform::crc32_zlib(0, strategy->data(), strategy->size()));
  return Status();
}

// Rank 0: the manifest, from the plan and what each rank's writer described.
Result<proto::Index> manifest(const SaveFrame& frame, const std::vector<std::string>& described) {
  const internal_plan::SavePlan& plan = frame.plan;
  proto::Index index = plan.index;
  index.clear_files();
  for (auto& t : *index.mutable_tensors()) t.clear_chunks();
  index.mutable_transforms()->set_checksum("crc32c");
  for (std::size_t r = 0; r < plan.writes.size(); ++r) {
    const std::string who = "save: rank " + std::to_string(r);
    proto::Index d;
    if (!d.ParseFromString(described[r]) || d.files_size() != 1 ||
        d.tensors_size() != static_cast<int>(plan.writes[r].size()))
      return internal_error(who + " described its file wrongly");
    proto::File* f = index.add_files();
    *f = d.files(0);
    f->set_name(internal_format::per_rank_file_name(static_cast<int>(r), frame.name));
    for (std::size_t i = 0; i < plan.writes[r].size(); ++i) {
      const WriteItem& w = plan.writes[r][i];
      const proto::Chunk& planned = plan.index.tensors(static_cast<int>(w.tensor)).chunks(static_cast<int>(w.chunk));
      proto::Tensor* t = index.mutable_tensors(static_cast<int>(w.tensor));
      for (const proto::Chunk& c : d.tensors(static_cast<int>(i)).chunks()) {
        if (c.offset_size() != planned.offset_size() || c.shape_size() != planned.offset_size())
          return internal_error(who + " described tensor '" + t->name() + "' with another rank");
        proto::Chunk* out = t->add_chunks();
        *out = c;
        for (int k = 0; k < c.offset_size(); ++k) out->set_offset(k, c.offset(k) + planned.offset(k));
        out->set_file_id(static_cast<uint32_t>(r));
        out->set_writer_rank(static_cast<int32_t>(r));
      }
    }
  }
  DISTCKPT_RETURN_IF_ERROR(add_strategy_file(frame, index));
  return index;
}

}  // namespace

Result<SaveResult> save_ckpt_set(Comm& comm, const StateDict& state, const std::string& root,
                                 const SaveOptions& options) {
  const std::string where = rank_prefix(comm);
  SaveOptions named = options;
  named.name = per_rank_set_name(options.name);
  FrameSpec spec;
  spec.name = named.name;
  spec.remove_redundancy = options.remove_redundancy;
  spec.writers = internal_plan::WriterChoice::kMindSpore;  // rank files as MindSpore's own
  if (options.encryption.enabled())
    spec.extra_checks = invalid_argument(
        "encryption of a per-rank .ckpt set (integrated=false) is not supported: encrypt a native checkpoint or an "
        "integrated .ckpt");
  spec.shape_index = shape_set_index;
  spec.entry_format = Format::kNative;
  DISTCKPT_ASSIGN_OR_RETURN(SaveSession session, begin_planned_save(comm, state, root, named, spec));
  SaveFrame& frame = session.frame;

  // Every rank's file carries the checkpoint's metadata (rank 0's plan).
  std::string common_bytes;
  if (comm.rank() == 0) internal_format::metadata_of(frame.plan.index).SerializeToString(&common_bytes);
  comm.broadcast_string(common_bytes, 0);

  // Protocol steps 1-2: every rank writes its file (one per rank, slices or not, as
  // MindSpore does) and fsyncs it and its directory.
  Timer write_timer;
  std::string described;
  Status written = session.local_error;  // already names this rank
  if (written.ok()) written = guarded(where + ": write", [&]() -> Status {
    proto::Index common;
    if (!common.ParseFromString(common_bytes)) return internal_error("bad metadata from rank 0");
    const proto::Index meta = rank_file_meta(common, session.mine, state, comm.rank());
    FileSystem& fs = *frame.fs;
    const std::string file = internal_format::per_rank_file_name(comm.rank(), frame.name);
    const std::string dir = frame.entry.tmp + "/" + internal_base::dir_name(file);
    DISTCKPT_RETURN_IF_ERROR(fs.create_dir(dir));
    internal_format::WriterOptions writer_options;
    writer_options.ckpt_crc_footer = options.ckpt_crc_footer;
    writer_options.describe_chunks = true;
    DISTCKPT_ASSIGN_OR_RETURN(auto writer, internal_format::make_sequential_writer(
                                               Format::kCkpt, fs, frame.entry.tmp + "/" + file, meta, writer_options));
    for (std::size_t i = 0; i < session.mine.size(); ++i) {
      const WriteItem& w = session.mine[i];
      const TensorEntry& e = state.tensors()[w.tensor];
      DISTCKPT_RETURN_IF_ERROR(writer->append(static_cast<int>(i), e.buffers[w.local_box], w.length)
                                   .with_context("tensor '" + e.name + "'"));
    }
    internal_base::kill_point("save-write");
    DISTCKPT_ASSIGN_OR_RETURN(proto::Index d, writer->finish(options.fsync));
    if (options.fsync) DISTCKPT_RETURN_IF_ERROR(fs.sync_dir(dir));
    frame.result.rank_bytes_written = writer->bytes_written();
    proto::Index report;  // only what the manifest needs from it
    *report.mutable_files() = d.files();
    for (const auto& t : d.tensors()) *report.add_tensors()->mutable_chunks() = t.chunks();
    report.SerializeToString(&described);
    return Status();
  });
  frame.result.write_s = write_timer.seconds();
  if (!written.ok() && session.local_error.ok()) written = written.with_context(where);
  std::vector<std::string> all = comm.gather(written.ok() ? described : std::string(), 0);
  return close_save(comm, frame, written, [&]() { return manifest(frame, all); });
}

}  // namespace distckpt::internal_collective
