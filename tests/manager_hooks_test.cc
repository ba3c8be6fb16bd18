// The manager's hooks for a layer above the state dict (CheckpointConfig::before_save,
// ResumeOptions::load), its metrics in stats.jsonl whatever the policies, and the index
// version of a checkpoint that holds a distckpt.torch state tree. 1-2 in-process ranks.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "distckpt/inspect.h"
#include "distckpt/manager.h"
#include "format/native/index_codec.h"
#include "format_model.h"
#include "local_ranks.h"
#include "test_util.h"

namespace distckpt {
namespace {

using testing::expect_all_ok;
using testing::FormatModel;
using testing::run_ranks;
using testing::TempDir;
namespace fs = std::filesystem;

CheckpointConfig config_in(const std::string& dir) {
  CheckpointConfig c;
  c.directory = dir;
  c.prefix = "run";
  c.save_every_steps = 2;
  c.keep_max = 0;
  return c;
}

std::vector<nlohmann::json> stats_lines(const std::string& dir) {
  std::vector<nlohmann::json> out;
  std::ifstream in(dir + "/stats.jsonl");
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

// before_save runs on every rank before each save, never at steps that do not save, and
// what it puts in the state dict is what the save holds.
TEST(ManagerHooks, BeforeSaveRefreshesTheStateAtEachSaveOnly) {
  TempDir dir;
  expect_all_ok(run_ranks(2, [&](Comm& comm) -> Status {
    FormatModel model(comm.rank(), 2);
    CheckpointConfig c = config_in(dir.path());
    int calls = 0;
    c.before_save = [&](const std::vector<std::string>&) -> Status {
      ++calls;
      return model.state.set_info("walked", int64_t{calls});
    };
    DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, c));
    for (int s = 1; s <= 4; ++s) DISTCKPT_RETURN_IF_ERROR(m->step_end(s, 0, {{"loss", 1.0 / s}}).status());
    if (calls != 2) return internal_error("before_save ran " + std::to_string(calls) + " times for 2 saves");
    DISTCKPT_ASSIGN_OR_RETURN(CheckpointInfo info, read_checkpoint_info(dir.path() + "/run-0_4"));
    if (std::get<int64_t>(info.info.at("walked")) != 2) return internal_error("the save missed the refresh");
    return Status();
  }));
  // Every step's metrics, and each save's line with its step's.
  int metrics = 0, saves = 0;
  for (const auto& line : stats_lines(dir.path())) {
    if (line.value("event", "") == "metrics") {
      EXPECT_EQ(line["step"].get<int>(), ++metrics);
      EXPECT_DOUBLE_EQ(line["metrics"]["loss"].get<double>(), 1.0 / metrics);
    } else if (!line.contains("event")) {
      ++saves;
      EXPECT_DOUBLE_EQ(line["metrics"]["loss"].get<double>(), 1.0 / line["step"].get<int>());
    }
  }
  EXPECT_EQ(metrics, 4);
  EXPECT_EQ(saves, 2);
}

// A before_save that fails on one rank fails that save on every rank, as a failed write.
TEST(ManagerHooks, BeforeSaveFailingOnOneRankFailsTheSaveEverywhere) {
  TempDir dir;
  auto statuses = run_ranks(2, [&](Comm& comm) -> Status {
    FormatModel model(comm.rank(), 2);
    CheckpointConfig c = config_in(dir.path());
    c.before_save = [&](const std::vector<std::string>&) -> Status {
      return comm.rank() == 1 ? invalid_argument("the walk found a callable") : Status();
    };
    DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, c));
    return m->step_end(2, 0).status();
  });
  for (const auto& s : statuses) {
    EXPECT_NE(s.find("before_save"), std::string::npos) << s;
    EXPECT_NE(s.find("the walk found a callable"), std::string::npos) << s;
  }
  EXPECT_FALSE(fs::exists(dir.path() + "/run-0_2"));
}

// ResumeOptions::load replaces the state dict's load: resume chooses and verifies, the hook
// loads, and the manager adopts what it returns.
TEST(ManagerHooks, ResumeLoadsThroughTheHook) {
  TempDir dir;
  expect_all_ok(run_ranks(2, [&](Comm& comm) -> Status {
    FormatModel model(comm.rank(), 2);
    DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, config_in(dir.path())));
    for (int s = 1; s <= 4; ++s) DISTCKPT_RETURN_IF_ERROR(m->step_end(s, 0).status());
    return Status();
  }));
  expect_all_ok(run_ranks(2, [&](Comm& comm) -> Status {
    FormatModel model(comm.rank(), 2);
    DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, config_in(dir.path())));
    ResumeOptions o;
    std::string seen;
    o.load = [&](const std::string& path, const LoadOptions& lo) -> Result<LoadResult> {
      seen = path;
      return load(comm, model.state, path, lo);
    };
    DISTCKPT_ASSIGN_OR_RETURN(ResumeResult r, m->resume(o));
    if (!r.resumed || r.step != 4 || seen != dir.path() + "/run-0_4") return internal_error("resumed " + seen);
    // The next save continues the series it resumed.
    DISTCKPT_ASSIGN_OR_RETURN(StepOutcome out, m->step_end(6, 0));
    return out.path == dir.path() + "/run-0_6" ? Status() : internal_error("saved " + out.path);
  }));
}

TEST(ManagerHooks, ResumeThroughAHookIsRefusedWithALocalTier) {
  TempDir dir, local;
  expect_all_ok(run_ranks(1, [&](Comm& comm) -> Status {
    FormatModel model(comm.rank(), 1);
    CheckpointConfig c = config_in(dir.path());
    c.local.dir = local.path();
    c.local_every_steps = 1;
    DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, c));
    ResumeOptions o;
    o.load = [&](const std::string&, const LoadOptions&) -> Result<LoadResult> { return LoadResult{}; };
    const Status st = m->resume(o).status();
    return st.code() == StatusCode::kUnsupported ? Status() : internal_error("with a local tier: " + st.to_string());
  }));
}

// An index that holds a distckpt.torch state tree is framed as version 4, so that a build
// that would drop the tree's values refuses it; one without stays version 1.
TEST(ManagerHooks, AStateTreeRaisesTheIndexVersion) {
  TempDir dir;
  expect_all_ok(run_ranks(1, [&](Comm& comm) -> Status {
    FormatModel model(comm.rank(), 1);
    SaveOptions o;
    o.name = "plain";
    DISTCKPT_RETURN_IF_ERROR(save(comm, model.state, dir.path(), o).status());
    DISTCKPT_RETURN_IF_ERROR(model.state.set_info(std::string(internal_format::kStateTreeInfoKey), "{\"version\": 2}"));
    o.name = "tree";
    return save(comm, model.state, dir.path(), o).status();
  }));
  auto version_of = [&](const std::string& name) {
    std::ifstream in(dir.path() + "/" + name + "/index.pb", std::ios::binary);
    char frame[12] = {};
    in.read(frame, sizeof(frame));
    uint32_t v = 0;
    std::memcpy(&v, frame + 8, 4);
    return v;
  };
  EXPECT_EQ(version_of("plain"), 1u);
  EXPECT_EQ(version_of("tree"), 4u);
  auto info = read_checkpoint_info(dir.path() + "/tree");
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  EXPECT_EQ(info->format_version, 4u);
}

}  // namespace
}  // namespace distckpt
