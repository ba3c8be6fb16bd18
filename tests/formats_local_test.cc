// Integrated save and the single-file formats (MindSpore .ckpt, safetensors, HDF5 on
// one rank, native + integrated) with in-process ranks: gather_full, round trips of
// every dtype across world sizes and layouts, files written the way MindSpore writes
// them, records over 512 MiB, listing, and hostile files.
#include <gtest/gtest.h>
#include <zlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <thread>
#include <atomic>
#include <optional>
#include <chrono>
#include <functional>

#include "comm/local_comm.h"
#include "distckpt/checkpoint.h"
#include "distckpt/convert.h"
#include "distckpt/inspect.h"
#include "distckpt/gather.h"
#include "distckpt/manager.h"
#include "format/native/index_codec.h"
#include "format/ckpt/ms_ckpt.h"
#include "format/format.h"
#include "format/stored.h"
#include "format_model.h"
#include "mindspore_checkpoint.pb.h"
#include "storage/fault_fs.h"
#include "transform/crc32c.h"
#include "local_ranks.h"
#include "test_util.h"

namespace distckpt {
namespace {

using testing::FormatModel;
using testing::TempDir;
namespace fs = std::filesystem;

using testing::expect_all_ok;
using testing::run_ranks;

Status save_model(int world, const std::string& root, SaveOptions options, bool irregular = true) {
  std::vector<std::string> res = run_ranks(world, [&](Comm& comm) -> Status {
    FormatModel m(comm.rank(), world, irregular);
    return save(comm, m.state, root, options).status();
  });
  for (const auto& r : res)
    if (r != res[0]) return internal_error("ranks disagree: " + res[0] + " vs " + r);
  return res[0] == "ok" ? Status() : Status(StatusCode::kInternal, res[0]);
}

// Loads `path` into a FormatModel of `world` ranks and compares with the expected bytes.
void load_and_compare(int world, const std::string& path, bool irregular = true) {
  expect_all_ok(run_ranks(world, [&](Comm& comm) -> Status {
    FormatModel got(comm.rank(), world, irregular), want(comm.rank(), world, irregular);
    got.zero();
    auto r = load(comm, got.state, path, {});
    if (!r.ok()) return r.status();
    for (std::size_t i = 0; i < got.buffers.size(); ++i)
      if (got.buffers[i] != want.buffers[i]) return internal_error("buffer " + std::to_string(i) + " differs");
    if (info_value_to_string(r->info.at("tag")) != "hello" || std::get<double>(r->info.at("lr")) != 0.25 ||
        std::get<bool>(r->info.at("flag")) != true || std::get<int64_t>(r->info.at("seed")) != 1234)
      return internal_error("info values differ");
    if (r->step != 12 || r->epoch != 3) return internal_error("step/epoch " + std::to_string(r->step));
    return Status();
  }));
}

TEST(GatherFull, EveryTensorOnEveryRankAndOnOneRoot) {
  for (int world : {1, 2, 3, 4}) {
    expect_all_ok(run_ranks(world, [&](Comm& comm) -> Status {
      FormatModel m(comm.rank(), world);
      // Every rank makes every call (collectives), and reports the first difference.
      Status first;
      for (const TensorEntry& e : m.state.tensors()) {
        const auto want = testing::full_tensor(e.name);
        std::vector<unsigned char> all(want.size(), 0), one(want.size(), 0);
        DISTCKPT_RETURN_IF_ERROR(gather_full(comm, m.state, e.name, all.data()));
        if (all != want && first.ok()) first = internal_error("world " + std::to_string(world) + ": gather_full to all differs for " + e.name);
        const int root = world - 1;
        DISTCKPT_RETURN_IF_ERROR(gather_full(comm, m.state, e.name, comm.rank() == root ? one.data() : nullptr, root));
        if (comm.rank() == root && one != want && first.ok()) first = internal_error("gather_full to root differs for " + e.name);
      }
      DISTCKPT_RETURN_IF_ERROR(first);
      // A region of rows 2-4 and columns 1-3 of the first tensor.
      const TensorEntry& e = m.state.tensors()[0];
      const Box region{{2, 1}, {3, 3}};
      std::vector<unsigned char> got(9 * dtype_size(e.dtype));
      DISTCKPT_RETURN_IF_ERROR(gather_region(comm, m.state, e.name, region, got.data()));
      const auto full = testing::full_tensor(e.name);
      std::vector<unsigned char> want(got.size());
      copy_box(full.data(), full_box({6, 6}), want.data(), region, region, dtype_size(e.dtype));
      return got == want ? Status() : internal_error("gather_region differs");
    }));
  }
}

TEST(GatherFull, BadArgumentsFailOnEveryRank) {
  auto res = run_ranks(3, [&](Comm& comm) -> Status {
    FormatModel m(comm.rank(), 3);
    std::vector<char> out(1 << 12);
    Status a = gather_full(comm, m.state, "nope", out.data());
    Status b = gather_region(comm, m.state, "bias", Box{{3}, {4}}, out.data());
    Status c = gather_full(comm, m.state, "bias", out.data(), 7);
    if (a.code() != StatusCode::kInvalidArgument || b.code() != StatusCode::kInvalidArgument ||
        c.code() != StatusCode::kInvalidArgument)
      return internal_error(a.to_string() + " | " + b.to_string() + " | " + c.to_string());
    return Status();
  });
  expect_all_ok(res);
}

struct Case {
  Format format;
  std::optional<bool> integrated;  // false with kCkpt: a per-rank set
  int save_world, load_world;
};

class RoundTrip : public ::testing::TestWithParam<Case> {};

TEST_P(RoundTrip, EveryDTypeAcrossLayouts) {
  const Case c = GetParam();
  TempDir dir;
  SaveOptions options;
  options.name = "model-3_12";
  options.step = 12;
  options.epoch = 3;
  options.format = c.format;
  options.integrated = c.integrated;
  options.gather_bytes = 40;  // several regions per tensor: exercises the pipeline
  options.writer_rank = c.save_world - 1;
  const bool per_rank = c.format == Format::kCkpt && c.integrated == false;
  Status saved = save_model(c.save_world, dir.path(), options, !per_rank);
  ASSERT_TRUE(saved.ok()) << saved.to_string();
  const std::string ext(per_rank ? "" : internal_format::driver(c.format).extension);
  const std::string path = dir.path() + "/model-3_12" + ext;
  ASSERT_TRUE(fs::exists(path));
  for (const auto& e : fs::directory_iterator(dir.path()))
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
  // Owner-only, whichever library wrote it (HDF5 creates files with the umask's mode).
  auto expect_owner_only = [](const fs::path& p) {
    const auto expected = fs::is_directory(p) ? fs::perms::owner_all : fs::perms::owner_read | fs::perms::owner_write;
    EXPECT_EQ(fs::status(p).permissions() & fs::perms::all, expected) << p;
  };
  expect_owner_only(path);
  if (fs::is_directory(path))
    for (const auto& e : fs::recursive_directory_iterator(path)) expect_owner_only(e.path());
  if (per_rank)  // MindSpore's layout: one file per rank, each a .ckpt of its slices
    for (int r = 0; r < c.save_world; ++r) {
      const std::string file = path + "/rank_" + std::to_string(r) + "/model-3_12.ckpt";
      ASSERT_TRUE(fs::exists(file)) << file;
      auto alone = read_checkpoint_info(file);
      ASSERT_TRUE(alone.ok()) << alone.status().to_string();
      EXPECT_EQ(alone->format, Format::kCkpt);
      EXPECT_TRUE(verify_checkpoint(file).ok()) << file;
    }
  auto verified = verify_checkpoint(path);
  ASSERT_TRUE(verified.ok()) << verified.status().to_string();
  auto info = read_checkpoint_info(path);
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  EXPECT_EQ(info->format, per_rank ? Format::kNative : c.format);
  EXPECT_EQ(info->per_rank_files, per_rank);
  EXPECT_EQ(info->step, 12);
  load_and_compare(c.load_world, path, !per_rank);
  load_and_compare(c.load_world, dir.path(), !per_rank);  // the root resolves to the file
}

INSTANTIATE_TEST_SUITE_P(
    Formats, RoundTrip,
    ::testing::Values(Case{Format::kCkpt, true, 1, 1}, Case{Format::kCkpt, true, 2, 3}, Case{Format::kCkpt, true, 4, 1},
                      Case{Format::kCkpt, true, 3, 4}, Case{Format::kSafetensors, true, 1, 2},
                      Case{Format::kSafetensors, true, 4, 3}, Case{Format::kSafetensors, true, 3, 1},
                      Case{Format::kNative, true, 4, 2}, Case{Format::kNative, true, 2, 3},
                      Case{Format::kHdf5, false, 1, 1}, Case{Format::kHdf5, false, 1, 4},
                      Case{Format::kCkpt, false, 1, 2}, Case{Format::kCkpt, false, 4, 1},
                      Case{Format::kCkpt, false, 3, 4}),
    [](const auto& info) {
      const bool per_rank = info.param.format == Format::kCkpt && info.param.integrated == false;
      return std::string(format_name(info.param.format)) + (per_rank ? "_per_rank_" : "_") +
             std::to_string(info.param.save_world) + "to" + std::to_string(info.param.load_world);
    });

// HDF5 files are laid out by rank 0 and written by every rank through the FileSystem
// (collective/save_hdf5.cc): no MPI communicator is needed, in-process ranks work too.
TEST(Formats, HdfOverSeveralInProcessRanksSavesAndLoads) {
  TempDir dir;
  SaveOptions options;
  options.name = "m";
  options.step = 12;
  options.epoch = 3;
  options.format = Format::kHdf5;
  Status st = save_model(3, dir.path(), options);
  ASSERT_TRUE(st.ok()) << st.to_string();
  ASSERT_TRUE(fs::exists(dir.path() + "/m.h5"));
  EXPECT_TRUE(verify_checkpoint(dir.path() + "/m.h5").ok());
  load_and_compare(2, dir.path() + "/m.h5");
}

// Writes `message` serialized, plus MindSpore's footer when asked.
void write_ckpt(const std::string& path, const std::string& bytes, bool footer) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
  if (footer) out << internal_format::ckpt_footer(static_cast<uint32_t>(::crc32(0, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(bytes.size()))));
}

void add_value(Checkpoint& ck, const std::string& tag, std::vector<int64_t> dims, const std::string& type,
               const std::string& content) {
  auto* v = ck.add_value();
  v->set_tag(tag);
  for (int64_t d : dims) v->mutable_tensor()->add_dims(d);
  v->mutable_tensor()->set_tensor_type(type);
  v->mutable_tensor()->set_tensor_content(content);
}

TEST(MindSporeCkpt, FileBuiltWithGeneratedClassesLoadsIntoAnyLayout) {
  TempDir dir;
  std::vector<float> w(6 * 4);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i) * 0.5f;
  std::vector<int32_t> big(8 * 3);
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<int32_t>(i) - 7;
  const float scalar = 3.25f;
  const int64_t epoch = 4, step = 40;
  Checkpoint ck;
  add_value(ck, "net.w", {6, 4}, "Float32", std::string(reinterpret_cast<char*>(w.data()), w.size() * 4));
  // "big" split into three records with the same tag, cut at element 7 and 13 (not on
  // row boundaries), as MindSpore 2.x cuts raw byte pieces.
  const std::string all(reinterpret_cast<char*>(big.data()), big.size() * 4);
  add_value(ck, "big", {8, 3}, "Int32", all.substr(0, 7 * 4));
  add_value(ck, "big", {8, 3}, "Int32", all.substr(7 * 4, 6 * 4));
  add_value(ck, "big", {8, 3}, "Int32", all.substr(13 * 4));
  add_value(ck, "scalar", {}, "Float32", std::string(reinterpret_cast<const char*>(&scalar), 4));
  add_value(ck, "note", {0}, "str", std::string("o\0\0\0k\0\0\0\xe9\0\0\0", 12));  // numpy's UTF-32LE
  add_value(ck, "epoch_num", {}, "Int64", std::string(reinterpret_cast<const char*>(&epoch), 8));
  add_value(ck, "step_num", {0}, "Int64", std::string(reinterpret_cast<const char*>(&step), 8));
  const std::string path = dir.path() + "/ms.ckpt";
  write_ckpt(path, ck.SerializeAsString(), true);

  auto info = read_checkpoint_info(path);
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  EXPECT_EQ(info->step, 40);
  EXPECT_EQ(info->epoch, 4);
  // Numeric scalars (epoch_num, step_num, "scalar") are tensors and info values both: a
  // state without them loads strictly below (they are not "unexpected").
  ASSERT_EQ(info->tensors.size(), 5u);
  EXPECT_EQ(info->tensors[1].chunks.size(), 7u);  // [0:2,:] [2:3,0:1] | [2:3,1:3] [3:4,:] [4:5,0:1] | [4:5,1:3] [5:8,:]
  EXPECT_EQ(info_value_to_string(info->info.at("note")), "ok\xc3\xa9");
  EXPECT_EQ(info_value_to_string(info->info.at("scalar")), info_value_to_string(InfoValue(3.25)));
  EXPECT_EQ(info_value_to_string(info->info.at("epoch_num")), "4");
  ASSERT_TRUE(verify_checkpoint(path).ok());

  expect_all_ok(run_ranks(2, [&](Comm& comm) -> Status {
    // net.w split on columns over 2 ranks, big on rows, scalar replicated.
    StateDict state(comm.rank());
    std::vector<float> wpart(6 * 2);
    std::vector<int32_t> bpart(4 * 3);
    float s = 0;
    DISTCKPT_RETURN_IF_ERROR(state.add_tensor("net.w", DType::kFloat32, wpart.data(), *TensorLayout::from_device_matrix({6, 4}, {2}, {-1, 0})));
    DISTCKPT_RETURN_IF_ERROR(state.add_tensor("big", DType::kInt32, bpart.data(), *TensorLayout::from_device_matrix({8, 3}, {2}, {0, -1})));
    DISTCKPT_RETURN_IF_ERROR(state.add_tensor("scalar", DType::kFloat32, &s, *TensorLayout::from_device_matrix({}, {2}, {})));
    auto r = load(comm, state, path, {});
    if (!r.ok()) return r.status();
    for (int i = 0; i < 6; ++i)
      for (int j = 0; j < 2; ++j)
        if (wpart[static_cast<std::size_t>(i * 2 + j)] != w[static_cast<std::size_t>(i * 4 + comm.rank() * 2 + j)])
          return internal_error("net.w differs");
    for (int i = 0; i < 12; ++i)
      if (bpart[static_cast<std::size_t>(i)] != big[static_cast<std::size_t>(comm.rank() * 12 + i)]) return internal_error("big differs");
    if (s != scalar) return internal_error("scalar differs");
    if (r->step != 40 || std::get<int64_t>(r->info.at("epoch_num")) != 4) return internal_error("append info");
    return Status();
  }));

  // One flipped byte in a tensor: the footer check refuses the load on every rank.
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(40);
    char c;
    f.read(&c, 1);
    f.seekp(40);
    c = static_cast<char>(c ^ 0x5a);
    f.write(&c, 1);
  }
  auto res = run_ranks(2, [&](Comm& comm) -> Status {
    StateDict state(comm.rank());
    std::vector<float> wfull(24);
    DISTCKPT_RETURN_IF_ERROR(state.add_tensor("net.w", DType::kFloat32, wfull.data(), *TensorLayout::from_device_matrix({6, 4}, {2}, {-1, -1})));
    LoadOptions lo;
    lo.strict = false;
    lo.allow_unexpected = true;  // the file holds more tensors: the CRC-32 check is what is tested
    return load(comm, state, path, lo).status();
  });
  for (const auto& r : res) EXPECT_NE(r.find("CRC-32"), std::string::npos) << r;
  EXPECT_EQ(verify_checkpoint(path).status().code(), StatusCode::kCorruption);
}

// MindSpore writes .ckpt files without their footer by default (crc_check=False) and
// loads them: so do we, with a warning in the load result, verify's report and the
// listing; allow_unchecked = false (MindSpore's crc_check=True) refuses them.
TEST(MindSporeCkpt, AForeignFileWithoutItsFooterLoadsWithAWarning) {
  TempDir dir;
  std::vector<float> w(4 * 2, 1.5f);
  Checkpoint ck;
  add_value(ck, "w", {4, 2}, "Float32", std::string(reinterpret_cast<char*>(w.data()), w.size() * 4));
  const std::string path = dir.path() + "/ms.ckpt";
  write_ckpt(path, ck.SerializeAsString(), false);
  auto report = verify_checkpoint(path);
  ASSERT_TRUE(report.ok()) << report.status().to_string();
  EXPECT_NE(report->warning.find("records no checksums"), std::string::npos) << report->warning;
  VerifyOptions strict_verify;
  strict_verify.allow_unchecked = false;
  EXPECT_EQ(verify_checkpoint(path, strict_verify).status().code(), StatusCode::kUnsupported);
  auto listing = list_checkpoints(dir.path());
  ASSERT_TRUE(listing.ok() && listing->entries.size() == 1u);
  EXPECT_EQ(listing->entries[0].state, EntryState::kCommitted);
  EXPECT_NE(listing->entries[0].detail.find("unchecked"), std::string::npos) << listing->entries[0].detail;
  expect_all_ok(run_ranks(2, [&](Comm& comm) -> Status {
    StateDict state(comm.rank());
    std::vector<float> part(2 * 2, 0.f);
    DISTCKPT_RETURN_IF_ERROR(state.add_tensor("w", DType::kFloat32, part.data(), *TensorLayout::from_device_matrix({4, 2}, {2}, {0, -1})));
    DISTCKPT_ASSIGN_OR_RETURN(LoadResult r, load(comm, state, path, {}));
    if (r.warning.find("records no checksums") == std::string::npos) return internal_error("no warning: " + r.warning);
    if (part != std::vector<float>(4, 1.5f)) return internal_error("wrong values");
    LoadOptions crc_check;
    crc_check.allow_unchecked = false;
    Status refused = load(comm, state, path, crc_check).status();
    if (refused.code() != StatusCode::kUnsupported) return internal_error("crc_check: " + refused.to_string());
    return Status();
  }));
}

TEST(MindSporeCkpt, OurFileParsesWithTheGeneratedClasses) {
  TempDir dir;
  SaveOptions options;
  options.name = "m";
  options.step = 12;
  options.epoch = 3;
  options.format = Format::kCkpt;
  ASSERT_TRUE(save_model(2, dir.path(), options).ok());
  std::ifstream in(dir.path() + "/m.ckpt", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(bytes.size(), 17u);
  ASSERT_EQ(bytes.substr(bytes.size() - 17, 7), "crc_num");
  const std::string body = bytes.substr(0, bytes.size() - 17);
  uint32_t crc = 0;
  for (int i = 13; i < 17; ++i) crc = (crc << 8) | static_cast<uint8_t>(bytes[bytes.size() - 17 + static_cast<std::size_t>(i)]);
  EXPECT_EQ(crc, static_cast<uint32_t>(::crc32(0, reinterpret_cast<const Bytef*>(body.data()), static_cast<uInt>(body.size()))));
  Checkpoint ck;
  ASSERT_TRUE(ck.ParseFromString(body));
  // Byte for byte what protobuf's serializer writes for each record (MindSpore writes one
  // Checkpoint with one Value at a time), after distckpt's field 1000 (tag bytes C2 3E).
  std::string records;
  for (const auto& v : ck.value()) {
    Checkpoint one;
    *one.add_value() = v;
    records += one.SerializeAsString();
  }
  // Then field 1002 (tag bytes D2 3E), which MindSpore's parser skips: the CRC32C of each
  // tensor record's content (one chunk per record at this size; info records are not
  // chunks), and of the structure: every byte before it but the tensors' contents.
  const std::set<std::string> info_keys{"epoch_num", "step_num", "lr", "tag", "flag", "seed"};
  const std::size_t records_at = body.find(records);
  ASSERT_NE(records_at, std::string::npos);
  const std::string tail = body.substr(records_at + records.size());
  ASSERT_GT(tail.size(), 3u);
  EXPECT_EQ(tail.substr(0, 2), std::string("\xd2\x3e"));
  proto::CkptChecks stored;
  ASSERT_TRUE(stored.ParseFromString(tail.substr(3)));  // a one-byte length at this size
  std::vector<uint32_t> want_chunks;
  std::string structure = body.substr(0, records_at);  // the metadata field
  for (const auto& v : ck.value()) {
    const std::string& content = v.tensor().tensor_content();
    if (info_keys.count(v.tag())) {
      Checkpoint one;
      *one.add_value() = v;
      structure += one.SerializeAsString();
      continue;
    }
    Shape dims(v.tensor().dims().begin(), v.tensor().dims().end());
    structure += internal_format::ckpt_record_header(v.tag(), dims, v.tensor().tensor_type(), content.size());
    if (!content.empty()) want_chunks.push_back(internal_transform::crc32c(content.data(), content.size()));
  }
  EXPECT_EQ(std::vector<uint32_t>(stored.chunk_crc32c().begin(), stored.chunk_crc32c().end()), want_chunks);
  EXPECT_EQ(stored.structure_crc32c(), internal_transform::crc32c(structure.data(), structure.size()));
  EXPECT_EQ(body.substr(0, 2), std::string("\xc2\x3e"));
  std::map<std::string, const Checkpoint::Value*> by_tag;
  for (const auto& v : ck.value()) by_tag[v.tag()] = &v;
  const auto* w = by_tag.at("layer0/w_float32");
  EXPECT_EQ(w->tensor().tensor_type(), "Float32");
  ASSERT_EQ(w->tensor().dims_size(), 2);
  EXPECT_EQ(w->tensor().dims(0), 6);
  const auto want = testing::full_tensor("layer0/w_float32");
  EXPECT_EQ(w->tensor().tensor_content(), std::string(want.begin(), want.end()));
  EXPECT_EQ(by_tag.at("layer2/w_bfloat16")->tensor().tensor_type(), "BFloat16");
  const auto* scale = by_tag.at("scale");
  ASSERT_EQ(scale->tensor().dims_size(), 1);
  EXPECT_EQ(scale->tensor().dims(0), 0);  // MindSpore's scalar
  int64_t step = 0;
  std::memcpy(&step, by_tag.at("step_num")->tensor().tensor_content().data(), 8);
  EXPECT_EQ(step, 12);
  EXPECT_EQ(by_tag.at("step_num")->tensor().tensor_type(), "Int64");
  EXPECT_EQ(by_tag.at("tag")->tensor().tensor_type(), "str");
  // numpy's str, as MindSpore's load_checkpoint decodes it: UTF-32LE.
  EXPECT_EQ(by_tag.at("tag")->tensor().tensor_content(), std::string("h\0\0\0e\0\0\0l\0\0\0l\0\0\0o\0\0\0", 20));
  // An empty tensor is a record without content, with its real dims.
  ASSERT_EQ(by_tag.at("empty")->tensor().dims_size(), 2);
  EXPECT_EQ(by_tag.at("empty")->tensor().tensor_content(), "");
}

// An empty string is numpy's '' (one NUL code unit, as np.array('').tobytes()): MindSpore's
// reader cannot make a numpy U0 array from a record without content. It reads back as "".
TEST(MindSporeCkpt, AnEmptyStringIsOneNulCodeUnit) {
  TempDir dir;
  std::string path;
  expect_all_ok(run_ranks(1, [&](Comm& comm) -> Status {
    StateDict state(comm.rank());
    float w = 1;
    DISTCKPT_RETURN_IF_ERROR(state.add_tensor("w", DType::kFloat32, &w, *TensorLayout::from_device_matrix({1}, {1}, {-1})));
    DISTCKPT_RETURN_IF_ERROR(state.set_info("note", std::string()));
    SaveOptions o;
    o.name = "m";
    o.format = Format::kCkpt;
    DISTCKPT_ASSIGN_OR_RETURN(SaveResult saved, save(comm, state, dir.path(), o));
    path = saved.path;
    DISTCKPT_ASSIGN_OR_RETURN(LoadResult loaded, load(comm, state, path, {}));
    return info_value_to_string(loaded.info.at("note")).empty() ? Status() : internal_error("note reads back non-empty");
  }));
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Checkpoint ck;
  ASSERT_TRUE(ck.ParseFromString(bytes.substr(0, bytes.size() - 17)));
  bool seen = false;
  for (const auto& v : ck.value())
    if (v.tag() == "note") {
      seen = true;
      EXPECT_EQ(v.tensor().tensor_type(), "str");
      EXPECT_EQ(v.tensor().tensor_content(), std::string(4, '\0'));
    }
  EXPECT_TRUE(seen);
}

// MindSpore's integrated_save=False: NAME/rank_<r>/NAME.ckpt, each a MindSpore file of
// that rank's slices; with remove_redundancy each distinct slice is in one file only.
TEST(MindSporePerRankSet, EachRankFileIsMindSporesAndHoldsItsSlices) {
  for (bool remove_redundancy : {true, false}) {
    SCOPED_TRACE(remove_redundancy ? "remove_redundancy" : "every rank writes its slices");
    TempDir dir;
    SaveOptions options;
    options.name = "net-1_4.ckpt";  // the set's name loses the extension
    options.step = 12;
    options.epoch = 3;
    options.format = Format::kCkpt;
    options.integrated = false;
    options.remove_redundancy = remove_redundancy;
    const int world = 4;  // TP2 x DP2
    ASSERT_TRUE(save_model(world, dir.path(), options, /*irregular=*/false).ok());
    const std::string set = dir.path() + "/net-1_4";
    ASSERT_TRUE(fs::is_directory(set));
    std::map<std::string, int> copies;  // tensor -> records over all files
    for (int r = 0; r < world; ++r) {
      std::ifstream in(set + "/rank_" + std::to_string(r) + "/net-1_4.ckpt", std::ios::binary);
      std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      ASSERT_GT(bytes.size(), 17u);
      ASSERT_EQ(bytes.substr(bytes.size() - 17, 7), "crc_num");
      Checkpoint ck;
      ASSERT_TRUE(ck.ParseFromString(bytes.substr(0, bytes.size() - 17))) << "rank " << r;
      FormatModel mine(r, world, false);
      std::map<std::string, const Checkpoint::Value*> by_tag;
      for (const auto& v : ck.value()) by_tag[v.tag()] = &v;
      for (std::size_t t = 0; t < mine.state.tensors().size(); ++t) {
        const TensorEntry& e = mine.state.tensors()[t];
        if (!by_tag.count(e.name)) continue;
        ++copies[e.name];
        const auto& tensor = by_tag.at(e.name)->tensor();
        const Box& box = e.boxes[0];
        if (box.shape.empty()) continue;  // the scalar: MindSpore's dims [0]
        ASSERT_EQ(tensor.dims_size(), static_cast<int>(box.shape.size())) << e.name;
        for (std::size_t d = 0; d < box.shape.size(); ++d) EXPECT_EQ(tensor.dims(static_cast<int>(d)), box.shape[d]) << e.name;
        const std::size_t n = static_cast<std::size_t>(box.num_elements()) * dtype_size(e.dtype);
        EXPECT_EQ(tensor.tensor_content(), std::string(static_cast<const char*>(e.buffers[0]), n)) << e.name;
      }
      // MindSpore's step and epoch records are in every file.
      EXPECT_TRUE(by_tag.count("step_num") && by_tag.count("epoch_num")) << "rank " << r;
    }
    // layer0 is split in 2 over TP and replicated over DP2; bias is whole on every rank.
    EXPECT_EQ(copies["layer0/w_float32"], remove_redundancy ? 2 : 4);
    EXPECT_EQ(copies["bias"], remove_redundancy ? 1 : 4);
    auto listing = list_checkpoints(dir.path());
    ASSERT_TRUE(listing.ok());
    ASSERT_EQ(listing->entries.size(), 1u);  // one checkpoint, not four files
    EXPECT_EQ(listing->entries[0].name, "net-1_4");
    EXPECT_TRUE(listing->entries[0].per_rank_files);
    EXPECT_EQ(listing->latest, "net-1_4");
    // Merged into one MindSpore file, and loaded onto other layouts (RoundTrip covers more).
    auto converted = convert_checkpoint(set, dir.path() + "/one.ckpt", Format::kCkpt);
    ASSERT_TRUE(converted.ok()) << converted.status().to_string();
    load_and_compare(3, dir.path() + "/one.ckpt", false);
    load_and_compare(1, set, false);
  }
}

TEST(MindSporePerRankSet, CommittedAsOneOrNotAtAllAndFailsClosed) {
  TempDir dir;
  SaveOptions options;
  options.name = "s";
  options.format = Format::kCkpt;
  options.integrated = false;
  options.step = 12;
  options.epoch = 3;
  auto save_with = [&](const std::string& name, int victim, std::shared_ptr<FileSystem> victim_fs) {
    return run_ranks(4, [&](Comm& comm) -> Status {
      FormatModel m(comm.rank(), 4, false);
      SaveOptions o = options;
      o.name = name;
      if (comm.rank() == victim) o.fs = victim_fs;
      return save(comm, m.state, dir.path(), o).status();
    });
  };
  for (const auto& r : save_with("good", -1, nullptr)) ASSERT_EQ(r, "ok");
  // One rank's disk fills while it writes its file: every rank fails, nothing appears.
  internal_storage::FaultSpec full;
  full.write_budget = 100;
  full.budget_path_contains = "rank_2/";
  for (const auto& r : save_with("bad", 2, std::make_shared<internal_storage::FaultFileSystem>(posix_filesystem(), full)))
    EXPECT_NE(r.find("No space left on device"), std::string::npos) << r;
  auto listing = list_checkpoints(dir.path());
  ASSERT_TRUE(listing.ok());
  ASSERT_EQ(listing->entries.size(), 1u) << "the temporary set must be gone";
  EXPECT_EQ(listing->latest, "good");
  // A set whose manifest was never written (a crash before the commit) is in flight.
  const std::string good = dir.path() + "/good";
  fs::copy(good, dir.path() + "/late.tmp-0123456789abcdef", fs::copy_options::recursive);
  fs::remove(dir.path() + "/late.tmp-0123456789abcdef/index.pb");
  listing = list_checkpoints(dir.path());
  ASSERT_TRUE(listing.ok());
  ASSERT_EQ(listing->entries.size(), 2u);
  EXPECT_EQ(listing->entries[0].state, EntryState::kCommitted);
  EXPECT_EQ(listing->entries[1].state, EntryState::kInFlight);
  EXPECT_EQ(*resolve_checkpoint(dir.path()), good);

  // Damage is found by the chunks' CRC32C on load and by verify, naming the file.
  auto load_status = [&](const std::string& path) {
    std::vector<std::string> res = run_ranks(2, [&](Comm& comm) -> Status {
      FormatModel m(comm.rank(), 2, false);
      return load(comm, m.state, path, {}).status();
    });
    return res[0];
  };
  auto copy_of = [&](const std::string& name) {
    fs::copy(good, dir.path() + "/" + name, fs::copy_options::recursive);
    return dir.path() + "/" + name;
  };
  const std::string flipped = copy_of("flipped");
  auto info = read_checkpoint_info(flipped);
  ASSERT_TRUE(info.ok());
  uint64_t at = 0;
  for (const auto& t : info->tensors)  // a byte of the first slice rank 1's file holds
    for (const auto& c : t.chunks)
      if (at == 0 && c.file == "rank_1/good.ckpt" && c.length > 3) at = c.byte_offset + 3;
  ASSERT_GT(at, 0u);
  {
    std::fstream f(flipped + "/rank_1/good.ckpt", std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(at));
    char b = 0;
    f.read(&b, 1);
    b = static_cast<char>(b ^ 0x5a);
    f.seekp(static_cast<std::streamoff>(at));
    f.write(&b, 1);
  }
  std::string st = load_status(flipped);
  EXPECT_NE(st.find("rank_1/good.ckpt"), std::string::npos) << st;
  EXPECT_NE(st.find("crc32c"), std::string::npos) << st;
  EXPECT_EQ(verify_checkpoint(flipped).status().code(), StatusCode::kCorruption);
  const std::string cut = copy_of("cut");
  fs::resize_file(cut + "/rank_3/good.ckpt", fs::file_size(cut + "/rank_3/good.ckpt") - 20);
  st = load_status(cut);
  EXPECT_NE(st.find("rank_3/good.ckpt"), std::string::npos) << st;
  EXPECT_NE(st.find("truncated"), std::string::npos) << st;
  // A rank directory that is a symlink (to another checkpoint's files, or anywhere): its
  // file is never read, as no data file is read from outside the checkpoint.
  const std::string linked = copy_of("linked");
  fs::remove_all(linked + "/rank_1");
  fs::create_directory_symlink(good + "/rank_1", linked + "/rank_1");
  st = load_status(linked);
  EXPECT_NE(st.find("is not a directory of the checkpoint"), std::string::npos) << st;
  EXPECT_EQ(verify_checkpoint(linked).status().code(), StatusCode::kCorruption);
  // A manifest naming a file that is not rank_<r>/<name>.ckpt of this set (another name,
  // a rank the set does not have) is refused as corrupt before anything is opened.
  for (const std::string& bad : {std::string("rank_1/other.ckpt"), std::string("rank_9/good.ckpt")}) {
    const std::string forged = copy_of("forged");
    std::ifstream in(forged + "/index.pb", std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    in.close();
    auto index = internal_format::parse_index(bytes, forged);
    ASSERT_TRUE(index.ok()) << index.status().to_string();
    index->mutable_files(1)->set_name(bad);
    std::ofstream(forged + "/index.pb", std::ios::binary | std::ios::trunc) << internal_format::frame_index(*index);
    auto forged_info = read_checkpoint_info(forged);
    EXPECT_EQ(forged_info.status().code(), StatusCode::kCorruption) << bad;
    EXPECT_NE(forged_info.status().message().find("only a per-rank set's rank_<r>/<name>.ckpt"), std::string::npos)
        << forged_info.status().to_string();
    fs::remove_all(forged);
  }
  const std::string lost = copy_of("lost");
  fs::remove_all(lost + "/rank_0");
  st = load_status(lost);
  EXPECT_NE(st.find("rank_0/good.ckpt"), std::string::npos) << st;
  EXPECT_FALSE(verify_checkpoint(lost).ok());
}

TEST(MindSporePerRankSet, RefusedWhereItCannotHoldTheState) {
  TempDir dir;
  auto save_all = [&](int world, bool irregular, const std::function<void(int, SaveOptions&)>& edit) {
    return run_ranks(world, [&](Comm& comm) -> Status {
      FormatModel m(comm.rank(), world, irregular);
      SaveOptions o;
      o.name = "x";
      o.format = Format::kCkpt;
      o.integrated = false;
      edit(comm.rank(), o);
      return save(comm, m.state, dir.path(), o).status();
    });
  };
  auto expect_all = [](const std::vector<std::string>& res, const std::string& part) {
    for (const auto& r : res) EXPECT_NE(r.find(part), std::string::npos) << r;
  };
  // Explicit layouts that give a rank two boxes of one tensor.
  expect_all(save_all(2, true, [](int, SaveOptions&) {}), "holds two boxes of tensor 'irregular'");
  expect_all(save_all(2, false, [](int, SaveOptions& o) { 
               o.encryption.key = std::make_shared<const EncryptionKey>(*EncryptionKey::from_bytes(std::string(32, 'k')));
             }),
             "encryption of a per-rank .ckpt set");
  expect_all(save_all(2, false, [](int, SaveOptions& o) { o.format = Format::kSafetensors; }),
             "a safetensors file holds whole tensors");
  // Ranks that disagree would otherwise run different protocols.
  expect_all(save_all(3, false, [](int rank, SaveOptions& o) { if (rank == 1) o.integrated.reset(); }),
             "format and integrated must be the same on every rank");
  // ... even where the layout they lead to is the same (a refusal depends on the value).
  expect_all(save_all(2, false,
                      [](int rank, SaveOptions& o) {
                        o.format = Format::kSafetensors;
                        if (rank == 1) o.integrated.reset();
                      }),
             "format and integrated must be the same on every rank");
  auto listing = list_checkpoints(dir.path());
  EXPECT_TRUE(!listing.ok() || listing->entries.empty());
}

// The manager names, lists and retires a set as one checkpoint.
TEST(MindSporePerRankSet, ManagerKeepsAndRetiresSetsAsOne) {
  TempDir dir;
  expect_all_ok(run_ranks(2, [&](Comm& comm) -> Status {
    FormatModel m(comm.rank(), 2, false);
    CheckpointConfig c;
    c.directory = dir.path();
    c.prefix = "net";
    c.format = Format::kCkpt;
    c.integrated = false;
    c.steps_per_epoch = 2;
    c.name_template = "{prefix}-{epoch}_{step_in_epoch}";
    c.save_every_steps = 1;
    c.keep_max = 2;
    DISTCKPT_ASSIGN_OR_RETURN(auto manager, CheckpointManager::create(comm, m.state, c));
    for (int64_t step = 1; step <= 4; ++step)
      DISTCKPT_RETURN_IF_ERROR(manager->step_end(step, (step - 1) / 2 + 1).status());
    return manager->end(4, 2).status();
  }));
  auto listing = list_checkpoints(dir.path());
  ASSERT_TRUE(listing.ok());
  std::vector<std::string> names;
  for (const auto& e : listing->entries) {
    EXPECT_TRUE(e.per_rank_files) << e.name;
    names.push_back(e.name);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"net-2_1", "net-2_2"}));
  for (const auto& n : names) EXPECT_TRUE(fs::exists(dir.path() + "/" + n + "/rank_1/" + n + ".ckpt")) << n;
  EXPECT_FALSE(fs::exists(dir.path() + "/net-1_1"));  // retired whole, rank files included
}

TEST(MindSporePerRankSet, ManifestFileNamesStayInsideTheSet) {
  EXPECT_TRUE(internal_format::valid_data_file_name("rank_12/net-1_4.ckpt"));
  EXPECT_TRUE(internal_format::valid_data_file_name("data-00001.bin"));
  for (const char* bad : {"rank_1/../x", "rank_1/..", "rank_/a", "rank_1x/a", "rank_1/a/b", "/etc/passwd",
                          "../rank_1/a", "rank_123456789/a", "rank_1/", "x/a"})
    EXPECT_FALSE(internal_format::valid_data_file_name(bad)) << bad;
}

TEST(MindSporeCkpt, TensorOver512MiBIsSplitIntoRecordsAndJoinedOnRead) {
  TempDir dir;
  const Shape shape{516, 1 << 20};  // 516 MiB of uint8: two records of 258 rows
  expect_all_ok(run_ranks(2, [&](Comm& comm) -> Status {
    auto layout = TensorLayout::from_device_matrix(shape, {2}, {-1, 0});  // split on columns
    Box box = layout->slice_box(comm.rank());
    std::vector<uint8_t> part(static_cast<std::size_t>(box.num_elements()));
    for (int64_t r = 0; r < box.shape[0]; ++r)
      for (int64_t c = 0; c < box.shape[1]; c += 4096) part[static_cast<std::size_t>(r * box.shape[1] + c)] = static_cast<uint8_t>(r + c / 4096 + comm.rank());
    StateDict state(comm.rank());
    DISTCKPT_RETURN_IF_ERROR(state.add_tensor("huge", DType::kUInt8, part.data(), *layout));
    SaveOptions options;
    options.name = "big";
    options.format = Format::kCkpt;
    options.fsync = false;
    DISTCKPT_RETURN_IF_ERROR(save(comm, state, dir.path(), options).status());
    // Load with rows split instead of columns.
    auto rows = TensorLayout::from_device_matrix(shape, {2}, {0, -1});
    Box mine = rows->slice_box(comm.rank());
    std::vector<uint8_t> got(static_cast<std::size_t>(mine.num_elements()), 0xff);
    StateDict target(comm.rank());
    DISTCKPT_RETURN_IF_ERROR(target.add_tensor("huge", DType::kUInt8, got.data(), *rows));
    DISTCKPT_RETURN_IF_ERROR(load(comm, target, dir.path() + "/big.ckpt", {}).status());
    const int64_t half = shape[1] / 2;
    for (int64_t r = 0; r < mine.shape[0]; r += 37)
      for (int64_t c = 0; c < shape[1]; c += 4096) {
        const int64_t gr = mine.offset[0] + r, owner = c / half;
        const uint8_t want = static_cast<uint8_t>(gr + (c % half) / 4096 + owner);
        if (got[static_cast<std::size_t>(r * shape[1] + c)] != want) return internal_error("huge differs");
      }
    return Status();
  }));
  auto info = read_checkpoint_info(dir.path() + "/big.ckpt");
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  ASSERT_EQ(info->tensors[0].chunks.size(), 2u);
  EXPECT_EQ(info->tensors[0].chunks[0].box.shape[0], 258);
  EXPECT_EQ(info->tensors[0].chunks[1].box.offset[0], 258);
}

// A tiny hand-made .ckpt record: tag, dims, type, content.
std::string record(const std::string& tag, const std::vector<int64_t>& dims, const std::string& type,
                   const std::string& content) {
  Checkpoint ck;
  add_value(ck, tag, dims, type, content);
  return ck.SerializeAsString();
}

Status open_index(const std::string& path) { return internal_format::read_stored_index(*posix_filesystem(), path).status(); }

TEST(BadInput, MalformedCkptFilesGiveClearErrors) {
  TempDir dir;
  auto check = [&](const std::string& name, const std::string& bytes, const std::string& expect) {
    const std::string path = dir.path() + "/" + name + ".ckpt";
    write_ckpt(path, bytes, false);
    Status st = open_index(path);
    EXPECT_FALSE(st.ok()) << name;
    EXPECT_NE(st.message().find(expect), std::string::npos) << name << ": " << st.to_string();
  };
  check("short_content", record("w", {2, 2}, "Float32", std::string(12, 'x')), "need 16");
  check("long_content", record("w", {2, 2}, "Float32", std::string(20, 'x')), "holds 20 bytes");
  check("negative_dim", record("w", {-3, 2}, "Float32", std::string(24, 'x')), "negative or too large");
  check("overflow_dims", record("w", {int64_t{1} << 40, int64_t{1} << 40}, "Float32", ""), "overflow");
  check("unknown_type", record("w", {2}, "Complex128", std::string(32, 'x')), "unknown tensor_type");
  check("not_whole_elements", record("w", {3}, "Int32", std::string(10, 'x')), "need 12");
  std::string good = record("w", {64}, "Float32", std::string(256, 'x'));
  check("truncated", good.substr(0, good.size() - 10), "runs past");
  check("garbage", std::string("\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\x7f", 11), "varint");
  check("split_apart", record("a", {2}, "Int8", "xy") + record("b", {1}, "Int8", "y") + record("a", {2}, "Int8", "zw"),
        "two separate runs");
}

TEST(BadInput, MalformedSafetensorsFilesGiveClearErrors) {
  TempDir dir;
  auto check = [&](const std::string& name, const std::string& header, std::size_t data, const std::string& expect,
                   uint64_t claimed = 0) {
    const std::string path = dir.path() + "/" + name + ".safetensors";
    std::ofstream out(path, std::ios::binary);
    const uint64_t n = claimed ? claimed : header.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << header << std::string(data, '\0');
    out.close();
    Status st = open_index(path);
    EXPECT_FALSE(st.ok()) << name;
    EXPECT_NE(st.message().find(expect), std::string::npos) << name << ": " << st.to_string();
  };
  check("not_json", "{not json", 0, "not a JSON object");
  check("overlap", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12, "overlap");
  check("past_end", R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8, "run past");
  check("wrong_size", R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8, "needing 12");
  check("bad_dtype", R"({"a":{"dtype":"F128","shape":[1],"data_offsets":[0,16]}})", 16, "unknown dtype");
  check("negative_shape", R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}})", 0, "non-negative");
  check("huge_header", "{}", 0, "exceeds", uint64_t{1} << 40);
  check("deep", std::string(100000, '[') + std::string(100000, ']'), 0, "levels deep");
  // C overlaps A, with an empty tensor sorted between them.
  check("overlap_far", R"({"a":{"dtype":"U8","shape":[100],"data_offsets":[0,100]},"b":{"dtype":"U8","shape":[0],"data_offsets":[10,10]},"c":{"dtype":"U8","shape":[10],"data_offsets":[20,30]}})", 100, "overlap");
}

TEST(BadInput, DamagedHdf5AndMissingDatasets) {
  TempDir dir;
  SaveOptions options;
  options.name = "m";
  options.step = 12;
  options.epoch = 3;
  options.format = Format::kHdf5;
  ASSERT_TRUE(save_model(1, dir.path(), options).ok());
  const std::string path = dir.path() + "/m.h5";
  // A state dict asking for a tensor the file lacks: kMismatch when strict.
  auto res = run_ranks(1, [&](Comm& comm) -> Status {
    StateDict state(comm.rank());
    float x[2];
    DISTCKPT_RETURN_IF_ERROR(state.add_tensor("not_there", DType::kFloat32, x, *TensorLayout::from_device_matrix({2}, {1}, {-1})));
    return load(comm, state, path, {}).status();
  });
  EXPECT_NE(res[0].find("not_there"), std::string::npos) << res[0];
  // Truncated: refused as damaged.
  const std::string cut = dir.path() + "/cut.h5";
  fs::copy_file(path, cut);
  fs::resize_file(cut, fs::file_size(cut) / 2);
  Status st = open_index(cut);
  EXPECT_EQ(st.code(), StatusCode::kCorruption) << st.to_string();
}

// An HDF5 file of the model saved in `dir` by one rank: its path ("" if the save failed).
std::string saved_hdf5(const TempDir& dir) {
  SaveOptions options;
  options.name = "m";
  options.format = Format::kHdf5;
  return save_model(1, dir.path(), options).ok() ? dir.path() + "/m.h5" : "";
}

// libhdf5 reads .h5 files in a program of its own (distckpt-hdf5-reader), started by
// posix_spawn. A forked child read them before: with ranks as threads, it inherited an
// allocator lock another thread held and hung (CI, GCC 12's AddressSanitizer). Here
// threads describe files while others allocate and free large blocks.
TEST(Hdf5Reader, ThreadsReadFilesWhileOthersAllocate) {
  TempDir dir;
  const std::string path = saved_hdf5(dir);
  ASSERT_FALSE(path.empty());
  std::atomic<bool> done{false};
  std::vector<std::thread> allocators;
  for (int t = 0; t < 2; ++t)
    allocators.emplace_back([&done, t] {
      // Blocks of every size (small ones and mmap'ed ones), from call stacks of every
      // depth: AddressSanitizer records each new stack under a lock.
      std::size_t size = 64u << t;
      unsigned depth = 1;
      std::function<void(unsigned)> allocate_at = [&](unsigned d) {
        if (d > 0) return allocate_at(d - 1);
        std::vector<char> block(size, 1);
      };
      while (!done.load()) {
        allocate_at(depth);
        depth = depth % 64 + 1;
        size = size >= (8u << 20) ? 64 : size * 2;
      }
    });
  std::vector<std::string> errors(4);
  std::vector<std::thread> readers;
  for (int t = 0; t < 4; ++t) {
    const std::string copy = dir.path() + "/m" + std::to_string(t) + ".h5";
    fs::copy_file(path, copy);
    readers.emplace_back([&, t, copy] {
      for (int i = 0; i < 12 && errors[t].empty(); ++i) {
        // A new modification time: the file is read again, not answered from memory.
        fs::last_write_time(copy, fs::file_time_type::clock::now() + std::chrono::seconds(i + 1));
        Status st = open_index(copy);
        if (!st.ok()) errors[t] = st.to_string();
      }
    });
  }
  for (auto& r : readers) r.join();
  done = true;
  for (auto& a : allocators) a.join();
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

TEST(Hdf5Reader, AMissingOrForeignReaderIsAClearError) {
  TempDir dir;
  const std::string path = saved_hdf5(dir);
  ASSERT_FALSE(path.empty());
  struct RestoreEnv {
    std::optional<std::string> before;
    RestoreEnv() {
      if (const char* v = std::getenv("DISTCKPT_HDF5_READER")) before = v;
    }
    ~RestoreEnv() {
      if (before) ::setenv("DISTCKPT_HDF5_READER", before->c_str(), 1);
      else ::unsetenv("DISTCKPT_HDF5_READER");
    }
  } restore;
  // A file changed within the last second is read again each time (a write in the same
  // timestamp tick could go unseen): the answer is kept only after that. Its time is put
  // 3 s ahead so that "within the last second" holds however slowly the reader starts
  // (under a sanitizer on a busy machine, the save's commit and one reader start took
  // over a second, and the first answer was kept).
  fs::last_write_time(path, fs::file_time_type::clock::now() + std::chrono::seconds(3));
  ASSERT_TRUE(open_index(path).ok());
  ::setenv("DISTCKPT_HDF5_READER", (dir.path() + "/no-reader").c_str(), 1);
  EXPECT_EQ(open_index(path).code(), StatusCode::kNotFound);
  ::unsetenv("DISTCKPT_HDF5_READER");
  std::this_thread::sleep_for(std::chrono::milliseconds(4100));
  ASSERT_TRUE(open_index(path).ok());
  ::setenv("DISTCKPT_HDF5_READER", (dir.path() + "/no-reader").c_str(), 1);
  // The reader's answer for this version of the file is kept: no reader is started.
  Status st = open_index(path);
  EXPECT_TRUE(st.ok()) << st.to_string();
  // Changed since: read again, which needs the reader.
  fs::last_write_time(path, fs::last_write_time(path) + std::chrono::seconds(1));
  st = open_index(path);
  EXPECT_EQ(st.code(), StatusCode::kNotFound) << st.to_string();
  EXPECT_NE(st.message().find("DISTCKPT_HDF5_READER='" + dir.path() + "/no-reader'"), std::string::npos) << st.to_string();
  EXPECT_NE(st.message().find(path), std::string::npos) << st.to_string();
  // A program that answers nothing: the file is not called good.
  ::setenv("DISTCKPT_HDF5_READER", "/bin/false", 1);
  for (int attempt = 0; attempt < 2; ++attempt) {  // no answer is kept: each read starts it
    st = open_index(path);
    EXPECT_EQ(st.code(), StatusCode::kCorruption) << st.to_string();
    EXPECT_NE(st.message().find("/bin/false exited 1"), std::string::npos) << st.to_string();
  }
  // Programs that are not this build's reader: one that refuses the request (a reader of
  // another protocol), one that crashes, one that answers and writes to stderr after.
  auto script = [&](const std::string& name, const std::string& body) {
    const std::string file = dir.path() + "/" + name;
    std::ofstream(file) << "#!/bin/sh\n" << body << "\n";
    fs::permissions(file, fs::perms::owner_all);
    return file;
  };
  ::setenv("DISTCKPT_HDF5_READER", script("refuses", "echo 'speaks protocol 9' >&2; exit 2").c_str(), 1);
  st = open_index(path);
  EXPECT_EQ(st.code(), StatusCode::kInternal) << st.to_string();
  EXPECT_NE(st.message().find("refused the request (exit 2)"), std::string::npos) << st.to_string();
  ::setenv("DISTCKPT_HDF5_READER", script("crashes", "kill -SEGV $$").c_str(), 1);
  st = open_index(path);
  EXPECT_EQ(st.code(), StatusCode::kCorruption) << st.to_string();
  EXPECT_NE(st.message().find("crashed reading it (signal 11)"), std::string::npos) << st.to_string();
  // The real reader with no stderr: the answer still reaches the caller whole.
  const std::string real = DISTCKPT_TEST_HDF5_READER;  // this build's (tests/CMakeLists.txt)
  ::setenv("DISTCKPT_HDF5_READER", script("no-stderr", "exec 2>&-; exec '" + real + "' \"$@\"").c_str(), 1);
  fs::last_write_time(path, fs::last_write_time(path) + std::chrono::seconds(1));
  st = open_index(path);
  EXPECT_TRUE(st.ok()) << st.to_string();
  ::unsetenv("DISTCKPT_HDF5_READER");
  EXPECT_TRUE(open_index(path).ok());
}

TEST(Listing, SingleFilesAreCheckpointsAndResolveFollowsCommits) {
  TempDir dir;
  SaveOptions options;
  options.step = 12;
  options.epoch = 3;
  options.name = "a";
  ASSERT_TRUE(save_model(2, dir.path(), options).ok());
  options.name = "b";
  options.format = Format::kCkpt;
  ASSERT_TRUE(save_model(2, dir.path(), options).ok());
  options.name = "c";
  options.format = Format::kSafetensors;
  ASSERT_TRUE(save_model(2, dir.path(), options).ok());
  auto listing = list_checkpoints(dir.path());
  ASSERT_TRUE(listing.ok());
  ASSERT_EQ(listing->entries.size(), 3u);
  EXPECT_EQ(listing->latest, "c.safetensors");
  std::set<std::string> formats;
  for (const auto& e : listing->entries) {
    EXPECT_EQ(e.state, EntryState::kCommitted) << e.name << e.detail;
    formats.insert(std::string(format_name(e.format)));
  }
  EXPECT_EQ(formats, (std::set<std::string>{"native", "ckpt", "safetensors"}));
  auto newest = resolve_checkpoint(dir.path());
  ASSERT_TRUE(newest.ok());
  EXPECT_EQ(*newest, dir.path() + "/c.safetensors");
  // The same name again is refused, whatever the format.
  EXPECT_EQ(save_model(2, dir.path(), options).message().find("already exists") != std::string::npos, true);
}

TEST(Convert, EveryFormatToEveryFormatKeepsTensorsAndInfo) {
  const Format all[] = {Format::kNative, Format::kCkpt, Format::kSafetensors, Format::kHdf5};
  for (Format from : all) {
    TempDir dir;
    SaveOptions options;
    options.name = "src";
    options.step = 12;
    options.epoch = 3;
    options.format = from;
    ASSERT_TRUE(save_model(from == Format::kHdf5 ? 1 : 3, dir.path(), options).ok());
    const std::string src = dir.path() + "/src" + std::string(internal_format::driver(from).extension);
    for (Format to : all) {
      ConvertOptions co;
      co.region_bytes = 50;  // many regions per tensor
      uint64_t calls = 0, last = 0, total = 0;
      co.progress = [&](uint64_t done, uint64_t t, const std::string&) {
        ++calls;
        EXPECT_GE(done, last);
        last = done;
        total = t;
      };
      auto r = convert_checkpoint(src, dir.path() + "/out/" + std::string(format_name(to)), to, co);
      ASSERT_TRUE(r.ok()) << format_name(from) << " -> " << format_name(to) << ": " << r.status().to_string();
      EXPECT_GT(calls, 16u);
      EXPECT_EQ(last, total);
      auto verified = verify_checkpoint(r->path);
      ASSERT_TRUE(verified.ok()) << r->path << ": " << verified.status().to_string();
      load_and_compare(2, r->path);
      // Never over an existing checkpoint.
      EXPECT_EQ(convert_checkpoint(src, r->path, to).status().code(), StatusCode::kAlreadyExists);
    }
  }
}

// convert --only/--exclude/--rename: the load's selection (filters on stored names,
// then renames), plain and encrypted (the copy's chunks are sealed under the new names).
TEST(Convert, OnlyExcludeAndRenameSelectAsALoadDoes) {
  auto key = std::make_shared<const EncryptionKey>(*EncryptionKey::from_bytes(std::string(32, 'k')));
  for (const bool encrypted : {false, true}) {
    SCOPED_TRACE(encrypted);
    TempDir dir;
    SaveOptions options;
    options.name = "src";
    if (encrypted) options.encryption = {EncryptionMode::kAesGcm, key};
    ASSERT_TRUE(save_model(2, dir.path(), options).ok());
    ConvertOptions co;
    co.key = encrypted ? key : nullptr;
    if (encrypted) co.encryption = {EncryptionMode::kAesGcm, key};
    co.exclude = {"layer", "empty"};
    co.rename = {{"bias", "model.bias"}, {"scale", "model.scale"}};
    const Format to = encrypted ? Format::kNative : Format::kSafetensors;
    auto r = convert_checkpoint(dir.path() + "/src", dir.path() + "/out", to, co);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    LoadOptions lo;
    lo.key = encrypted ? key : nullptr;
    auto copy = load_all(r->path, lo);
    ASSERT_TRUE(copy.ok()) << copy.status().to_string();
    std::vector<std::string> names;
    for (const TensorEntry& e : copy->state.tensors()) names.push_back(e.name);
    EXPECT_EQ(names, (std::vector<std::string>{"irregular", "model.bias", "model.scale"}));
    for (const auto& [stored, renamed] : std::map<std::string, std::string>{{"bias", "model.bias"}, {"irregular", "irregular"}}) {
      const TensorEntry& e = copy->state.tensors()[static_cast<std::size_t>(copy->state.find(renamed))];
      const std::vector<unsigned char> expected = testing::full_tensor(stored);
      EXPECT_TRUE(expected.empty() || std::memcmp(e.buffers[0], expected.data(), expected.size()) == 0) << renamed;
    }
    auto refused = [&](const ConvertOptions& bad, const std::string& expect) {
      ConvertOptions o = bad;
      o.key = co.key;
      auto st = convert_checkpoint(dir.path() + "/src", dir.path() + "/bad", Format::kNative, o).status();
      EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
      EXPECT_NE(st.message().find(expect), std::string::npos) << st.to_string();
    };
    ConvertOptions bad;
    bad.rename = {{"nope", "x"}};
    refused(bad, "names no tensor");
    bad.rename = {{"bias", "scale"}};
    refused(bad, "'scale'");
    bad.rename.clear();
    bad.only = {"layer"};
    bad.exclude = {"layer0"};
    refused(bad, "overlap");
    EXPECT_FALSE(std::filesystem::exists(dir.path() + "/bad"));
  }
}

TEST(Formats, RanksDisagreeingOnOptionsFailAlike) {
  TempDir dir;
  auto res = run_ranks(3, [&](Comm& comm) -> Status {
    FormatModel m(comm.rank(), 3);
    SaveOptions options;
    options.name = "m";
    options.format = Format::kCkpt;
    options.gather_bytes = comm.rank() == 1 ? 1024 : 64;  // only one rank changed it
    Status a = save(comm, m.state, dir.path(), options).status();
    options.gather_bytes = 64;
    options.format = comm.rank() == 2 ? Format::kNative : Format::kCkpt;
    Status b = save(comm, m.state, dir.path(), options).status();
    if (a.code() != StatusCode::kInvalidArgument || b.code() != StatusCode::kInvalidArgument)
      return internal_error(a.to_string() + " | " + b.to_string());
    return Status();
  });
  expect_all_ok(res);
  EXPECT_TRUE(fs::is_empty(dir.path()));
}

TEST(Atomicity, FailedFsyncLeavesNothingVisible) {
  for (Format format : {Format::kCkpt, Format::kSafetensors}) {
    TempDir dir;
    internal_storage::FaultSpec spec;
    spec.fail_sync_if_contains = ".tmp-";
    auto faulty = std::make_shared<internal_storage::FaultFileSystem>(posix_filesystem(), spec);
    SaveOptions options;
    options.name = "m";
    options.format = format;
    options.fs = faulty;
    Status st = save_model(3, dir.path(), options);
    EXPECT_NE(st.message().find("Input/output error"), std::string::npos) << st.to_string();
    std::size_t entries = 0;
    for (const auto& e : fs::directory_iterator(dir.path())) {
      if (e.path().filename() == ".distckpt") continue;  // the catalog's claims, never listed
      ++entries;
      ADD_FAILURE() << "left behind: " << e.path();
    }
    EXPECT_EQ(entries, 0u);
  }
}

}  // namespace
}  // namespace distckpt
