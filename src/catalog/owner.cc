#include "catalog/owner.h"

#include <sys/stat.h>

#include <regex>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "catalog/names.h"
#include "transform/crc32c.h"

namespace distckpt::internal_catalog {

namespace {

std::string read_small(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// Field 22 of /proc/<pid>/stat (after the command, which may hold spaces and parens);
// nullopt when there is no such process, or only its corpse (a zombie not yet reaped:
// state Z or X, field 3).
std::optional<uint64_t> process_start_time(int64_t pid) {
  const std::string stat = read_small("/proc/" + std::to_string(pid) + "/stat");
  const auto close = stat.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream fields(stat.substr(close + 2));
  std::string field;
  for (int i = 3; i <= 22; ++i) {
    if (!(fields >> field)) return std::nullopt;
    if (i == 3 && (field == "Z" || field == "X")) return std::nullopt;
  }
  try {
    return std::stoull(field);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

int64_t now_unix_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

OwnerRecord OwnerRecord::self() {
  OwnerRecord r;
  char host[HOST_NAME_MAX + 1] = {};
  if (::gethostname(host, sizeof(host) - 1) == 0) r.hostname = host;
  r.boot_id = trim(read_small("/proc/sys/kernel/random/boot_id"));
  struct stat st;
  if (::stat("/proc/self/ns/pid", &st) == 0) r.pid_namespace = static_cast<uint64_t>(st.st_ino);
  r.pid = ::getpid();
  r.start_time = process_start_time(r.pid).value_or(0);
  if (const char* job = std::getenv("SLURM_JOB_ID")) r.slurm_job_id = job;
  r.created_unix_ms = now_unix_ms();
  return r;
}

std::string OwnerRecord::to_json() const {
  nlohmann::ordered_json j;
  j["hostname"] = hostname;
  j["boot_id"] = boot_id;
  j["pid_namespace"] = pid_namespace;
  j["pid"] = pid;
  j["start_time"] = start_time;
  j["slurm_job_id"] = slurm_job_id;
  j["created_unix_ms"] = created_unix_ms;
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

Result<OwnerRecord> OwnerRecord::from_json(const std::string& text) {
  const auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return corruption("owner record: not JSON");
  OwnerRecord r;
  try {
    r.hostname = j.at("hostname").get<std::string>();
    r.boot_id = j.at("boot_id").get<std::string>();
    r.pid_namespace = j.at("pid_namespace").get<uint64_t>();
    r.pid = j.at("pid").get<int64_t>();
    r.start_time = j.at("start_time").get<uint64_t>();
    r.slurm_job_id = j.value("slurm_job_id", std::string());
    r.created_unix_ms = j.value("created_unix_ms", int64_t{0});
  } catch (const std::exception& e) {
    return corruption(std::string("owner record: ") + e.what());
  }
  if (r.pid <= 0) return corruption("owner record: pid " + std::to_string(r.pid));
  return r;
}

bool OwnerRecord::is_local() const {
  const OwnerRecord me = self();
  return hostname == me.hostname && boot_id == me.boot_id && !boot_id.empty() && pid_namespace == me.pid_namespace;
}

std::string OwnerRecord::host_tag() const {
  const std::string identity = hostname + "\n" + boot_id + "\n" + std::to_string(pid_namespace);
  char hex[9];
  std::snprintf(hex, sizeof(hex), "%08x", internal_transform::crc32c(identity.data(), identity.size()));
  return hex;
}

std::string owner_suffix() {
  const OwnerRecord me = OwnerRecord::self();
  return ".owner-" + me.host_tag() + "-" + std::to_string(me.pid) + "-" + std::to_string(me.start_time);
}

std::string make_owned_tmp_name(const std::string& dir, const std::string& name) {
  return make_tmp_name(dir, name) + owner_suffix();
}

std::optional<TmpFileOwner> tmp_file_owner(const std::string& entry) {
  static const std::regex owned(
      R"(.*\.tmp-(deleting-)?[0-9a-f]{16}\.owner-([0-9a-f]{8})-([0-9]{1,18})-([0-9]{1,19}))");
  std::smatch m;
  if (!std::regex_match(entry, m, owned)) return std::nullopt;
  TmpFileOwner o;
  o.host_tag = m[2];
  try {
    o.pid = std::stoll(m[3]);
    o.start_time = std::stoull(m[4]);
  } catch (const std::exception&) {  // out of range: not a name we made
    return std::nullopt;
  }
  return o;
}

bool OwnerRecord::local_process_gone() const {
  const auto started = process_start_time(pid);
  return !started || *started != start_time;
}

Status write_owner(FileSystem& fs, const std::string& dir, const OwnerRecord& record, bool sync) {
  if (sync) return write_file_synced(fs, dir + "/" + kOwnerFile, record.to_json());
  DISTCKPT_ASSIGN_OR_RETURN(auto file, fs.open_writable(dir + "/" + kOwnerFile));
  const std::string text = record.to_json();
  DISTCKPT_RETURN_IF_ERROR(file->write_at(text.data(), text.size(), 0));
  return file->close();
}

Result<OwnerRecord> read_owner(FileSystem& fs, const std::string& dir) {
  const std::string path = dir + "/" + kOwnerFile;
  auto text = read_whole_file(fs, path, 64 << 10);
  if (!text.ok()) {
    if (text.status().code() == StatusCode::kNotFound) return not_found("no owner record in '" + dir + "'");
    return text.status();
  }
  auto record = OwnerRecord::from_json(*text);
  if (!record.ok()) return record.status().with_context("'" + path + "'");
  return record;
}

Heartbeat::Heartbeat(std::shared_ptr<FileSystem> fs, std::string dir)
    : owned_fs_(std::move(fs)), fs_(owned_fs_.get()), dir_(std::move(dir)) {
  start();
}

Heartbeat::Heartbeat(FileSystem& fs, std::string dir, double interval_s, std::function<bool()> keep_beating)
    : fs_(&fs), dir_(std::move(dir)), interval_s_(interval_s), keep_beating_(std::move(keep_beating)) {
  start();
}

void Heartbeat::start() {
  beat();
  try {
    thread_ = std::thread([this] {
      std::unique_lock<std::mutex> lock(mu_);
      while (!cv_.wait_for(lock, std::chrono::duration<double>(interval_s_), [this] { return stopping_; })) {
        lock.unlock();
        beat();
        lock.lock();
      }
    });
  } catch (const std::system_error&) {
    // No thread to be had: the heartbeat stays at its first beat (the entry then looks
    // abandoned after the lease to collectors on other hosts, never on this one).
  }
}

Heartbeat::~Heartbeat() { stop(); }

void Heartbeat::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Heartbeat::beat() {
  if (keep_beating_ && !keep_beating_()) return;
  // The count makes every beat's text new, whatever the clock does: a lock's waiter
  // (claims.h) watches the text change.
  const std::string now = std::to_string(now_unix_ms()) + " " + std::to_string(++beats_) + "\n";
  if (auto file = fs_->open_writable(dir_ + "/" + kHeartbeatFile); file.ok()) {
    (void)(*file)->write_at(now.data(), now.size(), 0);
    (void)(*file)->close();
  }
}

Result<int64_t> file_system_now_ns(FileSystem& fs, const std::string& root) {
  const std::string probe = make_owned_tmp_name(root, ".distckpt-clock");
  DISTCKPT_RETURN_IF_ERROR(write_file_synced(fs, probe, "clock\n"));
  auto now = fs.modified_time_ns(probe);
  (void)fs.remove_file(probe);
  return now;
}

}  // namespace distckpt::internal_catalog
