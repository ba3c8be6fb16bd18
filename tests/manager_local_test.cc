// CheckpointManager and its policies with 1-3 in-process ranks: config validation,
// rule inference, retention (keep-max, per-minutes, best-K with ties and NaN), saving
// by steps and by time with ranks agreeing, prefix collisions and restarts, resume
// with and without fallback, a crash between commit and retention, signals, failed
// saves that stop or continue, statistics.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <regex>
#include <stdexcept>
#include <thread>

#include "comm/local_comm.h"
#include "distckpt/convert.h"
#include "distckpt/inspect.h"
#include "distckpt/manager.h"
#include "format_model.h"
#include "manager/retention.h"
#include "storage/fault_fs.h"
#include "storage/file_sha256.h"
#include "local_ranks.h"
#include "test_util.h"

namespace distckpt {
namespace {

using internal_manager::retention_deletes;
using internal_manager::RetentionPolicy;
using internal_manager::SeriesEntry;
using testing::FormatModel;
using testing::TempDir;
namespace fs = std::filesystem;

using testing::expect_all_ok;
using testing::run_ranks;

std::set<std::string> names_in(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n != "latest" && n != "stats.jsonl" && n != ".distckpt") out.insert(n);  // .distckpt: the catalog's claims
  }
  return out;
}

CheckpointConfig base_config(const std::string& dir) {
  CheckpointConfig c;
  c.directory = dir;
  c.prefix = "run";
  return c;
}

TEST(Config, ContradictoryAndOutOfRangeOptionsAreRefusedByName) {
  auto check = [](const std::function<void(CheckpointConfig&)>& edit, const std::string& expect) {
    CheckpointConfig c = base_config("/tmp/x");
    edit(c);
    Status st = c.validate();
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << expect;
    EXPECT_NE(st.message().find(expect), std::string::npos) << st.to_string();
  };
  check([](auto& c) { c.directory = ""; }, "directory");
  check([](auto& c) { c.save_every_steps = -1; }, "save_every_steps");
  check([](auto& c) { c.save_every_seconds = std::nan(""); }, "save_every_seconds");
  check([](auto& c) { c.save_every_steps = 0; c.save_last = false; }, "nothing would ever be saved");
  check([](auto& c) { c.keep_max = -2; }, "keep_max");
  check([](auto& c) { c.keep_per_n_minutes = -1; }, "keep_per_n_minutes");
  check([](auto& c) { c.prefix = "a/b"; }, "prefix");
  check([](auto& c) { c.name_template = "{prefix}-fixed"; }, "name_template");
  check([](auto& c) { c.best_metric = "throughput"; }, "cannot tell");
  check([](auto& c) { c.rule = CompareRule::kLess; }, "best_metric is empty");
  check([](auto& c) { c.best_metric = "loss"; c.keep_best = 0; }, "keep_best");
  check([](auto& c) { c.append_info["step_num"] = int64_t{1}; }, "step_num");
  check([](auto& c) { c.save_prefixes = {""}; }, "save_prefixes");
  check([](auto& c) { c.exception_save_timeout_s = 0; }, "exception_save_timeout_s");
  check([](auto& c) { c.publish_at_end = true; c.publish_format = Format::kNative; }, "publish_format");
  check([](auto& c) { c.publish_only = {""}; }, "publish_only");
  CheckpointConfig ok = base_config("/tmp/x");
  ok.save_every_steps = 10;
  ok.save_every_seconds = 60;  // both: steps win (MindSpore), not an error
  EXPECT_TRUE(ok.validate().ok());
}

TEST(Config, RuleIsInferredFromTheMetricNameAsMMEngineDoes) {
  auto rule = [](const std::string& m) {
    CheckpointConfig c = base_config("/tmp/x");
    c.best_metric = m;
    return c.effective_rule();
  };
  EXPECT_EQ(*rule("acc"), CompareRule::kGreater);
  EXPECT_EQ(*rule("val/mAP"), CompareRule::kGreater);
  EXPECT_EQ(*rule("top1"), CompareRule::kGreater);
  EXPECT_EQ(*rule("loss"), CompareRule::kLess);
  EXPECT_EQ(*rule("val_loss"), CompareRule::kLess);
  EXPECT_FALSE(rule("perplexity").ok());
}

TEST(Retention, KeepMaxPerMinutesBestKTiesAndNaN) {
  std::vector<SeriesEntry> e;
  for (int i = 1; i <= 6; ++i) e.push_back({"c" + std::to_string(i), static_cast<uint64_t>(i), i * 60'000, std::nullopt});
  EXPECT_EQ(retention_deletes(e, {3, 0, 0, CompareRule::kLess}), (std::vector<std::string>{"c1", "c2", "c3"}));
  EXPECT_TRUE(retention_deletes(e, {0, 0, 0, CompareRule::kLess}).empty());  // keep all
  // MindSpore's rules: keep_max set, per-minutes ignored (keep_per_n_minutes: the replay below).
  EXPECT_EQ(retention_deletes(e, {1, 2, 0, CompareRule::kLess}), (std::vector<std::string>{"c1", "c2", "c3", "c4", "c5"}));
  // Best 2 by loss: c2 (0.1) and the newer of the two 0.3 (c5); NaN never counts.
  e[1].metric = 0.1;
  e[2].metric = 0.3;
  e[4].metric = 0.3;
  e[3].metric = std::nan("");
  e[0].metric = 0.9;
  EXPECT_EQ(retention_deletes(e, {1, 0, 2, CompareRule::kLess}), (std::vector<std::string>{"c1", "c3", "c4"}));
  EXPECT_EQ(retention_deletes(e, {1, 0, 1, CompareRule::kGreater}), (std::vector<std::string>{"c2", "c3", "c4", "c5"}));
  // The newest is never deleted, whatever the rules say.
  std::vector<SeriesEntry> one{{"only", 7, 0, std::nullopt}};
  EXPECT_TRUE(retention_deletes(one, {1, 0, 0, CompareRule::kLess}).empty());
}

// The presets hold each seed's defaults, and what they hold is a valid config.
TEST(Config, PresetsHoldTheSeedsDefaults) {
  const CheckpointConfig ms = CheckpointConfig::mindspore(/*steps_per_epoch=*/100);
  EXPECT_EQ(ms.save_every_steps, 1);
  EXPECT_EQ(ms.keep_max, 5);
  EXPECT_EQ(ms.prefix, "CKP");
  EXPECT_EQ(ms.name_template, "{prefix}-{epoch}_{step_in_epoch}");
  EXPECT_EQ(ms.format, Format::kCkpt);
  EXPECT_EQ(ms.integrated, std::optional<bool>(true));
  EXPECT_FALSE(ms.ckpt_crc_footer);
  EXPECT_FALSE(ms.remove_redundancy);
  CheckpointConfig with_dir = ms;
  with_dir.directory = "/tmp/x";
  EXPECT_TRUE(with_dir.validate().ok()) << with_dir.validate().to_string();
  EXPECT_EQ(CheckpointConfig::mindspore().name_template, "{prefix}-{epoch}_{step}");
  CheckpointConfig mm = CheckpointConfig::mmengine();
  EXPECT_EQ(mm.save_every_steps, 0);
  EXPECT_TRUE(mm.by_epoch);
  EXPECT_EQ(mm.keep_max, 0);
  EXPECT_TRUE(mm.save_last);
  EXPECT_EQ(mm.filename_tmpl, "epoch_{}.pth");
  mm.directory = "/tmp/x";
  EXPECT_TRUE(mm.validate().ok()) << mm.validate().to_string();
}

// MindSpore's keep_checkpoint_per_n_minutes as its ModelCheckpoint._save_ckpt runs it,
// transcribed: at each save, cur_time is taken once the save is decided; if it is less than
// N minutes after _last_time_for_keep (the previous save's start, or the callback's
// creation), keep_one_ckpoint_per_minutes removes every file whose mtime is less than N
// minutes before cur_time, but the oldest of them; then _last_time_for_keep is set (before
// the write) and the file is written (its mtime: the end of the write). Files of an earlier
// run (a restart) are there from the start.
struct MindSporeSave {
  int64_t decided_ms, written_ms;
};

std::vector<int> mindspore_kept(const std::vector<MindSporeSave>& saves, int64_t created_ms, double minutes,
                                int earlier) {
  std::vector<std::pair<int, int64_t>> files;  // (save, mtime)
  for (int i = 0; i < earlier; ++i) files.emplace_back(i, saves[static_cast<std::size_t>(i)].written_ms);
  int64_t last_time_for_keep = created_ms;
  for (int i = earlier; i < static_cast<int>(saves.size()); ++i) {
    const int64_t cur_time = saves[static_cast<std::size_t>(i)].decided_ms;
    if (static_cast<double>(cur_time - last_time_for_keep) < minutes * 60'000) {
      std::vector<std::size_t> del_list;
      std::optional<std::size_t> oldest;
      for (std::size_t f = 0; f < files.size(); ++f)
        if (static_cast<double>(cur_time - files[f].second) < minutes * 60'000) {
          del_list.push_back(f);
          if (!oldest || files[f].second < files[*oldest].second) oldest = f;
        }
      std::vector<std::pair<int, int64_t>> kept;
      for (std::size_t f = 0; f < files.size(); ++f)
        if (std::find(del_list.begin(), del_list.end(), f) == del_list.end() || f == *oldest) kept.push_back(files[f]);
      files = kept;
    }
    last_time_for_keep = cur_time;
    files.emplace_back(i, saves[static_cast<std::size_t>(i)].written_ms);
  }
  std::vector<int> out;
  for (const auto& f : files) out.push_back(f.first);
  return out;
}

// The same saves through the manager's retention, as the manager calls it after each
// commit (the first `earlier` saves: committed by an earlier run, before `created`).
std::vector<int> distckpt_kept(const std::vector<MindSporeSave>& saves, int64_t created_ms, double minutes,
                               int earlier) {
  std::vector<SeriesEntry> entries;
  for (int i = 0; i < earlier; ++i)
    entries.push_back({"s" + std::to_string(i), static_cast<uint64_t>(i + 1), saves[static_cast<std::size_t>(i)].written_ms,
                       std::nullopt});
  int64_t previous_start = created_ms;
  for (int i = earlier; i < static_cast<int>(saves.size()); ++i) {
    const MindSporeSave& s = saves[static_cast<std::size_t>(i)];
    const std::string name = "s" + std::to_string(i);
    entries.push_back({name, static_cast<uint64_t>(i + 1), s.written_ms, std::nullopt});
    RetentionPolicy policy{0, minutes, 0, CompareRule::kLess, s.decided_ms, previous_start, name};
    for (const std::string& gone : retention_deletes(entries, policy))
      entries.erase(std::find_if(entries.begin(), entries.end(), [&](const SeriesEntry& e) { return e.name == gone; }));
    previous_start = s.decided_ms;
  }
  std::vector<int> out;
  for (const SeriesEntry& e : entries) out.push_back(std::stoi(e.name.substr(1)));
  return out;
}

TEST(Retention, KeepPerNMinutesReplaysMindSporesWindow) {
  const double minutes = 1.2 / 60;  // a 1.2 s window
  const int64_t created = 1'000'000;
  struct Case {
    const char* what;
    std::vector<MindSporeSave> saves;
    int64_t created;
    int earlier;  // saves of an earlier run, committed before `created`
  };
  std::vector<Case> cases;
  // Regular: a save decided every 305 ms, 10 ms of writing (no boundary ties).
  Case regular{"regular", {}, created, 0};
  for (int i = 0; i < 900; ++i) {
    const int64_t d = created + 200 + i * 305;
    regular.saves.push_back({d, d + 10});
  }
  cases.push_back(regular);
  // Jittered: gaps of 50-1900 ms and writes of 10-300 ms, from a fixed seed: some saves
  // come after the window closed, some inside it.
  Case jittered{"jittered", {}, created, 0};
  uint64_t x = 42;
  int64_t t = created + 100;
  for (int i = 0; i < 600; ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    const int64_t gap = 50 + static_cast<int64_t>((x >> 33) % 1851), write = 10 + static_cast<int64_t>((x >> 13) % 291);
    t += gap;
    jittered.saves.push_back({t, t + write});
    t += write;
  }
  cases.push_back(jittered);
  // Bursts: five saves 20 ms apart, then 2.5 s of training.
  Case bursts{"bursts", {}, created, 0};
  t = created + 10;
  for (int b = 0; b < 60; ++b, t += 2'500)
    for (int k = 0; k < 5; ++k, t += 20) bursts.saves.push_back({t, t + 15});
  cases.push_back(bursts);
  // A restart: an earlier run's saves, 300 ms apart, the last 100 ms before the manager was
  // made; the first new save, 400 ms later, finds them inside its window.
  Case restart{"restart", {}, created + 2'000, 6};
  for (int i = 0; i < 6; ++i) restart.saves.push_back({created + 400 + i * 300, created + 410 + i * 300});
  for (int i = 0; i < 10; ++i) restart.saves.push_back({created + 2'400 + i * 300, created + 2'410 + i * 300});
  cases.push_back(restart);
  // Ties: a file exactly N old at a decision, and a decision exactly N after the previous
  // start: both outside the window (MindSpore's comparisons are strict).
  Case ties{"ties", {{created + 100, created + 100}, {created + 1'300, created + 1'310}, {created + 1'500, created + 1'510},
                     {created + 2'700, created + 2'710}, {created + 2'710, created + 2'720}},
            created, 0};
  cases.push_back(ties);
  for (const Case& c : cases) {
    const std::vector<int> want = mindspore_kept(c.saves, c.created, minutes, c.earlier);
    EXPECT_EQ(distckpt_kept(c.saves, c.created, minutes, c.earlier), want) << c.what;
    if (std::string(c.what) != "ties") EXPECT_LT(want.size(), c.saves.size()) << c.what;
  }
  // The regular case keeps one save in three (0, 3, 6, ...), as MindSpore does: the rule the
  // manager had before (the first at least N after the previous kept one) kept one in four.
  const std::vector<int> kept = distckpt_kept(regular.saves, created, minutes, 0);
  EXPECT_EQ(kept[0], 0);
  EXPECT_EQ(kept[1], 3);
  EXPECT_EQ(kept[2], 6);
  // The restart: the earlier run's newest files inside the first window go but the oldest.
  const std::vector<int> after = distckpt_kept(restart.saves, restart.created, minutes, 6);
  EXPECT_TRUE(std::find(after.begin(), after.end(), 5) == after.end());
  // The ties keep everything: with <= instead of <, saves 1 and 3 would prune, and save 4
  // would find saves 2 and 3 in its window and delete 3.
  EXPECT_EQ(mindspore_kept(ties.saves, created, minutes, 0), (std::vector<int>{0, 1, 2, 3, 4}));
}

TEST(Manager, SavesEveryNStepsKeepsTheNewestAndWritesStatistics) {
  TempDir dir;
  expect_all_ok(run_ranks(3, [&](Comm& comm) -> Status {
    FormatModel model(comm.rank(), 3);
    CheckpointConfig c = base_config(dir.path());
    c.save_every_steps = 2;
    c.keep_max = 2;
    DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, c));
    int saves = 0;
    for (int64_t step = 1; step <= 10; ++step) {
      DISTCKPT_ASSIGN_OR_RETURN(StepOutcome out, m->step_end(step));
      saves += out.saved;
      if (out.saved != (step % 2 == 0)) return internal_error("step " + std::to_string(step));
    }
    DISTCKPT_ASSIGN_OR_RETURN(StepOutcome last, m->end(10, 0));  // just saved: nothing to do
    if (last.saved || saves != 5) return internal_error("saves " + std::to_string(saves));
    return Status();
  }));
  EXPECT_EQ(names_in(dir.path()), (std::set<std::string>{"run-0_8", "run-0_10"}));
  std::ifstream stats(dir.path() + "/stats.jsonl");
  std::string line;
  int lines = 0;
  while (std::getline(stats, line)) {
    ++lines;
    EXPECT_NE(line.find("\"write_s_slowest_rank\""), std::string::npos);
    EXPECT_NE(line.find("\"removed\""), std::string::npos);
  }
  EXPECT_EQ(lines, 5);
}

// MMEngine's save_begin: every 3 steps counted from step 5 (5, 8, 11), not steps that
// are multiples of 3 after it.
TEST(Manager, SaveBeginCountsTheIntervalFromItself) {
  TempDir dir;
  std::vector<int64_t> saved_at;
  expect_all_ok(run_ranks(2, [&](Comm& comm) -> Status {
    FormatModel model(comm.rank(), 2);
    CheckpointConfig c = base_config(dir.path());
    c.save_every_steps = 3;
    c.save_begin = 5;
    c.keep_max = 0;
    DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, c));
    for (int64_t step = 1; step <= 12; ++step) {
      DISTCKPT_ASSIGN_OR_RETURN(StepOutcome out, m->step_end(step, 0));
      if (out.saved && comm.rank() == 0) saved_at.push_back(step);
    }
    return Status();
  }));
  EXPECT_EQ(saved_at, (std::vector<int64_t>{5, 8, 11}));
}

// by_epoch: every 2 epochs at their ends (epochs counted as completed, 3 steps each),
// from save_begin 1: epochs 1, 3 and 5.
TEST(Manager, ByEpochSavesAtEpochEndsFromSaveBegin) {
  TempDir dir;
  std::vector<int64_t> saved_epochs;
  expect_all_ok(run_ranks(2, [&](Comm& comm) -> Status {
    FormatModel model(comm.rank(), 2);
    CheckpointConfig c = base_config(dir.path());
    c.by_epoch = true;
    c.save_every_steps = 2;
    c.save_begin = 1;
    c.keep_max = 0;
    DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, c));
    int64_t step = 0;
    for (int64_t epoch = 1; epoch <= 6; ++epoch)
      for (int s = 1; s <= 3; ++s) {
        const bool end = s == 3;
        DISTCKPT_ASSIGN_OR_RETURN(StepOutcome out, m->step_end(++step, end ? epoch : epoch - 1, {}, end));
        if (out.saved && comm.rank() == 0) saved_epochs.push_back(end ? epoch : -step);
      }
    return Status();
  }));
  EXPECT_EQ(saved_epochs, (std::vector<int64_t>{1, 3, 5}));
}

// MindSpore's append_info and crc_check (ckpt_crc_footer here) reach the manager's
// .ckpt files: the values are in every checkpoint; a file we write without its footer is
// still checked (each chunk's CRC32C in our checks field) and loads; with encryption both
// apply (MindSpore makes them exclusive), and the authenticated chunks are checked.
TEST(Manager, AppendInfoAndCrcCheckReachCkptFiles) {
  auto key = std::make_shared<const EncryptionKey>(*EncryptionKey::from_bytes(std::string(32, 'k')));
  for (const bool encrypted : {false, true}) {
    SCOPED_TRACE(encrypted);
    TempDir dir;
    std::string path;
    expect_all_ok(run_ranks(2, [&](Comm& comm) -> Status {
      FormatModel model(comm.rank(), 2);
      CheckpointConfig c = base_config(dir.path());
      c.format = Format::kCkpt;
      c.ckpt_crc_footer = false;
      c.save_every_steps = 1;
      c.append_info["lr"] = InfoValue(0.125);
      c.append_info["run"] = InfoValue(std::string("exp-7"));
      if (encrypted) c.encryption.key = key;
      DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, c));
      DISTCKPT_ASSIGN_OR_RETURN(StepOutcome out, m->step_end(1, 0));
      if (comm.rank() == 0) path = out.path;
      return out.saved ? Status() : internal_error("not saved");
    }));
    InspectOptions io;
    io.key = encrypted ? key : nullptr;
    auto info = read_checkpoint_info(path, io);
    ASSERT_TRUE(info.ok()) << info.status().to_string();
    ASSERT_TRUE(info->info.count("lr") && info->info.count("run") && info->info.count("step_num"));
    EXPECT_EQ(info_value_to_string(info->info.at("lr")), info_value_to_string(InfoValue(0.125)));
    EXPECT_EQ(info_value_to_string(info->info.at("run")), "exp-7");
    std::vector<Status> plain(2), unchecked(2);
    run_ranks(2, [&](Comm& comm) -> Status {
      FormatModel model(comm.rank(), 2);
      LoadOptions lo;
      lo.key = encrypted ? key : nullptr;
      plain[static_cast<std::size_t>(comm.rank())] = load(comm, model.state, path, lo).status();
      lo.allow_unchecked = true;
      unchecked[static_cast<std::size_t>(comm.rank())] = load(comm, model.state, path, lo).status();
      return Status();
    });
    for (int r = 0; r < 2; ++r) {
      EXPECT_TRUE(plain[r].ok()) << plain[r].to_string();
      EXPECT_TRUE(unchecked[r].ok()) << unchecked[r].to_string();
    }
    VerifyOptions vo;
    vo.key = encrypted ? key : nullptr;
    auto report = verify_checkpoint(path, vo);
    ASSERT_TRUE(report.ok()) << report.status().to_string();
    if (!encrypted) EXPECT_NE(report->checked.find("CRC32C"), std::string::npos) << report->checked;
  }
}

// MindSpore's names, "{prefix}-{epoch}_{step_in_epoch}", with steps_per_epoch (its
// batch_num): every 3 steps over epochs of 4 gives 1_3, 2_2 and 3_1.
TEST(Manager, MindSporeNamesCountStepsWithinTheEpoch) {
  TempDir dir;
  expect_all_ok(run_ranks(2, [&](Comm& comm) -> Status {
    FormatModel model(comm.rank(), 2);
    CheckpointConfig c = base_config(dir.path());
    c.name_template = "{prefix}-{epoch}_{step_in_epoch}";
    c.steps_per_epoch = 4;
    c.save_every_steps = 3;
    c.keep_max = 0;
    DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, c));
    for (int64_t step = 1; step <= 9; ++step) DISTCKPT_RETURN_IF_ERROR(m->step_end(step, (step - 1) / 4 + 1).status());
    return Status();
  }));
  EXPECT_EQ(names_in(dir.path()), (std::set<std::string>{"run-1_3", "run-2_2", "run-3_1"}));
  CheckpointConfig c = base_config(dir.path());
  c.name_template = "{prefix}-{epoch}_{step_in_epoch}";
  EXPECT_NE(c.validate().message().find("set steps_per_epoch"), std::string::npos);
  c.name_template = "{prefix}-{step_in_epoch}";
  c.steps_per_epoch = 4;
  EXPECT_NE(c.validate().message().find("neither {step} nor {epoch}"), std::string::npos) << c.validate().to_string();
}

// MMEngine's filename_tmpl ("iter_{}.pth": one "{}", the completed steps; epochs with
// by_epoch; the trailing extension gives way to the format's) and out_dir (checkpoints
// in out_dir/basename(directory)). Without a prefix the directory holds one series: a
// second run continues it, and keep_max counts both runs' checkpoints.
TEST(Manager, MMEngineFilenameTemplateAndOutDir) {
  TempDir out;
  const std::string work = out.path() + "/work_dirs/exp1/";  // MMEngine's work_dir, trailing '/'
  for (int run = 0; run < 2; ++run) {
    expect_all_ok(run_ranks(2, [&](Comm& comm) -> Status {
      FormatModel model(comm.rank(), 2);
      CheckpointConfig c = base_config(work);
      c.out_dir = out.path() + "/ckpts";
      c.filename_tmpl = "iter_{}.pth";
      c.save_every_steps = 2;
      c.keep_max = 3;
      c.save_last = false;
      DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, c));
      if (m->config().directory != out.path() + "/ckpts/exp1") return internal_error(m->config().directory);
      for (int64_t step = 1 + 4 * run; step <= 4 + 4 * run; ++step) DISTCKPT_RETURN_IF_ERROR(m->step_end(step, 0).status());
      return Status();
    }));
  }
  EXPECT_EQ(names_in(out.path() + "/ckpts/exp1"), (std::set<std::string>{"iter_4", "iter_6", "iter_8"}));
  EXPECT_FALSE(fs::exists(work));
  // by_epoch fills it with the completed epochs.
  TempDir dir;
  expect_all_ok(run_ranks(2, [&](Comm& comm) -> Status {
    FormatModel model(comm.rank(), 2);
    CheckpointConfig c = base_config(dir.path());
    c.filename_tmpl = "epoch_{}";
    c.by_epoch = true;
    c.format = Format::kSafetensors;
    c.integrated = true;
    c.keep_max = 0;
    c.save_last = false;
    DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, c));
    for (int64_t step = 1; step <= 6; ++step) DISTCKPT_RETURN_IF_ERROR(m->step_end(step, (step + 1) / 2, {}, step % 2 == 0).status());
    return Status();
  }));
  EXPECT_EQ(names_in(dir.path()), (std::set<std::string>{"epoch_1.safetensors", "epoch_2.safetensors", "epoch_3.safetensors"}));
  auto refused = [](const std::function<void(CheckpointConfig&)>& edit, const std::string& expect) {
    CheckpointConfig c = base_config("/tmp/x");
    edit(c);
    EXPECT_NE(c.validate().message().find(expect), std::string::npos) << c.validate().to_string();
  };
  refused([](auto& c) { c.filename_tmpl = "iter_{}_{}"; }, "exactly one");
  refused([](auto& c) { c.filename_tmpl = "iter"; }, "exactly one");
  refused([](auto& c) { c.filename_tmpl = "iter_{step}_{}"; }, "exactly one");
  refused([](auto& c) { c.filename_tmpl = "a/iter_{}"; }, "without '/'");
  refused([](auto& c) { c.filename_tmpl = "iter_{}"; c.name_template = "{prefix}-{step}"; }, "both set");
  refused([](auto& c) { c.out_dir = "/o"; c.directory = "/"; }, "no name");
  // An out_dir that is the work directory itself is not joined (MMEngine's rule).
  TempDir same;
  expect_all_ok(run_ranks(1, [&](Comm& comm) -> Status {
    FormatModel model(comm.rank(), 1);
    CheckpointConfig c = base_config(same.path() + "/exp1/");
    c.out_dir = same.path() + "/exp1";
    DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, c));
    return m->config().directory == same.path() + "/exp1/" ? Status() : internal_error(m->config().directory);
  }));
  refused([](auto& c) { c.save_begin = -1; }, "save_begin");
}

// Caffe2's JobRunner: epoch 0 saved before training (save_at_start), a checkpoint every
// N epochs (save_every_epochs), resume from the end of an epoch, kNotFound naming the
// epochs there are; the resume's statistics line.
TEST(Manager, EpochsAsCaffe2JobRunnerUsesThem) {
  TempDir dir;
  auto config = [&] {
    CheckpointConfig c = base_config(dir.path());
    c.save_every_steps = 0;
    c.save_every_epochs = 2;
    c.save_at_start = true;
    c.keep_max = 0;
    c.save_last = false;
    return c;
  };
  std::vector<int64_t> saved_steps;
  expect_all_ok(run_ranks(2, [&](Comm& comm) -> Status {
    FormatModel model(comm.rank(), 2);
    DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, config()));
    DISTCKPT_ASSIGN_OR_RETURN(ResumeResult r, m->resume());
    if (r.resumed || r.saved_at_start != dir.path() + "/run-0_0") return internal_error("start: " + r.saved_at_start);
    for (int64_t step = 1; step <= 15; ++step) {  // 5 epochs of 3 steps
      DISTCKPT_ASSIGN_OR_RETURN(StepOutcome out, m->step_end(step, (step + 2) / 3, {}, step % 3 == 0));
      if (out.saved && comm.rank() == 0) saved_steps.push_back(step);
    }
    return Status();
  }));
  EXPECT_EQ(saved_steps, (std::vector<int64_t>{6, 12}));
  std::vector<int64_t> resumed(3, -1);
  expect_all_ok(run_ranks(2, [&](Comm& comm) -> Status {
    FormatModel model(comm.rank(), 2);
    DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, config()));
    for (int64_t epoch : {0, 2, 4}) {
      DISTCKPT_ASSIGN_OR_RETURN(ResumeResult r, m->resume({.epoch = epoch}));
      if (!r.saved_at_start.empty()) return internal_error("saved at start although checkpoints exist");
      if (comm.rank() == 0) resumed[static_cast<std::size_t>(epoch / 2)] = r.step;
      if (r.epoch != epoch) return internal_error("epoch " + std::to_string(r.epoch));
    }
    auto missing = m->resume({.epoch = 3});
    if (missing.status().code() != StatusCode::kNotFound ||
        missing.status().message().find("epochs with one: 0, 2, 4") == std::string::npos)
      return internal_error("epoch 3: " + missing.status().to_string());
    auto both = m->resume({.step = 6, .epoch = 2});
    if (both.status().code() != StatusCode::kInvalidArgument) return internal_error("step and epoch: " + both.status().to_string());
    return Status();
  }));
  EXPECT_EQ(resumed, (std::vector<int64_t>{0, 6, 12}));
  // A mid-epoch save (step 4, no epoch_end) is no epoch's end.
  expect_all_ok(run_ranks(2, [&](Comm& comm) -> Status {
    FormatModel model(comm.rank(), 2);
    DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, config()));
    DISTCKPT_RETURN_IF_ERROR(m->save_now(13, 5).status());
    auto r = m->resume({.epoch = 5});
    return r.status().code() == StatusCode::kNotFound ? Status() : internal_error("mid-epoch: " + r.status().to_string());
  }));
  std::ifstream stats(dir.path() + "/stats.jsonl");
  std::string line, last_resume;
  while (std::getline(stats, line))
    if (line.find("\"event\":\"resume\"") != std::string::npos) last_resume = line;
  for (const char* field : {"\"source\"", "\"restore_s\"", "\"verify_s\"", "\"bytes_read\"", "\"missing_in_checkpoint\""})
    EXPECT_NE(last_resume.find(field), std::string::npos) << field << " in " << last_resume;
  EXPECT_EQ(last_resume.find("\"bytes_read\":0,"), std::string::npos) << last_resume;
}

// MMEngine's save_best with two metrics (rules inferred: acc greater, loss less): one
// "best_<metric>_<name>" each, replaced (the old one removed) when a better value
// arrives; a best at a periodic save's step is a second name for its files (hard
// links, same inodes), elsewhere it is written; steps without the metrics save as
// usual. A restart reads the best values back: a worse value changes nothing, a
// better one replaces it. best_checkpoint() names it; "auto" takes the first metric;
// best_prefixes {"layer0"} leaves the rest out (written, never linked).
TEST(Manager, SaveBestKeepsOneBestPerMetricAcrossRestarts) {
  TempDir dir;
  // step -> (loss, acc); no metrics at the other steps.
  const std::map<int64_t, std::pair<double, double>> evals{{2, {0.9, 0.5}}, {3, {0.7, 0.4}}, {4, {0.8, 0.6}},
                                                           {6, {0.75, std::nan("")}}};
  auto config = [&] {
    CheckpointConfig c = base_config(dir.path());
    c.save_every_steps = 2;
    c.keep_max = 1;
    c.save_last = false;
    c.save_best = {"loss", "acc"};
    return c;
  };
  std::vector<std::string> best_paths;
  expect_all_ok(run_ranks(2, [&](Comm& comm) -> Status {
    FormatModel model(comm.rank(), 2);
    DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, config()));
    auto none = m->best_checkpoint("loss");
    if (none.status().code() != StatusCode::kNotFound) return internal_error("before: " + none.status().to_string());
    for (int64_t step = 1; step <= 6; ++step) {
      std::map<std::string, double> metrics;
      if (auto it = evals.find(step); it != evals.end()) {
        metrics["loss"] = it->second.first;
        if (!std::isnan(it->second.second)) metrics["acc"] = it->second.second;
      }
      DISTCKPT_ASSIGN_OR_RETURN(StepOutcome out, m->step_end(step, 0, metrics));
      if (out.saved != (step % 2 == 0)) return internal_error("periodic save at " + std::to_string(step));
      if (comm.rank() == 0) best_paths.insert(best_paths.end(), out.best.begin(), out.best.end());
    }
    DISTCKPT_ASSIGN_OR_RETURN(std::string loss_best, m->best_checkpoint("loss"));
    DISTCKPT_ASSIGN_OR_RETURN(std::string first, m->best_checkpoint());
    if (loss_best != dir.path() + "/best_loss_run-0_3" || first != loss_best) return internal_error(loss_best);
    auto unknown = m->best_checkpoint("f1");
    return unknown.status().code() == StatusCode::kInvalidArgument ? Status() : internal_error(unknown.status().to_string());
  }));
  const std::string d = dir.path();
  EXPECT_EQ(best_paths, (std::vector<std::string>{d + "/best_loss_run-0_2", d + "/best_acc_run-0_2", d + "/best_loss_run-0_3",
                                                  d + "/best_acc_run-0_4"}));
  EXPECT_EQ(names_in(d), (std::set<std::string>{"run-0_6", "best_loss_run-0_3", "best_acc_run-0_4"}));
  // Step 3 was written (no periodic save then); step 4's best is step 4's save, linked:
  // run-0_4 was removed by keep_max 1 afterwards, and its files live on in the copy.
  struct stat st {};
  ASSERT_EQ(::stat((d + "/best_acc_run-0_4/data-00000.bin").c_str(), &st), 0);
  EXPECT_EQ(st.st_nlink, 1u);  // its twin is gone
  {
    auto info = read_checkpoint_info(d + "/best_acc_run-0_4");
    ASSERT_TRUE(info.ok()) << info.status().to_string();
    EXPECT_EQ(info_value_to_string(info->info.at("acc")), info_value_to_string(InfoValue(0.6)));
    EXPECT_EQ(info->step, 4);
  }
  // A restart: a worse loss (0.72) keeps step 3's, a better acc (0.65) at a periodic step
  // replaces step 4's, linked to the new periodic save while it exists.
  expect_all_ok(run_ranks(2, [&](Comm& comm) -> Status {
    FormatModel model(comm.rank(), 2);
    DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, config()));
    DISTCKPT_ASSIGN_OR_RETURN(ResumeResult r, m->resume());
    if (r.step != 6) return internal_error("resumed " + std::to_string(r.step));
    DISTCKPT_ASSIGN_OR_RETURN(StepOutcome out, m->step_end(8, 0, {{"loss", 0.72}, {"acc", 0.65}}));
    if (out.best != std::vector<std::string>{d + "/best_acc_run-0_8"}) return internal_error("best after restart");
    return Status();
  }));
  EXPECT_EQ(names_in(d), (std::set<std::string>{"run-0_8", "best_loss_run-0_3", "best_acc_run-0_8"}));
  struct stat a {}, b {};
  ASSERT_EQ(::stat((d + "/best_acc_run-0_8/data-00000.bin").c_str(), &a), 0);
  ASSERT_EQ(::stat((d + "/run-0_8/data-00000.bin").c_str(), &b), 0);
  EXPECT_EQ(a.st_ino, b.st_ino);  // not written twice (the index is the copy's own)
  // The linked copy has an index of its own: a best copy, not a save that moved `latest`.
  auto listing = list_checkpoints(d);
  ASSERT_TRUE(listing.ok());
  for (const auto& e : listing->entries)
    if (e.name.rfind("best_", 0) == 0) EXPECT_FALSE(e.advances_latest) << e.name;
  auto linked_info = read_checkpoint_info(d + "/best_acc_run-0_8");
  ASSERT_TRUE(linked_info.ok());
  EXPECT_EQ(info_value_to_string(linked_info->info.at("best_of")), "acc");
  EXPECT_TRUE(verify_checkpoint(d + "/best_acc_run-0_8").ok());
  auto latest = resolve_checkpoint(d);
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(*latest, d + "/run-0_8");
  // Resuming step 8 takes the periodic save, not its best copy.
  expect_all_ok(run_ranks(2, [&](Comm& comm) -> Status {
    FormatModel model(comm.rank(), 2);
    DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, config()));
    DISTCKPT_ASSIGN_OR_RETURN(ResumeResult r, m->resume({.step = 8}));
    return r.path == d + "/run-0_8" ? Status() : internal_error(r.path);
  }));

  // "auto", a single-file format (the link is of the file) and best_prefixes (written).
  for (const bool model_only : {false, true}) {
    SCOPED_TRACE(model_only);
    TempDir other;
    expect_all_ok(run_ranks(2, [&](Comm& comm) -> Status {
      FormatModel model(comm.rank(), 2);
      CheckpointConfig c = base_config(other.path());
      c.format = Format::kCkpt;
      c.save_every_steps = 1;
      c.save_best = {"auto"};
      if (model_only) c.best_prefixes = {"layer0"};
      DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, c));
      DISTCKPT_RETURN_IF_ERROR(m->step_end(1, 0, {{"val_loss", 0.5}, {"acc", 0.8}}).status());
      DISTCKPT_RETURN_IF_ERROR(m->step_end(2, 0, {{"val_loss", 0.5}, {"acc", 0.9}}).status());
      DISTCKPT_ASSIGN_OR_RETURN(std::string best, m->best_checkpoint());
      return best == other.path() + "/best_acc_run-0_2.ckpt" ? Status() : internal_error(best);
    }));
    // The previous best file is gone; a single file is written, never linked (its
    // description is inside it).
    EXPECT_FALSE(fs::exists(other.path() + "/best_acc_run-0_1.ckpt"));
    struct stat x {}, y {};
    ASSERT_EQ(::stat((other.path() + "/best_acc_run-0_2.ckpt").c_str(), &x), 0);
    ASSERT_EQ(::stat((other.path() + "/run-0_2.ckpt").c_str(), &y), 0);
    EXPECT_NE(x.st_ino, y.st_ino);
    auto desc = read_checkpoint_info(other.path() + "/best_acc_run-0_2.ckpt");
    ASSERT_TRUE(desc.ok()) << desc.status().to_string();
    for (const auto& t : desc->tensors) EXPECT_TRUE(!model_only || t.name.rfind("layer0", 0) == 0) << t.name;
  }
  auto refused = [](const std::function<void(CheckpointConfig&)>& edit, const std::string& expect) {
    CheckpointConfig c = base_config("/tmp/x");
    edit(c);
    EXPECT_NE(c.validate().message().find(expect), std::string::npos) << c.validate().to_string();
  };
  refused([](auto& c) { c.save_best = {"auto", "acc"}; }, "must be alone");
  refused([](auto& c) { c.save_best = {"acc", "acc"}; }, "twice");
  refused([](auto& c) { c.save_best = {"val/acc", "val_acc"}; }, "twice");
  refused([](auto& c) { c.name_template = "best_{step}"; }, "reserved");
  refused([](auto& c) { c.filename_tmpl = "{}_exception"; }, "reserved");
  refused([](auto& c) { c.filename_tmpl = ".{}"; }, "reserved");
  refused([](auto& c) { c.save_best = {"fid"}; }, "cannot tell");
  refused([](auto& c) { c.save_best = {"a", "b", "c"}; c.save_best_rules = {CompareRule::kLess, CompareRule::kLess}; }, "one per");
  // Encrypted: the linked copy's own index is sealed again with the key; every chunk
  // still authenticates (a chunk's identity does not include the index).
  {
    TempDir enc;
    auto key = std::make_shared<const EncryptionKey>(*EncryptionKey::from_bytes(std::string(32, 'e')));
    expect_all_ok(run_ranks(2, [&](Comm& comm) -> Status {
      FormatModel model(comm.rank(), 2);
      CheckpointConfig c = base_config(enc.path());
      c.encryption.key = key;
      c.save_best = {"loss"};
      DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, c));
      return m->step_end(1, 0, {{"loss", 0.5}}).status();
    }));
    struct stat e1 {}, e2 {};
    ASSERT_EQ(::stat((enc.path() + "/best_loss_run-0_1/data-00000.bin").c_str(), &e1), 0);
    ASSERT_EQ(::stat((enc.path() + "/run-0_1/data-00000.bin").c_str(), &e2), 0);
    EXPECT_EQ(e1.st_ino, e2.st_ino);
    VerifyOptions vo;
    vo.key = key;
    auto verified = verify_checkpoint(enc.path() + "/best_loss_run-0_1", vo);
    EXPECT_TRUE(verified.ok()) << verified.status().to_string();
    auto loaded = load_all(enc.path() + "/best_loss_run-0_1", {.key = key});
    EXPECT_TRUE(loaded.ok()) << loaded.status().to_string();
  }
  CheckpointConfig ok = base_config("/tmp/x");
  ok.save_best = {"fid", "IS"};
  ok.less_keys = {"fid"};
  ok.greater_keys = {"is"};
  EXPECT_TRUE(ok.validate().ok()) << ok.validate().to_string();
  EXPECT_EQ(*ok.save_best_rule(0, "fid"), CompareRule::kLess);
  EXPECT_EQ(*ok.save_best_rule(1, "IS"), CompareRule::kGreater);
}

// MindSpore's saved_network: saves write another state dict than the managed one (here
// the managed model's bias alone); resume loads it into the managed state, non-strictly.
TEST(Manager, SavedNetworkIsWhatSavesWrite) {
  TempDir dir;
  expect_all_ok(run_ranks(2, [&](Comm& comm) -> Status {
    FormatModel model(comm.rank(), 2), other(comm.rank(), 2);
    StateDict network(comm.rank());
    const TensorEntry& bias = other.state.tensors()[static_cast<std::size_t>(other.state.find("bias"))];
    DISTCKPT_RETURN_IF_ERROR(network.add_tensor("bias", bias.dtype, bias.buffers, bias.layout));
    CheckpointConfig c = base_config(dir.path());
    c.saved_network = &network;
    DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, c));
    DISTCKPT_RETURN_IF_ERROR(m->step_end(1, 0).status());
    model.zero();
    DISTCKPT_ASSIGN_OR_RETURN(auto again, CheckpointManager::create(comm, model.state, c));
    auto strict = again->resume();
    if (strict.status().code() != StatusCode::kMismatch) return internal_error("strict: " + strict.status().to_string());
    DISTCKPT_ASSIGN_OR_RETURN(ResumeResult r, again->resume({.strict = false}));
    if (r.missing_in_checkpoint.size() + 1 != model.state.tensors().size()) return internal_error("missing count");
    const TensorEntry& loaded = model.state.tensors()[static_cast<std::size_t>(model.state.find("bias"))];
    for (std::size_t b = 0; b < loaded.boxes.size(); ++b)
      if (std::memcmp(loaded.buffers[b], bias.buffers[b], static_cast<std::size_t>(loaded.boxes[b].num_elements()) * 4) != 0)
        return internal_error("bias differs");
    return Status();
  }));
  auto info = read_checkpoint_info(dir.path() + "/run-0_1");
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  ASSERT_EQ(info->tensors.size(), 1u);
  EXPECT_EQ(info->tensors[0].name, "bias");
}

// Caffe2's upload hook: rank 0 uploads each committed checkpoint off the training
// thread, in commit order; retention keeps a checkpoint while its upload is pending;
// outcomes (a failure too) reach every rank at the next call and stats.jsonl; end()
// waits for the queue. Only rank 0 sets the hook, as only its hook runs. A command is
// spawned with the path as its last argument.
// Caffe2's upload: once, at the end, of the run's last checkpoint.
TEST(Manager, UploadAtEndUploadsTheLastCheckpointOnce) {
  TempDir dir;
  std::vector<std::string> calls;
  expect_all_ok(run_ranks(2, [&](Comm& comm) -> Status {
    FormatModel model(comm.rank(), 2);
    CheckpointConfig c = base_config(dir.path());
    c.upload_at_end = true;
    if (comm.rank() == 0) c.upload = [&](const std::string& path) -> Status {
      calls.push_back(path);  // one upload at a time, on the uploader's thread
      return Status();
    };
    DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, c));
    for (int s = 1; s <= 3; ++s) DISTCKPT_RETURN_IF_ERROR(m->step_end(s, 0).status());
    DISTCKPT_ASSIGN_OR_RETURN(StepOutcome last, m->end(3, 0));
    if (last.uploaded != std::vector<std::string>{dir.path() + "/run-0_3"}) return internal_error("not uploaded at end");
    return Status();
  }));
  EXPECT_EQ(calls, (std::vector<std::string>{dir.path() + "/run-0_3"}));
}

TEST(Manager, UploadHookRunsInOrderOffTheLoopAndNeverFails) {
  TempDir dir;
  std::mutex mu;
  std::vector<std::string> calls;
  std::atomic<bool> release{false};
  std::atomic<int> finished{0};
  std::vector<StepOutcome> outcomes(2);
  std::vector<std::set<std::string>> listed(2);
  expect_all_ok(run_ranks(2, [&](Comm& comm) -> Status {
    FormatModel model(comm.rank(), 2);
    CheckpointConfig c = base_config(dir.path());
    c.keep_max = 1;
    if (comm.rank() == 0) c.upload = [&](const std::string& path) -> Status {
      {
        std::lock_guard<std::mutex> lock(mu);
        calls.push_back(path);
      }
      while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      ++finished;
      if (path.find("run-0_2") != std::string::npos) return io_error("the bucket refused it");
      return Status();
    };
    DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, c));
    DISTCKPT_RETURN_IF_ERROR(m->step_end(1, 0).status());
    DISTCKPT_RETURN_IF_ERROR(m->step_end(2, 0).status());
    // run-0_1 is still uploading: retention kept it.
    if (comm.rank() == 0) listed[0] = names_in(dir.path());
    comm.barrier();
    if (comm.rank() == 0) {
      release = true;
      while (finished < 2) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    comm.barrier();
    StepOutcome& out = outcomes[static_cast<std::size_t>(comm.rank())];
    DISTCKPT_ASSIGN_OR_RETURN(out, m->step_end(3, 0));
    DISTCKPT_ASSIGN_OR_RETURN(StepOutcome last, m->end(3, 0));
    if (last.uploaded != std::vector<std::string>{dir.path() + "/run-0_3"}) return internal_error("end did not wait");
    // The hook counts itself finished just before it returns, and its report is stored
    // after: run-0_2's failure reaches step_end(3) or, when the uploader's thread was slow
    // to store it, end(). Reported once, in one of the two.
    out.upload_errors.insert(out.upload_errors.end(), last.upload_errors.begin(), last.upload_errors.end());
    if (comm.rank() == 0) listed[1] = names_in(dir.path());
    return Status();
  }));
  EXPECT_EQ(listed[0], (std::set<std::string>{"run-0_1", "run-0_2"}));
  EXPECT_EQ(listed[1], (std::set<std::string>{"run-0_3"}));
  EXPECT_EQ(calls, (std::vector<std::string>{dir.path() + "/run-0_1", dir.path() + "/run-0_2", dir.path() + "/run-0_3"}));
  for (const StepOutcome& out : outcomes) {
    EXPECT_EQ(out.uploaded, std::vector<std::string>{dir.path() + "/run-0_1"});
    ASSERT_EQ(out.upload_errors.size(), 1u);
    EXPECT_NE(out.upload_errors[0].find("the bucket refused it"), std::string::npos) << out.upload_errors[0];
  }
  std::ifstream stats(dir.path() + "/stats.jsonl");
  std::string line;
  int uploads = 0, failed = 0;
  while (std::getline(stats, line))
    if (line.find("\"event\":\"upload\"") != std::string::npos) ++uploads, failed += line.find("\"ok\":false") != std::string::npos;
  EXPECT_EQ(uploads, 3);
  EXPECT_EQ(failed, 1);

  // A command: no shell between us and it (the path, spaces and all, is one argument).
  TempDir cmd_dir;
  const std::string root = cmd_dir.path() + "/with space";
  const std::string log = cmd_dir.path() + "/log";
  expect_all_ok(run_ranks(2, [&](Comm& comm) -> Status {
    FormatModel model(comm.rank(), 2);
    CheckpointConfig c = base_config(root);
    c.upload_command = {"/bin/sh", "-c", "printf '%s|\\n' \"$1\" >> '" + log + "'; [ \"$1\" != \"${1%_2}\" ] && exit 3; exit 0", "sh"};
    DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, c));
    for (int64_t step = 1; step <= 2; ++step) DISTCKPT_RETURN_IF_ERROR(m->step_end(step, 0).status());
    DISTCKPT_ASSIGN_OR_RETURN(StepOutcome last, m->end(2, 0));
    const std::size_t seen = last.uploaded.size() + last.upload_errors.size();
    if (seen == 0) return internal_error("no upload reported by end()");
    return Status();
  }));
  std::ifstream in(log);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, root + "/run-0_1|\n" + root + "/run-0_2|\n");
  std::ifstream cmd_stats(root + "/stats.jsonl");
  bool exit_reported = false;
  while (std::getline(cmd_stats, line)) exit_reported |= line.find("exited with status 3") != std::string::npos;
  EXPECT_TRUE(exit_reported);
  CheckpointConfig both = base_config("/tmp/x");
  both.upload = [](const std::string&) { return Status(); };
  both.upload_command = {"true"};
  EXPECT_NE(both.validate().message().find("not both"), std::string::npos);
}

TEST(Manager, TimeBasedSavesAgreeAcrossRanksEvenWithASlowRank) {
  TempDir dir;
  using Clock = std::chrono::steady_clock;
  constexpr double kInterval = 0.03;
  std::vector<std::vector<int>> saved(3);
  // Rank 0's clock around manager creation and each step_end: the decision is taken
  // inside, so the bounds below hold however slow the machine (a sanitizer build may
  // take longer than the interval to save, and then every step rightly saves).
  Clock::time_point created_before, created_after;
  std::vector<Clock::time_point> before(12), after(12);
  expect_all_ok(run_ranks(3, [&](Comm& comm) -> Status {
    FormatModel model(comm.rank(), 3);
    CheckpointConfig c = base_config(dir.path());
    c.save_every_steps = 0;
    c.save_every_seconds = kInterval;
    c.keep_max = 0;
    if (comm.rank() == 0) created_before = Clock::now();
    DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, c));
    if (comm.rank() == 0) created_after = Clock::now();
    for (int64_t step = 1; step <= 12; ++step) {
      // Rank 2 is slow and its steps take different times: only rank 0's clock decides.
      std::this_thread::sleep_for(std::chrono::milliseconds(comm.rank() == 2 ? 3 * (step % 4) + 5 : 5));
      const auto i = static_cast<std::size_t>(step - 1);
      if (comm.rank() == 0) before[i] = Clock::now();
      DISTCKPT_ASSIGN_OR_RETURN(StepOutcome out, m->step_end(step, 0));
      if (comm.rank() == 0) after[i] = Clock::now();
      saved[static_cast<std::size_t>(comm.rank())].push_back(out.saved);
    }
    return Status();
  }));
  EXPECT_EQ(saved[0], saved[1]);
  EXPECT_EQ(saved[0], saved[2]);
  EXPECT_GT(std::count(saved[0].begin(), saved[0].end(), 1), 0);
  // The interval runs from the end of the previous save (or the manager's creation),
  // which lies between the clock readings around that call.
  const auto seconds = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
  Clock::time_point prev_before = created_before, prev_after = created_after;
  for (std::size_t i = 0; i < 12 && saved[0].size() == 12; ++i) {
    if (saved[0][i]) {
      EXPECT_GE(seconds(prev_before, after[i]), kInterval) << "step " << i + 1 << " saved too early";
      prev_before = before[i], prev_after = after[i];
    } else {
      EXPECT_LT(seconds(prev_after, before[i]), kInterval) << "step " << i + 1 << " should have saved";
    }
  }
}

TEST(Manager, RestartsResumeTheSeriesAndKeepMaxHoldsAcrossThem) {
  TempDir dir;
  auto train = [&](int64_t from, int64_t to, bool resume, std::string* prefix, int64_t* resumed_step) {
    expect_all_ok(run_ranks(2, [&](Comm& comm) -> Status {
      FormatModel model(comm.rank(), 2);
      CheckpointConfig c = base_config(dir.path());
      c.save_every_steps = 1;
      c.keep_max = 3;
      DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, c));
      if (resume) {
        DISTCKPT_ASSIGN_OR_RETURN(ResumeResult r, m->resume());
        if (comm.rank() == 0) *resumed_step = r.step;
      }
      for (int64_t s = from; s <= to; ++s) DISTCKPT_RETURN_IF_ERROR(m->step_end(s, 0).status());
      if (comm.rank() == 0) *prefix = m->series_prefix();
      return Status();
    }));
  };
  std::string prefix;
  int64_t resumed = -1;
  train(1, 5, false, &prefix, &resumed);
  EXPECT_EQ(prefix, "run");
  EXPECT_EQ(names_in(dir.path()), (std::set<std::string>{"run-0_3", "run-0_4", "run-0_5"}));
  // A restart that resumes continues the series; retention still keeps 3.
  train(6, 7, true, &prefix, &resumed);
  EXPECT_EQ(resumed, 5);
  EXPECT_EQ(prefix, "run");
  EXPECT_EQ(names_in(dir.path()), (std::set<std::string>{"run-0_5", "run-0_6", "run-0_7"}));
  // A new run in the same directory that does not resume gets a new prefix and never
  // touches the other run's checkpoints.
  train(1, 4, false, &prefix, &resumed);
  EXPECT_EQ(prefix, "run_1");
  EXPECT_EQ(names_in(dir.path()),
            (std::set<std::string>{"run-0_5", "run-0_6", "run-0_7", "run_1-0_2", "run_1-0_3", "run_1-0_4"}));
}

TEST(Manager, CrashBetweenCommitAndRetentionIsCleanedUpOnTheNextSave) {
  TempDir dir;
  // Five committed checkpoints of the series, as if retention never ran after them.
  expect_all_ok(run_ranks(2, [&](Comm& comm) -> Status {
    FormatModel model(comm.rank(), 2);
    for (int s = 1; s <= 5; ++s) {
      SaveOptions o;
      o.name = "run-0_" + std::to_string(s);
      o.step = s;
      o.epoch = 0;
      DISTCKPT_RETURN_IF_ERROR(save(comm, model.state, dir.path(), o).status());
    }
    CheckpointConfig c = base_config(dir.path());
    c.keep_max = 2;
    DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, c));
    DISTCKPT_ASSIGN_OR_RETURN(ResumeResult r, m->resume());
    if (r.step != 5) return internal_error("resumed at " + std::to_string(r.step));
    DISTCKPT_ASSIGN_OR_RETURN(StepOutcome out, m->step_end(6, 0));
    return out.removed.size() == 4 ? Status() : internal_error("removed " + std::to_string(out.removed.size()));
  }));
  EXPECT_EQ(names_in(dir.path()), (std::set<std::string>{"run-0_5", "run-0_6"}));
}

// Retention renames a checkpoint away before removing it, so a crash never leaves a
// listed checkpoint half deleted; what such a crash leaves ("<name>.tmp-deleting-<id>",
// listed as in flight) is removed by the next retention of the same series. In-flight
// saves, other series' leftovers and look-alike names are never touched.
TEST(Manager, LeftoversOfACrashedRemovalAreRemovedAndInFlightSavesAreNot) {
  TempDir dir;
  fs::create_directories(dir.path() + "/run-0_1.tmp-deleting-00000000000000ab/sub");
  std::ofstream(dir.path() + "/run-0_1.tmp-deleting-00000000000000ab/index.pb") << "partial";
  std::ofstream(dir.path() + "/run-0_3.safetensors.tmp-deleting-00000000000000ef") << "partial";
  fs::create_directories(dir.path() + "/other-0_7.tmp-00000000000000cd");
  fs::create_directories(dir.path() + "/other-0_7.tmp-deleting-00000000000000cd");
  fs::create_directories(dir.path() + "/run-0_9.deleting.tmp-00000000000000cd");
  expect_all_ok(run_ranks(2, [&](Comm& comm) -> Status {
    FormatModel model(comm.rank(), 2);
    CheckpointConfig c = base_config(dir.path());
    c.keep_max = 1;
    DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, c));
    for (int64_t step = 1; step <= 2; ++step) DISTCKPT_RETURN_IF_ERROR(m->step_end(step, 0).status());
    return Status();
  }));
  EXPECT_EQ(names_in(dir.path()),
            (std::set<std::string>{"run-0_2", "other-0_7.tmp-00000000000000cd", "other-0_7.tmp-deleting-00000000000000cd",
                                   "run-0_9.deleting.tmp-00000000000000cd"}));
}

// Best-K by loss; a save without the metric (the loss is reported only when the loop
// evaluates) is made all the same, outside best-K, as is a breakpoint on a signal.
TEST(Manager, KeepsTheBestByMetricAndSavesWithoutIt) {
  TempDir dir;
  const double losses[] = {0.9, 0.2, 0.5, std::nan(""), 0.7};
  expect_all_ok(run_ranks(2, [&](Comm& comm) -> Status {
    FormatModel model(comm.rank(), 2);
    CheckpointConfig c = base_config(dir.path());
    c.keep_max = 1;
    c.best_metric = "loss";
    c.keep_best = 1;
    // A value of the metric's name in the state's info is never taken for this save's.
    DISTCKPT_RETURN_IF_ERROR(model.state.set_info("loss", 0.001));
    DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, c));
    for (int s = 1; s <= 5; ++s) DISTCKPT_RETURN_IF_ERROR(m->step_end(s, 0, {{"loss", losses[s - 1]}}).status());
    DISTCKPT_ASSIGN_OR_RETURN(StepOutcome without, m->step_end(6, 0, {{"acc", 1.0}}));
    if (!without.saved) return internal_error("the save without the metric was not made");
    return Status();
  }));
  EXPECT_EQ(names_in(dir.path()), (std::set<std::string>{"run-0_2", "run-0_6"}));  // best and newest
  auto newest = read_checkpoint_info(dir.path() + "/run-0_6");
  ASSERT_TRUE(newest.ok());
  EXPECT_EQ(newest->info.count("loss"), 0u);
}

TEST(Manager, SignalMidRunCommitsALoadableBreakpoint) {
  TempDir dir;
  ASSERT_TRUE(CheckpointManager::install_signal_handlers().ok());
  CheckpointManager::clear_signal();
  int64_t stopped_at = -1;
  expect_all_ok(run_ranks(3, [&](Comm& comm) -> Status {
    FormatModel model(comm.rank(), 3);
    CheckpointConfig c = base_config(dir.path());
    c.save_every_steps = 100;
    DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, c));
    for (int64_t s = 1; s <= 20; ++s) {
      if (s == 7 && comm.rank() == 1) ::raise(SIGUSR1);  // what Slurm sends before the time limit
      DISTCKPT_ASSIGN_OR_RETURN(StepOutcome out, m->step_end(s, 0));
      if (out.stop) {
        if (!out.saved) return internal_error("stopped without saving");
        if (comm.rank() == 0) stopped_at = s;
        return Status();
      }
    }
    return internal_error("no stop");
  }));
  CheckpointManager::clear_signal();
  EXPECT_GE(stopped_at, 7);
  EXPECT_EQ(names_in(dir.path()), (std::set<std::string>{"run-0_" + std::to_string(stopped_at) + "_breakpoint"}));
  expect_all_ok(run_ranks(2, [&](Comm& comm) -> Status {  // loads at another world size
    FormatModel model(comm.rank(), 2), want(comm.rank(), 2);
    model.zero();
    CheckpointConfig c = base_config(dir.path());
    DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, c));
    DISTCKPT_ASSIGN_OR_RETURN(ResumeResult r, m->resume());
    if (!r.resumed || r.step != stopped_at) return internal_error("resume");
    return model.buffers == want.buffers ? Status() : internal_error("state differs");
  }));
}

TEST(Manager, ResumeFreshDamagedAndFallback) {
  TempDir dir;
  expect_all_ok(run_ranks(2, [&](Comm& comm) -> Status {
    FormatModel model(comm.rank(), 2);
    CheckpointConfig c = base_config(dir.path());
    c.keep_max = 0;
    DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, c));
    DISTCKPT_ASSIGN_OR_RETURN(ResumeResult fresh, m->resume());
    if (fresh.resumed) return internal_error("resumed from nothing");
    for (int s = 1; s <= 3; ++s) DISTCKPT_RETURN_IF_ERROR(m->step_end(s, 0).status());
    return Status();
  }));
  // Damage the newest checkpoint's data.
  for (const auto& e : fs::directory_iterator(dir.path() + "/run-0_3"))
    if (e.path().filename().string().rfind("data-", 0) == 0) {
      std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(3);
      f.put('\x7f');
    }
  expect_all_ok(run_ranks(2, [&](Comm& comm) -> Status {
    FormatModel model(comm.rank(), 2);
    CheckpointConfig c = base_config(dir.path());
    DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, c));
    auto refused = m->resume();
    if (refused.status().code() != StatusCode::kCorruption) return internal_error("damaged: " + refused.status().to_string());
    ResumeOptions o;
    o.fall_back_to_previous = true;
    DISTCKPT_ASSIGN_OR_RETURN(ResumeResult r, m->resume(o));
    if (r.step != 2 || r.skipped.size() != 1) return internal_error("fallback to " + std::to_string(r.step));
    ResumeOptions missing;
    missing.target = "run-0_99";
    if (m->resume(missing).status().code() != StatusCode::kNotFound) return internal_error("missing target");
    ResumeOptions by_step;
    by_step.step = 1;
    DISTCKPT_ASSIGN_OR_RETURN(ResumeResult one, m->resume(by_step));
    return one.step == 1 ? Status() : internal_error("by step");
  }));
}

// A rewind: resuming an older checkpoint and saving again. The abandoned branch stays until
// the new branch's first save is committed (a crash before it resumes where the job was),
// then it is retired, and retention counts the new branch only: the resume point stays.
TEST(Manager, ARewindRetiresTheAbandonedBranchAtTheFirstNewSave) {
  TempDir dir;
  auto committed = [&] {
    std::vector<std::string> names;
    auto listing = list_checkpoints(dir.path());
    EXPECT_TRUE(listing.ok());
    for (const auto& e : listing->entries)
      if (e.state == EntryState::kCommitted) names.push_back(e.name);
    std::sort(names.begin(), names.end());
    return names;
  };
  expect_all_ok(run_ranks(2, [&](Comm& comm) -> Status {
    FormatModel model(comm.rank(), 2);
    CheckpointConfig c = base_config(dir.path());
    c.keep_max = 3;
    DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, c));
    for (int s = 1; s <= 5; ++s) DISTCKPT_RETURN_IF_ERROR(m->step_end(s, 0).status());
    return Status();
  }));
  EXPECT_EQ(committed(), (std::vector<std::string>{"run-0_3", "run-0_4", "run-0_5"}));
  for (int attempt = 0; attempt < 2; ++attempt)
    expect_all_ok(run_ranks(2, [&](Comm& comm) -> Status {
      FormatModel model(comm.rank(), 2);
      CheckpointConfig c = base_config(dir.path());
      c.keep_max = 3;
      DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, c));
      ResumeOptions back;
      back.step = 3;
      DISTCKPT_ASSIGN_OR_RETURN(ResumeResult r, m->resume(back));
      if (r.step != 3) return internal_error("resumed step " + std::to_string(r.step));
      if (attempt == 0) return Status();  // a crash before the first save: nothing retired
      for (int s = 4; s <= 6; ++s) DISTCKPT_RETURN_IF_ERROR(m->step_end(s, 0).status());
      return Status();
    }));
  // Incremental saves after a rewind build on the checkpoint resumed: the first one's base.
  {
    TempDir inc;
    expect_all_ok(run_ranks(2, [&](Comm& comm) -> Status {
      FormatModel model(comm.rank(), 2);
      CheckpointConfig c = base_config(inc.path());
      c.keep_max = 0;
      c.incremental = true;
      DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, c));
      for (int s = 1; s <= 3; ++s) DISTCKPT_RETURN_IF_ERROR(m->step_end(s, 0).status());
      return Status();
    }));
    expect_all_ok(run_ranks(2, [&](Comm& comm) -> Status {
      FormatModel model(comm.rank(), 2);
      CheckpointConfig c = base_config(inc.path());
      c.keep_max = 0;
      c.incremental = true;
      DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, c));
      ResumeOptions back;
      back.step = 1;
      DISTCKPT_RETURN_IF_ERROR(m->resume(back).status());
      return m->step_end(2, 0).status();
    }));
    std::ifstream stats(inc.path() + "/stats.jsonl");
    std::string line, last_save;
    while (std::getline(stats, line))
      if (line.find("\"incremental_base\"") != std::string::npos) last_save = line;
    EXPECT_NE(last_save.find("\"incremental_base\":\"run-0_1\""), std::string::npos) << last_save;
  }
  // The first new save found run-0_4 taken (by the abandoned branch, retired after it).
  EXPECT_EQ(committed(), (std::vector<std::string>{"run-0_4_1", "run-0_5", "run-0_6"}));
  expect_all_ok(run_ranks(2, [&](Comm& comm) -> Status {
    FormatModel model(comm.rank(), 2);
    DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, base_config(dir.path())));
    DISTCKPT_ASSIGN_OR_RETURN(ResumeResult r, m->resume());
    return r.step == 6 && r.path.ends_with("run-0_6") ? Status() : internal_error("resumed " + r.path);
  }));
}

// A single file (safetensors here) cut short: resolving `latest` finds it damaged. The
// refusal says how to fall back, and the fallback takes the newest undamaged one.
TEST(Manager, ResumeFallsBackPastATruncatedSingleFile) {
  TempDir dir;
  auto config = [&] {
    CheckpointConfig c = base_config(dir.path());
    c.keep_max = 0;
    c.format = Format::kSafetensors;
    return c;
  };
  expect_all_ok(run_ranks(2, [&](Comm& comm) -> Status {
    FormatModel model(comm.rank(), 2);
    DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, config()));
    for (int s = 1; s <= 3; ++s) DISTCKPT_RETURN_IF_ERROR(m->step_end(s, 0).status());
    return Status();
  }));
  const std::string newest = dir.path() + "/run-0_3.safetensors";
  ASSERT_TRUE(fs::exists(newest));
  fs::resize_file(newest, fs::file_size(newest) / 2);
  expect_all_ok(run_ranks(2, [&](Comm& comm) -> Status {
    FormatModel model(comm.rank(), 2), want(comm.rank(), 2);
    model.zero();
    DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, config()));
    auto refused = m->resume();
    if (refused.status().code() != StatusCode::kCorruption ||
        refused.status().message().find("fall_back_to_previous") == std::string::npos ||
        refused.status().message().find("run-0_3.safetensors") == std::string::npos)
      return internal_error("damaged: " + refused.status().to_string());
    ResumeOptions o;
    o.fall_back_to_previous = true;
    DISTCKPT_ASSIGN_OR_RETURN(ResumeResult r, m->resume(o));
    if (!r.resumed || r.step != 2 || r.skipped != std::vector<std::string>{newest})
      return internal_error("fallback to " + std::to_string(r.step) + " past " + std::to_string(r.skipped.size()));
    return model.buffers == want.buffers ? Status() : internal_error("state differs after the fallback");
  }));
}

TEST(Manager, FailedSavesStopOrContinueAlikeOnEveryRank) {
  for (OnSaveFailure policy : {OnSaveFailure::kStop, OnSaveFailure::kContinue}) {
    TempDir dir;
    internal_storage::FaultSpec spec;
    spec.fail_create_if_contains = "data-00001";
    auto faulty = std::make_shared<internal_storage::FaultFileSystem>(posix_filesystem(), spec);
    expect_all_ok(run_ranks(2, [&](Comm& comm) -> Status {
      FormatModel model(comm.rank(), 2);
      CheckpointConfig c = base_config(dir.path());
      c.on_failure = policy;
      c.fs = faulty;
      DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, c));
      auto out = m->step_end(1, 0);
      if (policy == OnSaveFailure::kStop)
        return out.ok() ? internal_error("a failed save returned ok") : Status();
      if (!out.ok() || out->saved || out->save_error.ok()) return internal_error("continue: " + out.status().to_string());
      return Status();
    }));
    EXPECT_TRUE(names_in(dir.path()).empty());
  }
}

TEST(Manager, UnwritableDirectoryAndPartialStateSaves) {
  TempDir dir;
  std::ofstream(dir.path() + "/file") << "x";
  auto res = run_ranks(2, [&](Comm& comm) -> Status {
    FormatModel model(comm.rank(), 2);
    return CheckpointManager::create(comm, model.state, base_config(dir.path() + "/file/ckpt")).status();
  });
  for (const auto& r : res) EXPECT_NE(r.find("file/ckpt"), std::string::npos) << r;
  // Model only (MMEngine's save_optimizer = false): the other tensors are not saved.
  expect_all_ok(run_ranks(2, [&](Comm& comm) -> Status {
    FormatModel model(comm.rank(), 2);
    CheckpointConfig c = base_config(dir.path() + "/partial");
    c.save_prefixes = {"layer1/", "bias"};
    c.format = Format::kSafetensors;
    DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, c));
    DISTCKPT_ASSIGN_OR_RETURN(StepOutcome out, m->step_end(1, 0));
    DISTCKPT_ASSIGN_OR_RETURN(CheckpointInfo info, read_checkpoint_info(out.path));
    if (info.tensors.size() != 2) return internal_error(std::to_string(info.tensors.size()) + " tensors");
    ResumeOptions partial;
    partial.strict = false;
    DISTCKPT_ASSIGN_OR_RETURN(ResumeResult r, m->resume(partial));
    return r.missing_in_checkpoint.size() == model.state.tensors().size() - 2 ? Status() : internal_error("missing");
  }));
}

}  // namespace
}  // namespace distckpt

namespace distckpt {
namespace {

using testing::FormatModel;
using testing::TempDir;

CheckpointConfig exception_config(const std::string& dir) {
  CheckpointConfig c;
  c.directory = dir;
  c.prefix = "run";
  c.save_every_steps = 5;
  c.exception_save = true;
  return c;
}

TEST(ExceptionSave, AnExceptionOnEveryRankSavesTheLastStepAndIsRethrown) {
  TempDir dir;
  expect_all_ok(run_ranks(3, [&](Comm& comm) -> Status {
    FormatModel model(comm.rank(), 3);
    CheckpointConfig c = exception_config(dir.path());
    c.keep_max = 1;  // retention must neither count nor delete for the exception save
    DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, c));
    try {
      m->run([&] {
        for (int64_t s = 1; s <= 20; ++s) {
          auto out = m->step_end(s, 0);
          if (!out.ok()) throw std::runtime_error(out.status().to_string());
          if (s == 8) throw std::runtime_error("loss is NaN");  // a check every rank makes
        }
      });
      return internal_error("run() did not rethrow");
    } catch (const std::runtime_error& e) {
      if (std::string(e.what()) != "loss is NaN") return internal_error(std::string("rethrown: ") + e.what());
    }
    DISTCKPT_ASSIGN_OR_RETURN(StepOutcome out, m->last_exception_save());
    if (!out.saved || out.exception_rank != 0 || out.exception != "loss is NaN" || !out.stop)
      return internal_error("outcome: " + out.save_error.to_string());
    // Finished: later calls fail at once, without communicating.
    if (m->step_end(9, 0).status().code() != StatusCode::kAborted) return internal_error("usable after exception");
    return Status();
  }));
  EXPECT_EQ(names_in(dir.path()), (std::set<std::string>{"run-0_5", "run-0_8_exception"}));
  auto info = read_checkpoint_info(dir.path() + "/run-0_8_exception");
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  EXPECT_EQ(info->step, 8);
  EXPECT_FALSE(info->advances_latest);
  EXPECT_EQ(std::get<std::string>(info->info.at("exception")), "loss is NaN");
  EXPECT_EQ(std::get<int64_t>(info->info.at("exception_rank")), 0);
  // resume() keeps to the periodic saves; the exception checkpoint loads when named.
  expect_all_ok(run_ranks(2, [&](Comm& comm) -> Status {
    FormatModel model(comm.rank(), 2), want(comm.rank(), 2);
    model.zero();
    DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, exception_config(dir.path())));
    DISTCKPT_ASSIGN_OR_RETURN(ResumeResult newest, m->resume());
    if (newest.step != 5) return internal_error("resumed step " + std::to_string(newest.step));
    ResumeOptions named;
    named.target = "run-0_8_exception";
    DISTCKPT_ASSIGN_OR_RETURN(ResumeResult r, m->resume(named));
    if (r.step != 8) return internal_error("named resume");
    return model.buffers == want.buffers ? Status() : internal_error("state differs");
  }));
}

TEST(ExceptionSave, AnExceptionBeforeAnyPeriodicSaveIsNeverResumedImplicitly) {
  TempDir dir;
  expect_all_ok(run_ranks(2, [&](Comm& comm) -> Status {
    FormatModel model(comm.rank(), 2);
    DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, exception_config(dir.path())));
    try {
      m->run([&] {
        for (int64_t s = 1; s <= 3; ++s)
          if (!m->step_end(s, 0).ok()) throw std::logic_error("step_end");
        throw std::runtime_error("diverged");
      });
    } catch (const std::runtime_error&) {
    }
    return m->last_exception_save().ok() && m->last_exception_save()->saved ? Status() : internal_error("not saved");
  }));
  EXPECT_EQ(names_in(dir.path()), (std::set<std::string>{"run-0_3_exception"}));
  expect_all_ok(run_ranks(2, [&](Comm& comm) -> Status {
    FormatModel model(comm.rank(), 2);
    DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, exception_config(dir.path())));
    DISTCKPT_ASSIGN_OR_RETURN(ResumeResult r, m->resume());
    if (r.resumed) return internal_error("resumed the exception save implicitly: " + r.path);
    ResumeOptions by_step;
    by_step.step = 3;  // an explicit request finds it
    DISTCKPT_ASSIGN_OR_RETURN(ResumeResult s, m->resume(by_step));
    return s.resumed && s.step == 3 ? Status() : internal_error("resume by step");
  }));
}

// abort_after_error: an error that leaves a rank's state unusable (the Python layer's
// tensor that cannot be followed) meets the others as an exception does, at the same
// step, and nothing is saved even with exception_save.
TEST(ExceptionSave, AbortAfterErrorMeetsTheOthersAndSavesNothing) {
  TempDir dir;
  std::vector<StepOutcome> seen(3);
  expect_all_ok(run_ranks(3, [&](Comm& comm) -> Status {
    FormatModel model(comm.rank(), 3);
    DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, exception_config(dir.path())));
    for (int64_t s = 1; s <= 6; ++s) DISTCKPT_RETURN_IF_ERROR(m->step_end(s, 0).status());
    if (comm.rank() == 2) {
      DISTCKPT_ASSIGN_OR_RETURN(seen[2], m->abort_after_error("tensor 'w' moved"));
    } else {
      DISTCKPT_ASSIGN_OR_RETURN(seen[static_cast<std::size_t>(comm.rank())], m->step_end(6, 0));
    }
    // Finished on every rank: later calls fail locally, without communicating.
    return m->step_end(7, 0).status().code() == StatusCode::kAborted ? Status() : internal_error("not finished");
  }));
  for (const StepOutcome& out : seen) {
    EXPECT_TRUE(out.stop);
    EXPECT_FALSE(out.saved);
    EXPECT_EQ(out.exception_rank, 2);
    EXPECT_EQ(out.exception, "tensor 'w' moved");
    EXPECT_NE(out.save_error.message().find("cannot be saved"), std::string::npos) << out.save_error.to_string();
  }
  EXPECT_EQ(names_in(dir.path()), (std::set<std::string>{"run-0_5"}));
}

TEST(ExceptionSave, OneRankThrowsWhileTheOthersAreInTheManager) {
  // Rank 1 throws during step 8 while ranks 0 and 2 finish it: their states are a step
  // ahead, so nothing is saved, and every rank learns why.
  TempDir dir;
  std::vector<StepOutcome> seen(3);
  expect_all_ok(run_ranks(3, [&](Comm& comm) -> Status {
    FormatModel model(comm.rank(), 3);
    DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, exception_config(dir.path())));
    bool threw = false;
    try {
      m->run([&] {
        for (int64_t s = 1; s <= 20; ++s) {
          if (s == 8 && comm.rank() == 1) throw std::out_of_range("bad batch index");
          auto out = m->step_end(s, 0);
          if (!out.ok()) throw std::runtime_error(out.status().to_string());
          if (out->stop) {
            seen[static_cast<std::size_t>(comm.rank())] = *out;
            return;
          }
        }
      });
    } catch (const std::out_of_range&) {
      threw = true;
      DISTCKPT_ASSIGN_OR_RETURN(seen[1], m->last_exception_save());
    }
    return threw == (comm.rank() == 1) ? Status() : internal_error("rethrow on the wrong rank");
  }));
  for (const StepOutcome& out : seen) {
    EXPECT_TRUE(out.stop);
    EXPECT_FALSE(out.saved);
    EXPECT_EQ(out.exception_rank, 1);
    EXPECT_EQ(out.exception, "bad batch index");
    EXPECT_EQ(out.save_error.code(), StatusCode::kAborted);
    EXPECT_NE(out.save_error.message().find("different steps (7 to 8)"), std::string::npos) << out.save_error.to_string();
  }
  EXPECT_EQ(names_in(dir.path()), (std::set<std::string>{"run-0_5"}));  // the last good state is untouched

  // Rank 2 throws after step 10's step_end while the others are in end(10): the same
  // step everywhere, so the state is saved.
  TempDir dir2;
  expect_all_ok(run_ranks(3, [&](Comm& comm) -> Status {
    FormatModel model(comm.rank(), 3);
    DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, exception_config(dir2.path())));
    try {
      m->run([&] {
        for (int64_t s = 1; s <= 10; ++s)
          if (!m->step_end(s, 0).ok()) throw std::runtime_error("step_end");
        if (comm.rank() == 2) throw std::runtime_error("evaluation crashed");
        auto last = m->end(10, 0);
        if (!last.ok() || !last->stop || !last->saved || last->exception_rank != 2)
          throw std::logic_error("end() did not report the exception save");
      });
    } catch (const std::logic_error& e) {
      return internal_error(e.what());
    } catch (const std::runtime_error& e) {
      if (comm.rank() != 2) return internal_error(e.what());
    }
    return Status();
  }));
  EXPECT_EQ(names_in(dir2.path()), (std::set<std::string>{"run-0_5", "run-0_10", "run-0_10_exception"}));
}

std::string sha_of(const std::string& path) {
  auto fs = posix_filesystem();
  auto sha = internal_storage::sha256_file(*fs, path);
  EXPECT_TRUE(sha.ok()) << sha.status().to_string();
  return sha.ok() ? *sha : "";
}

TEST(Publish, EndPublishesTheLastAndTheBestAsContentNamedFiles) {
  TempDir dir;
  std::vector<std::string> published;
  expect_all_ok(run_ranks(2, [&](Comm& comm) -> Status {
    FormatModel model(comm.rank(), 2);
    CheckpointConfig c;
    c.directory = dir.path();
    c.prefix = "run";
    c.save_every_steps = 2;
    c.keep_max = 1;
    c.best_metric = "loss";
    c.keep_best = 1;
    c.publish_at_end = true;
    c.publish_only = {"layer", "bias"};
    DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, c));
    const double losses[] = {0, 0.9, 0.5, 0.7, 0.2, 0.6, 0.8, 0.4, 0.3};
    for (int64_t s = 1; s <= 8; ++s) DISTCKPT_RETURN_IF_ERROR(m->step_end(s, 0, {{"loss", losses[s]}}).status());
    DISTCKPT_ASSIGN_OR_RETURN(StepOutcome out, m->end(8, 0, {{"loss", losses[8]}}));
    if (comm.rank() == 0) published = out.published;
    return Status();
  }));
  // Kept: the newest (step 8) and the best loss (step 4, 0.2). Published: both.
  ASSERT_EQ(published.size(), 2u);
  const std::regex name(R"(.*/run-0_(8|4)-([0-9a-f]{8})\.safetensors)");
  for (const auto& p : published) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(p, m, name)) << p;
    EXPECT_EQ(sha_of(p).substr(0, 8), m[2].str());
    auto info = read_checkpoint_info(p);
    ASSERT_TRUE(info.ok()) << info.status().to_string();
    for (const auto& t : info->tensors) EXPECT_TRUE(t.name.rfind("layer", 0) == 0 || t.name == "bias") << t.name;
    EXPECT_FALSE(info->advances_latest);
  }
  EXPECT_NE(published[0], published[1]);
  // A later run resumes from the newest save, never a published file, and retention
  // leaves published files alone.
  expect_all_ok(run_ranks(2, [&](Comm& comm) -> Status {
    FormatModel model(comm.rank(), 2);
    CheckpointConfig c;
    c.directory = dir.path();
    c.prefix = "run";
    c.keep_max = 1;
    DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, c));
    DISTCKPT_ASSIGN_OR_RETURN(ResumeResult r, m->resume());
    if (r.path != dir.path() + "/run-0_8") return internal_error("resumed " + r.path);
    for (int64_t s = 9; s <= 11; ++s) DISTCKPT_RETURN_IF_ERROR(m->step_end(s, 0).status());
    return Status();
  }));
  for (const auto& p : published) EXPECT_TRUE(fs::exists(p)) << p;
  // Without save_last (MMEngine's after_train), only the best is published.
  TempDir other;
  expect_all_ok(run_ranks(2, [&](Comm& comm) -> Status {
    FormatModel model(comm.rank(), 2);
    CheckpointConfig c = base_config(other.path());
    c.save_every_steps = 2;
    c.best_metric = "loss";
    c.publish_at_end = true;
    c.save_last = false;
    DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, c));
    const double losses[] = {0, 0.9, 0.5, 0.7, 0.6};
    for (int64_t s = 1; s <= 4; ++s) DISTCKPT_RETURN_IF_ERROR(m->step_end(s, 0, {{"loss", losses[s]}}).status());
    DISTCKPT_ASSIGN_OR_RETURN(StepOutcome out, m->end(4, 0));
    if (out.published.size() != 1 || out.published[0].find("/run-0_2-") == std::string::npos)
      return internal_error("published " + std::to_string(out.published.size()) +
                            (out.published.empty() ? "" : ": " + out.published[0]));
    return Status();
  }));
}

TEST(Publish, ReproducibleIdempotentAndRefusesBadRequests) {
  TempDir dir;
  expect_all_ok(run_ranks(2, [&](Comm& comm) -> Status {
    FormatModel model(comm.rank(), 2);
    SaveOptions o;
    o.name = "src";
    return save(comm, model.state, dir.path(), o).status();
  }));
  const std::string src = dir.path() + "/src";
  for (Format f : {Format::kSafetensors, Format::kCkpt, Format::kHdf5}) {
    PublishOptions o;
    o.format = f;
    o.directory = dir.path() + "/a";
    auto first = publish_checkpoint(src, o);
    ASSERT_TRUE(first.ok()) << first.status().to_string();
    EXPECT_FALSE(first->already_published);
    EXPECT_EQ(first->sha256, sha_of(first->path));
    EXPECT_EQ(first->dropped.size(), 0u);
    auto again = publish_checkpoint(src, o);  // the same bytes, the same name
    ASSERT_TRUE(again.ok()) << again.status().to_string();
    EXPECT_TRUE(again->already_published);
    EXPECT_EQ(again->path, first->path);
    // Written afresh elsewhere, in another second (HDF5 object times have a resolution
    // of one second): byte-identical.
    std::this_thread::sleep_for(std::chrono::milliseconds(1100));
    o.directory = dir.path() + "/b";
    auto elsewhere = publish_checkpoint(src, o);
    ASSERT_TRUE(elsewhere.ok()) << elsewhere.status().to_string();
    EXPECT_EQ(elsewhere->sha256, first->sha256) << format_name(f);
  }
  // Nothing but the published files (no temporaries left behind).
  EXPECT_EQ(names_in(dir.path() + "/a").size(), 3u);

  PublishOptions only;
  only.only = {"bias", "scale"};
  auto subset = publish_checkpoint(dir.path(), only);  // a root: its newest
  ASSERT_TRUE(subset.ok()) << subset.status().to_string();
  EXPECT_EQ(subset->tensors, (std::vector<std::string>{"bias", "scale"}));
  EXPECT_GT(subset->dropped.size(), 5u);

  PublishOptions typo;
  typo.only = {"bais"};
  EXPECT_EQ(publish_checkpoint(src, typo).status().code(), StatusCode::kInvalidArgument);
  PublishOptions native;
  native.format = Format::kNative;
  EXPECT_EQ(publish_checkpoint(src, native).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(publish_checkpoint(dir.path() + "/missing").status().code(), StatusCode::kNotFound);

  // A different file under the published name is never replaced.
  const std::string taken = subset->path;
  ASSERT_TRUE(fs::remove(taken));
  { std::ofstream(taken) << "not it"; }
  EXPECT_EQ(publish_checkpoint(dir.path(), only).status().code(), StatusCode::kAlreadyExists);

  // A damaged source is refused before anything is written.
  for (const auto& e : fs::directory_iterator(src))
    if (e.path().filename().string().rfind("data-", 0) == 0) {
      std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(3);
      f.put('\x5a');
    }
  PublishOptions fresh;
  fresh.directory = dir.path() + "/c";
  EXPECT_EQ(publish_checkpoint(src, fresh).status().code(), StatusCode::kCorruption);
  EXPECT_FALSE(fs::exists(dir.path() + "/c") && !fs::is_empty(dir.path() + "/c"));
  // No temporary file left behind by any of the failures.
  for (const auto& e : fs::recursive_directory_iterator(dir.path()))
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
}

// ---- async_save: periodic saves on an AsyncCheckpointer ----

// Runs fn on `world` in-process ranks, each with an AsyncCheckpointer over two
// in-process groups of its own (what create() makes from an MPI communicator).
std::vector<std::string> run_async_ranks(int world,
                                         const std::function<Status(Comm&, std::unique_ptr<AsyncCheckpointer>)>& fn) {
  auto fg = internal_comm::make_local_comms(world);
  auto bg = internal_comm::make_local_comms(world);
  return testing::run_ranks(world, [&](Comm& comm) -> Status {
    AsyncOptions small;  // tests stage little; 1 GiB per rank would dominate their time
    small.staging_bytes = 1 << 20;
    small.slab_bytes = 256 << 10;
    const auto r = static_cast<std::size_t>(comm.rank());
    DISTCKPT_ASSIGN_OR_RETURN(auto async, AsyncCheckpointer::create(std::move(fg[r]), std::move(bg[r]), small));
    return fn(comm, std::move(async));
  });
}

CheckpointConfig async_config(const std::string& dir) {
  CheckpointConfig c;
  c.directory = dir;
  c.prefix = "run";
  c.async_save = true;
  return c;
}

std::string show(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += "[" + s + "]";
  return out;
}

// MindSpore's async_save with single files: .ckpt, safetensors and an integrated
// native checkpoint are gathered and written in the background from a copy of each
// rank's slices: the loop changes its buffers right after step_end returns, and every
// checkpoint still holds the state of its step. A per-rank .ckpt set (integrated =
// false) goes the same way.
TEST(AsyncSave, SingleFilesAreGatheredAndWrittenInTheBackground) {
  for (const auto& [format, integrated] : std::vector<std::pair<Format, std::optional<bool>>>{
           {Format::kCkpt, std::nullopt}, {Format::kSafetensors, std::nullopt}, {Format::kNative, true},
           {Format::kCkpt, false}}) {
    const bool per_rank = integrated == false;
    SCOPED_TRACE(std::string(format_name(format)) + (integrated == true ? " integrated" : per_rank ? " per rank" : ""));
    TempDir dir;
    std::vector<std::string> committed;
    auto results = run_async_ranks(2, [&](Comm& comm, std::unique_ptr<AsyncCheckpointer> async) -> Status {
      FormatModel model(comm.rank(), 2, !per_rank);
      CheckpointConfig c = async_config(dir.path());
      c.format = format;
      c.integrated = integrated;
      c.keep_max = 0;
      c.save_last = false;
      DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, c, std::move(async)));
      for (int64_t step = 1; step <= 2; ++step) {
        DISTCKPT_ASSIGN_OR_RETURN(StepOutcome out, m->step_end(step, 0));
        if (!out.in_flight) return internal_error("not in the background");
        model.zero();  // the next step's state, while the save of this one runs
        if (comm.rank() == 0) committed.insert(committed.end(), out.committed.begin(), out.committed.end());
        model = FormatModel(comm.rank(), 2, !per_rank);  // and back: the loaded state must match it
      }
      DISTCKPT_ASSIGN_OR_RETURN(StepOutcome last, m->end(2, 0));
      if (comm.rank() == 0) committed.insert(committed.end(), last.committed.begin(), last.committed.end());
      return Status();
    });
    for (const auto& r : results) EXPECT_EQ(r, "ok");
    ASSERT_EQ(committed.size(), 2u) << show(committed);
    for (const auto& path : committed) {
      EXPECT_EQ(fs::exists(path + "/rank_1/" + fs::path(path).filename().string() + ".ckpt"), per_rank) << path;
      auto verified = verify_checkpoint(path);
      EXPECT_TRUE(verified.ok()) << path << ": " << verified.status().to_string();
      auto all = load_all(path);
      ASSERT_TRUE(all.ok()) << all.status().to_string();
      for (const TensorEntry& e : all->state.tensors()) {
        const auto expected = testing::full_tensor(e.name);
        EXPECT_TRUE(expected.empty() || std::memcmp(e.buffers[0], expected.data(), expected.size()) == 0) << path << " " << e.name;
      }
    }
  }
}

TEST(AsyncSave, RefusedWhereItCannotRun) {
  CheckpointConfig c = async_config("/tmp/x");
  c.async.slab_bytes = 1000;
  EXPECT_NE(c.validate().message().find("async.slab_bytes"), std::string::npos);
  TempDir dir;
  // No MPI communicator to duplicate, and none given: refused on every rank.
  auto results = testing::run_ranks(2, [&](Comm& comm) -> Status {
    FormatModel model(comm.rank(), 2);
    auto m = CheckpointManager::create(comm, model.state, async_config(dir.path()));
    return m.ok() ? internal_error("created") : m.status();
  });
  for (const auto& r : results) EXPECT_NE(r.find("needs an MPI communicator"), std::string::npos) << r;
  // A checkpointer given while async_save is off: refused, not silently unused.
  results = run_async_ranks(2, [&](Comm& comm, std::unique_ptr<AsyncCheckpointer> async) -> Status {
    FormatModel model(comm.rank(), 2);
    CheckpointConfig off = async_config(dir.path());
    off.async_save = false;
    auto m = CheckpointManager::create(comm, model.state, off, std::move(async));
    return m.ok() ? internal_error("created") : m.status();
  });
  for (const auto& r : results) EXPECT_NE(r.find("async_save is off"), std::string::npos) << r;
}

// The save of step 4 is held in the background (its data cannot be fsynced until the
// test lets it): meanwhile the loop goes on, the newest committed checkpoint (step 2)
// stays although keep_max is 1, and the held save completes at the next save.
TEST(AsyncSave, BackgroundSavesCompleteInOrderAndRetentionKeepsTheNewestCommitted) {
  TempDir dir;
  std::atomic<bool> release{false};
  internal_storage::FaultSpec spec;
  spec.hook = [&](const std::string& op, const std::string& path) {
    if (op == "sync" && path.find("run-0_4.tmp-") != std::string::npos && path.find("/data-") != std::string::npos)
      for (int i = 0; i < 20000 && !release.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  };
  auto gated = std::make_shared<internal_storage::FaultFileSystem>(posix_filesystem(), spec);
  std::set<std::string> committed_while_held;
  expect_all_ok(run_async_ranks(2, [&](Comm& comm, std::unique_ptr<AsyncCheckpointer> async) -> Status {
    FormatModel model(comm.rank(), 2);
    CheckpointConfig c = async_config(dir.path());
    c.save_every_steps = 2;
    c.keep_max = 1;
    c.fs = gated;
    DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, c, std::move(async)));
    const std::string d = dir.path() + "/";
    std::vector<std::string> committed;
    for (int64_t step = 1; step <= 6; ++step) {
      DISTCKPT_ASSIGN_OR_RETURN(StepOutcome out, m->step_end(step, 0));
      committed.insert(committed.end(), out.committed.begin(), out.committed.end());
      const std::string at = "step " + std::to_string(step) + ": ";
      if (out.saved != (step % 2 == 0) || out.in_flight != out.saved || !out.save_error.ok())
        return internal_error(at + "saved/in_flight " + out.save_error.to_string());
      if (out.saved && out.path != d + "run-0_" + std::to_string(step)) return internal_error(at + out.path);
      // Save 2 completed at the latest when save 4 started (which waited for it).
      if (step == 4 && committed != std::vector<std::string>{d + "run-0_2"}) return internal_error(at + show(committed));
      if (step == 5) {
        if (!out.committed.empty() || !out.removed.empty()) return internal_error(at + "save 4 is held");
        if (comm.rank() == 0) {
          auto listing = list_checkpoints(dir.path());  // a failure shows as an empty set
          if (listing.ok())
            for (const auto& e : listing->entries)
              if (e.state == EntryState::kCommitted) committed_while_held.insert(e.name);
          release = true;
        }
      }
      if (step == 6 && (out.committed != std::vector<std::string>{d + "run-0_4"} ||
                        out.removed != std::vector<std::string>{"run-0_2"}))
        return internal_error(at + show(out.committed) + " removed " + show(out.removed));
    }
    // end() completes the save in flight (step 6's own): nothing more to save.
    DISTCKPT_ASSIGN_OR_RETURN(StepOutcome last, m->end(6, 0));
    if (last.saved || last.committed != std::vector<std::string>{d + "run-0_6"} ||
        last.removed != std::vector<std::string>{"run-0_4"})
      return internal_error("end: " + show(last.committed) + " removed " + show(last.removed));
    return Status();
  }));
  EXPECT_EQ(committed_while_held, (std::set<std::string>{"run-0_2"}));
  EXPECT_EQ(names_in(dir.path()), (std::set<std::string>{"run-0_6"}));
  std::ifstream stats(dir.path() + "/stats.jsonl");
  int lines = 0;
  for (std::string line; std::getline(stats, line); ++lines) {
    EXPECT_NE(line.find("\"async\":true"), std::string::npos) << line;
    EXPECT_NE(line.find("\"blocking_s\""), std::string::npos) << line;
  }
  EXPECT_EQ(lines, 3);
  // What the background wrote loads at another world size, with a synchronous manager.
  expect_all_ok(testing::run_ranks(3, [&](Comm& comm) -> Status {
    FormatModel model(comm.rank(), 3), want(comm.rank(), 3);
    model.zero();
    CheckpointConfig c = async_config(dir.path());
    c.async_save = false;
    DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, c));
    DISTCKPT_ASSIGN_OR_RETURN(ResumeResult r, m->resume());
    if (!r.resumed || r.step != 6) return internal_error("resume");
    return model.buffers == want.buffers ? Status() : internal_error("state differs");
  }));
}

// A failure in the background writer (an fsync error of rank 1's data file, every save;
// the other ranks' writes succeed) reaches every rank at the next manager call: as that
// call's error (kStop) or in background_error (kContinue).
TEST(AsyncSave, ABackgroundFailureReachesEveryRank) {
  for (OnSaveFailure policy : {OnSaveFailure::kStop, OnSaveFailure::kContinue}) {
    TempDir dir;
    internal_storage::FaultSpec spec;
    spec.fail_sync_if_contains = "data-00001.bin";
    auto faulty = std::make_shared<internal_storage::FaultFileSystem>(posix_filesystem(), spec);
    expect_all_ok(run_async_ranks(3, [&](Comm& comm, std::unique_ptr<AsyncCheckpointer> async) -> Status {
      FormatModel model(comm.rank(), 3);
      CheckpointConfig c = async_config(dir.path());
      c.on_failure = policy;
      c.fs = faulty;
      DISTCKPT_ASSIGN_OR_RETURN(auto m, CheckpointManager::create(comm, model.state, c, std::move(async)));
      DISTCKPT_ASSIGN_OR_RETURN(StepOutcome first, m->step_end(1, 0));  // staged: the failure comes later
      if (!first.in_flight) return internal_error("step 1 not in flight");
      auto second = m->step_end(2, 0);  // waits for save 1 before starting save 2
      if (policy == OnSaveFailure::kStop) {
        if (second.ok()) return internal_error("kStop: a failed background save was not reported");
        return second.status().message().find("run-0_1") != std::string::npos
                   ? Status()
                   : internal_error("kStop: " + second.status().to_string());
      }
      if (!second.ok() || !second->save_error.ok() || second->background_error.ok() || !second->in_flight ||
          second->background_error.message().find("run-0_1") == std::string::npos)
        return internal_error("kContinue: " +
                              (second.ok() ? second->background_error.to_string() : second.status().to_string()));
      // end() completes save 2 (it fails the same way) and reports it; step 2 was saved.
      DISTCKPT_ASSIGN_OR_RETURN(StepOutcome last, m->end(2, 0));
      if (!last.committed.empty() || last.saved || last.background_error.message().find("run-0_2") == std::string::npos)
        return internal_error("kContinue: end: " + last.background_error.to_string());
      return Status();
    }));
    EXPECT_TRUE(names_in(dir.path()).empty());
  }
}

}  // namespace
}  // namespace distckpt
