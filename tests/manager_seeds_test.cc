// The manager's seed behaviours that need more than a config check: MMEngine's regular
// save at a new best, Caffe2's metadata handler (write, last_epoch, cp_accessible,
// report, set_params) and resume's load filters and renames (MindSpore's
// load_checkpoint arguments). 1-2 in-process ranks.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "distckpt/inspect.h"
#include "distckpt/manager.h"
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

std::set<std::string> names_in(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n != "latest" && n != "stats.jsonl" && n != ".distckpt") out.insert(n);
  }
  return out;
}

// MMEngine's preset by iterations (the audit's V9 hook): interval 2, save_best "acc".
CheckpointConfig mmengine_by_iter(const std::string& dir, int keep_max) {
  CheckpointConfig c = CheckpointConfig::mmengine();
  c.directory = dir;
  c.by_epoch = false;
  c.filename_tmpl = "iter_{}.pth";
  c.save_every_steps = 2;
  c.keep_max = keep_max;
  c.save_best = {"acc"};
  return c;
}

// The audit's run (V9): interval 2, save_best "acc", acc improving at iterations 1, 2, 3,
// 4, 6 and 7. MMEngine saves a regular checkpoint at a new best once one exists (not at 1,
// before the first), never a second one of a step that has one (2, 4, 6).
TEST(SeedManager, MMEngineSavesARegularCheckpointAtEachNewBest) {
  const std::map<int64_t, double> acc{{1, 0.1}, {2, 0.2}, {3, 0.3}, {4, 0.4}, {5, 0.35}, {6, 0.5}, {7, 0.6}};
  for (bool regular_at_best : {true, false}) {
    TempDir dir;
    expect_all_ok(run_ranks(2, [&](Comm& comm) -> Status {
      FormatModel model(comm.rank(), 2);
      CheckpointConfig c = mmengine_by_iter(dir.path(), 0);
      c.regular_at_best = regular_at_best;
      DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, c));
      for (int64_t step = 1; step <= 8; ++step) {
        std::map<std::string, double> metrics;
        if (acc.count(step)) metrics["acc"] = acc.at(step);
        DISTCKPT_ASSIGN_OR_RETURN(StepOutcome out, m->step_end(step, 0, metrics));
        // A repeated call for the step saves nothing more.
        DISTCKPT_ASSIGN_OR_RETURN(StepOutcome again, m->step_end(step, 0, metrics));
        if (again.saved) return internal_error("step " + std::to_string(step) + " saved twice");
        const bool regular = step % 2 == 0 || (regular_at_best && step != 1 && step != 5 && acc.count(step));
        if (out.saved != regular) return internal_error("step " + std::to_string(step) + ": saved " + std::to_string(out.saved));
      }
      return m->end(8, 0).status();
    }));
    const std::set<std::string> want =
        regular_at_best ? std::set<std::string>{"iter_2", "iter_3", "iter_4", "iter_6", "iter_7",
                                                "iter_8", "best_acc_iter_7"}
                        : std::set<std::string>{"iter_2", "iter_4", "iter_6", "iter_8",
                                                "best_acc_iter_7"};
    EXPECT_EQ(names_in(dir.path()), want) << "regular_at_best " << regular_at_best;
  }
  // (Native directories: the template's ".pth" is not part of a directory's name.)
  // The regular saves at a best count for keep_max, as MMEngine's keep_ckpt_ids.
  TempDir dir;
  expect_all_ok(run_ranks(1, [&](Comm& comm) -> Status {
    FormatModel model(comm.rank(), 1);
    DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, mmengine_by_iter(dir.path(), 2)));
    for (int64_t step = 1; step <= 7; ++step) {
      std::map<std::string, double> metrics;
      if (acc.count(step)) metrics["acc"] = acc.at(step);
      DISTCKPT_RETURN_IF_ERROR(m->step_end(step, 0, metrics).status());
    }
    return Status();
  }));
  EXPECT_EQ(names_in(dir.path()), (std::set<std::string>{"iter_6", "iter_7", "best_acc_iter_7"}));
  // After a restart, MMEngine's last_ckpt is None until the run saves a regular
  // checkpoint: a new best at 9 saves none; one at 11, after the periodic 10, does.
  expect_all_ok(run_ranks(1, [&](Comm& comm) -> Status {
    FormatModel model(comm.rank(), 1);
    DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, mmengine_by_iter(dir.path(), 0)));
    DISTCKPT_ASSIGN_OR_RETURN(ResumeResult r, m->resume());
    if (r.step != 7) return internal_error("resumed " + std::to_string(r.step));
    DISTCKPT_ASSIGN_OR_RETURN(StepOutcome at9, m->step_end(9, 0, {{"acc", 0.7}}));
    DISTCKPT_RETURN_IF_ERROR(m->step_end(10, 0).status());
    DISTCKPT_ASSIGN_OR_RETURN(StepOutcome at11, m->step_end(11, 0, {{"acc", 0.8}}));
    if (at9.saved || !at11.saved) return internal_error("regular saves at a best after a restart");
    return Status();
  }));
  EXPECT_EQ(names_in(dir.path()), (std::set<std::string>{"iter_6", "iter_7", "iter_10", "iter_11", "best_acc_iter_11"}));
}

// A handler that records every call, answers as the test sets, and can throw.
struct RecordingHandler : MetadataHandler {
  std::mutex mu;
  std::vector<std::string> calls;
  Params params;
  bool accessible = true;
  bool throw_in_write = false;
  std::optional<int64_t> resume_epoch = -1;
  void set_params(const Params& p) override {
    std::lock_guard<std::mutex> lock(mu);
    params = p;
    calls.push_back("set_params");
  }
  Status write(int64_t epoch, int64_t step, const std::string& path) override {
    std::lock_guard<std::mutex> lock(mu);
    calls.push_back("write " + std::to_string(epoch) + " " + std::to_string(step) + " " + fs::path(path).filename().string());
    if (throw_in_write) throw std::runtime_error("the job database is down");
    return Status();
  }
  Result<std::optional<int64_t>> last_epoch(int64_t user_epoch) override {
    std::lock_guard<std::mutex> lock(mu);
    calls.push_back("last_epoch " + std::to_string(user_epoch));
    return resume_epoch;
  }
  bool cp_accessible() override {
    std::lock_guard<std::mutex> lock(mu);
    calls.push_back("cp_accessible");
    return accessible;
  }
  void report(const std::string& action, const std::string& path, double seconds) override {
    std::lock_guard<std::mutex> lock(mu);
    calls.push_back("report " + action + " " + fs::path(path).filename().string() + (seconds >= 0 ? "" : " negative"));
  }
};

TEST(SeedManager, Caffe2MetadataHandlerIsCalledAsJobRunnerCallsIt) {
  TempDir dir;
  auto handler = std::make_shared<RecordingHandler>();
  auto config = [&](Comm& comm) {
    CheckpointConfig c;
    c.directory = dir.path();
    c.prefix = "job";
    c.save_every_epochs = 1;
    c.save_every_steps = 15;  // also mid-epoch saves (at step 15), which Caffe2 never writes
    c.keep_max = 0;
    c.save_last = false;
    c.save_at_start = true;
    c.on_failure = OnSaveFailure::kContinue;
    if (comm.rank() == 0) c.metadata_handler = handler;  // rank 0's is the one used
    return c;
  };
  // A first run: set_params, no checkpoint known (a fresh start: the epoch-0 save), then
  // an epoch whose save the handler finds inaccessible (skipped, training goes on), and a
  // write whose handler throws (a warning: the checkpoint stays).
  expect_all_ok(run_ranks(2, [&](Comm& comm) -> Status {
    FormatModel model(comm.rank(), 2);
    if (comm.rank() == 0) handler->resume_epoch = std::nullopt;
    DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, config(comm)));
    DISTCKPT_ASSIGN_OR_RETURN(ResumeResult r, m->resume());
    if (r.resumed || r.saved_at_start.empty()) return internal_error("not a fresh start with its epoch-0 save");
    for (int64_t epoch = 1; epoch <= 3; ++epoch) {
      if (epoch == 2) DISTCKPT_RETURN_IF_ERROR(m->step_end(15, 1, {}, false).status());  // mid-epoch
      if (comm.rank() == 0) handler->accessible = epoch != 2;
      if (comm.rank() == 0) handler->throw_in_write = epoch == 3;
      DISTCKPT_ASSIGN_OR_RETURN(StepOutcome out, m->step_end(epoch * 10, epoch, {}, true));
      if (out.saved != (epoch != 2)) return internal_error("epoch " + std::to_string(epoch) + " saved " + std::to_string(out.saved));
      if ((epoch == 2) != !out.skipped.empty()) return internal_error("skipped: '" + out.skipped + "'");
    }
    return Status();
  }));
  EXPECT_EQ(names_in(dir.path()), (std::set<std::string>{"job-0_0", "job-1_10", "job-1_15", "job-3_30"}));
  EXPECT_EQ(handler->params.prefix, "job");
  EXPECT_EQ(handler->params.directory, dir.path());
  EXPECT_EQ(handler->params.hosts.size(), 1u);  // each node once
  // The mid-epoch save is reported, never written; a write that throws is not reported.
  EXPECT_EQ(handler->calls, (std::vector<std::string>{
      "set_params", "last_epoch -1", "cp_accessible", "write 0 0 job-0_0", "report checkpoint_save job-0_0",
      "cp_accessible", "write 1 10 job-1_10", "report checkpoint_save job-1_10", "cp_accessible",
      "report checkpoint_save job-1_15", "cp_accessible", "cp_accessible", "write 3 30 job-3_30"}));
  // The handler chooses the epoch to resume from (Caffe2's get_resume_from_epoch_id); a
  // user epoch is passed to it; a named step bypasses it.
  for (int64_t choice : {1, -1}) {
    handler->calls.clear();
    handler->resume_epoch = choice;
    expect_all_ok(run_ranks(2, [&](Comm& comm) -> Status {
      FormatModel model(comm.rank(), 2);
      DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, config(comm)));
      DISTCKPT_ASSIGN_OR_RETURN(ResumeResult r, m->resume({.epoch = 3}));
      const int64_t want = choice == 1 ? 10 : 30;
      if (!r.resumed || r.step != want) return internal_error("resumed step " + std::to_string(r.step));
      DISTCKPT_ASSIGN_OR_RETURN(ResumeResult by_step, m->resume({.step = 10}));
      if (by_step.step != 10) return internal_error("by step: " + std::to_string(by_step.step));
      return Status();
    }));
    // set_params again once resume adopts the series it resumes ("job", not the new run's "job_1").
    EXPECT_EQ(handler->params.prefix, "job");
    EXPECT_EQ(handler->calls, (std::vector<std::string>{"set_params", "last_epoch 3", "set_params",
                                                         std::string("report checkpoint_load job-") +
                                                             (choice == 1 ? "1_10" : "3_30"),
                                                         "report checkpoint_load job-1_10"}));
  }
  // An epoch no checkpoint ended: resume fails on every rank, naming the epochs there are.
  handler->resume_epoch = 2;
  expect_all_ok(run_ranks(2, [&](Comm& comm) -> Status {
    FormatModel model(comm.rank(), 2);
    DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, config(comm)));
    auto r = m->resume();
    if (r.status().code() != StatusCode::kNotFound) return internal_error("resume: " + r.status().to_string());
    return Status();
  }));
}

// resume() reads with the call's prefixes, choice_func and renames, as load does.
TEST(SeedManager, ResumeTakesLoadFiltersAndRenames) {
  TempDir dir;
  std::vector<float> a(4, 1.5f), b(4, 2.5f), c(4, 3.5f);
  auto layout = *TensorLayout::from_device_matrix({4}, {1}, {-1});
  expect_all_ok(run_ranks(1, [&](Comm& comm) -> Status {
    StateDict state(0);
    DISTCKPT_RETURN_IF_ERROR(state.add_tensor("net.a", DType::kFloat32, a.data(), layout));
    DISTCKPT_RETURN_IF_ERROR(state.add_tensor("net.b", DType::kFloat32, b.data(), layout));
    DISTCKPT_RETURN_IF_ERROR(state.add_tensor("opt.c", DType::kFloat32, c.data(), layout));
    CheckpointConfig cfg;
    cfg.directory = dir.path();
    DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, state, cfg));
    return m->end(1, 0).status();
  }));
  expect_all_ok(run_ranks(1, [&](Comm& comm) -> Status {
    std::vector<float> a2(4, 0), b2(4, 0);
    StateDict state(0);
    DISTCKPT_RETURN_IF_ERROR(state.add_tensor("a", DType::kFloat32, a2.data(), layout));
    DISTCKPT_RETURN_IF_ERROR(state.add_tensor("b", DType::kFloat32, b2.data(), layout));
    CheckpointConfig cfg;
    cfg.directory = dir.path();
    DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, state, cfg));
    // Without filters the optimizer's tensor has no place: refused.
    if (m->resume({.strict = true}).ok()) return internal_error("resume without filters loaded");
    ResumeOptions o;
    o.specify_prefix = {"net."};
    o.choice_func = [](const std::string& stored) { return stored != "net.b"; };
    o.rename_func = [](const std::string& stored) { return stored.substr(4); };
    o.strict = false;
    DISTCKPT_ASSIGN_OR_RETURN(ResumeResult r, m->resume(o));
    if (a2 != a || b2 != std::vector<float>(4, 0)) return internal_error("loaded the wrong tensors");
    if (r.missing_in_checkpoint != std::vector<std::string>{"b"}) return internal_error("missing: b");
    o.choice_func = nullptr;
    o.rename_func = nullptr;
    o.rename = {{"net.a", "a"}, {"net.b", "b"}};
    o.strict = true;
    DISTCKPT_ASSIGN_OR_RETURN(r, m->resume(o));
    if (b2 != b) return internal_error("rename: b not loaded");
    return Status();
  }));
}

}  // namespace
}  // namespace distckpt
