// The HDF5 reader: hdf5_index describes a file through libhdf5, in a program of its own
// (distckpt-hdf5-reader) that isolated_hdf5_index starts and watches, and which finds its
// way back from a moved install (set_hdf5_reader_path).
#include "format/hdf5/hdf5_io.h"

#include <hdf5.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>

#include "base/package.h"
#include "base/strings.h"
#include "base/text.h"
#include "format/describe.h"
#include "format/hdf5/hdf5_footer.h"
#include "format/hdf5/hdf5_lib.h"
#include "format/format.h"
#include "format/metadata_json.h"
#include "format/native/index_codec.h"
#include "format/sequential_writer.h"
#include "layout/region.h"
#include "layout/tiling.h"
#include "transform/crc32c.h"
#include "distckpt/package.h"

namespace distckpt::internal_format {

using namespace hdf5lib;

Result<proto::Index> hdf5_index(const std::string& path, const std::string& file_name) {
  quiet_hdf5();
  const std::string where = "hdf5 '" + path + "'";
  if (H5Fis_hdf5(path.c_str()) <= 0) {
    FILE* f = std::fopen(path.c_str(), "rb");
    if (f == nullptr) return not_found(where + ": no such file");
    std::fclose(f);
    return corruption(where + ": not an HDF5 file HDF5 can open (truncated or damaged?)");
  }
  Id file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!file.ok()) return corruption(where + ": cannot open: " + hdf5_message());
  hsize_t size = 0;
  if (H5Fget_filesize(file.get(), &size) < 0) return corruption(where + ": " + hdf5_message());

  proto::Index index;
  std::optional<proto::Index> meta;
  if (H5Aexists(file.get(), kMetaAttr) > 0) {
    Id attr(H5Aopen(file.get(), kMetaAttr, H5P_DEFAULT), H5Aclose);
    Id type(H5Aget_type(attr.get()), H5Tclose);
    if (H5Tget_class(type.get()) != H5T_STRING || H5Tis_variable_str(type.get()) > 0)
      return corruption(where + ": attribute 'distckpt' is not a fixed-length string");
    const std::size_t n = H5Tget_size(type.get());
    if (n > size) return corruption(where + ": attribute 'distckpt' claims more bytes than the file has");
    std::string json(n, '\0');
    if (H5Aread(attr.get(), type.get(), json.data()) < 0) return corruption(where + ": " + hdf5_message());
    json.resize(json.find('\0') == std::string::npos ? n : json.find('\0'));
    DISTCKPT_ASSIGN_OR_RETURN(meta, parse_metadata_json(json, where + ": attribute 'distckpt'"));
  }
  // Files we write record a CRC32C per dataset (hdf5_metadata_json): all or none.
  std::map<std::string, uint32_t> recorded_crcs;
  if (meta) {
    for (const auto& t : meta->tensors()) {
      if (t.chunks_size() > 1)
        return corruption(where + ": attribute 'distckpt': tensor '" + internal_base::printable(t.name()) + "' has " +
                          std::to_string(t.chunks_size()) + " chunks; a dataset has one");
      if (t.chunks_size() == 1 && !recorded_crcs.emplace(t.name(), t.chunks(0).crc32c()).second)
        return corruption(where + ": attribute 'distckpt' describes tensor '" + internal_base::printable(t.name()) +
                          "' twice");
    }
    if (!recorded_crcs.empty() && recorded_crcs.size() != static_cast<std::size_t>(meta->tensors_size()))
      return corruption(where + ": attribute 'distckpt' records checksums for some tensors only");
  }
  const bool checked = meta && meta->tensors_size() > 0 && !recorded_crcs.empty();
  index = describe_single_file(meta, "hdf5", checked ? "crc32c" : "none", file_name, size);

  VisitState visit;
  if (H5Ovisit2(file.get(), H5_INDEX_NAME, H5_ITER_NATIVE, visit_object, &visit, H5O_INFO_BASIC) < 0)
    return corruption(where + ": cannot list its datasets: " + hdf5_message());
  std::map<std::string, proto::Tensor> found;
  std::vector<std::pair<haddr_t, std::string>> order;
  for (const std::string& name : visit.datasets) {
    const std::string tw = where + ": dataset '" + internal_base::printable(name) + "'";
    Id dset(H5Dopen2(file.get(), name.c_str(), H5P_DEFAULT), H5Dclose);
    if (!dset.ok()) return corruption(tw + ": " + hdf5_message());
    Id type(H5Dget_type(dset.get()), H5Tclose);
    const auto dtype = dtype_of(type.get());
    if (!dtype) return unsupported(tw + ": its element type is not one distckpt reads (little-endian numbers, bool)");
    Id dcpl(H5Dget_create_plist(dset.get()), H5Pclose);
    if (H5Pget_layout(dcpl.get()) != H5D_CONTIGUOUS)
      return unsupported(tw + ": chunked or compact storage (rewrite it contiguous: h5repack -l CONTI)");
    Id space(H5Dget_space(dset.get()), H5Sclose);
    const int rank = H5Sget_simple_extent_ndims(space.get());
    if (rank < 0 || rank > 64) return corruption(tw + ": bad dataspace");
    std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
    H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
    Shape shape(dims.begin(), dims.end());
    const auto count = internal_layout::checked_num_elements(shape);
    if (!count) return corruption(tw + ": its shape overflows");
    const uint64_t bytes = static_cast<uint64_t>(*count) * dtype_size(*dtype);
    const haddr_t offset = H5Dget_offset(dset.get());
    if (bytes > 0 && offset == HADDR_UNDEF) return corruption(tw + ": has no data stored");
    order.emplace_back(bytes > 0 ? offset : 0, name);
    proto::Tensor t = whole_tensor(name, *dtype, shape, bytes > 0 ? offset : 0, bytes);
    if (auto crc = recorded_crcs.find(name); crc != recorded_crcs.end()) t.mutable_chunks(0)->set_crc32c(crc->second);
    found.emplace(name, std::move(t));
  }
  std::sort(order.begin(), order.end());
  std::vector<std::string> names;
  for (const auto& o : order) names.push_back(o.second);
  DISTCKPT_RETURN_IF_ERROR(attach_tensors(index, std::move(found), names, meta, path));
  return index;
}

namespace {

// libhdf5 parses a damaged or hostile file at the risk of crashing or looping (its
// decoders trust what they read). So a separate program, distckpt-hdf5-reader, reads
// the file: its crash, or no answer within kParseSeconds, becomes kCorruption here
// instead of taking the caller (a training job's rank 0, `distckpt ls`) down with it.
//
// It is started with posix_spawn, which execs at once, not fork alone. A forked copy
// of a threaded process inherits every lock another thread held at the fork: with
// ranks as threads, GCC 12's AddressSanitizer allocator hung a child (its fork takes
// no allocator lock), and libhdf5 state another thread was changing, or MPI calls in
// libhdf5's first initialization, hang it too. Nor does a training process of many
// GiB, with memory registered for RDMA, copy its page tables (Open MPI warns against
// fork there).
constexpr int kParseSeconds = 60;
// The request and answer format between this file and the reader program: both sides
// are built from this file, and the reader refuses any other number.
constexpr const char* kReaderProtocol = "3";

// An answer: its length (8 bytes, little-endian), then "I" and the serialized index, or
// "S", the status code's byte and the message.
constexpr std::size_t kAnswerPrefix = 8;

std::string encode_reader_answer(const Result<proto::Index>& index) {
  std::string body = index.ok() ? "I" + index->SerializeAsString()
                                : "S" + std::string(1, static_cast<char>(index.status().code())) + index.status().message();
  const uint64_t length = body.size();
  std::string out(kAnswerPrefix, '\0');
  std::memcpy(out.data(), &length, kAnswerPrefix);
  return out + body;
}

// A program found (not named by the user) is started only if it is the user's or root's
// and no other user may change it: a build tree's path compiled in may no longer be the
// same directory.
bool trusted_program(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || ::access(path.c_str(), X_OK) != 0) return false;
  return (st.st_uid == 0 || st.st_uid == ::geteuid()) && (st.st_mode & S_IWOTH) == 0;
}

// The reader program's path: $DISTCKPT_HDF5_READER; else the one a program built against
// an installed package registered (package.h); else an installed program's own
// (libexec/distckpt/ beside its bin/, wherever the install was moved); else this build
// tree's; else where the install was configured to go.
Result<std::string> hdf5_reader_path(const std::string& where) {
  if (const char* env = std::getenv("DISTCKPT_HDF5_READER"); env != nullptr && *env != '\0') {
    if (::access(env, X_OK) == 0) return std::string(env);
    const int saved_errno = errno;
    return not_found(where + ": DISTCKPT_HDF5_READER='" + env + "' is not an executable program: " +
                     std::strerror(saved_errno));
  }
  std::vector<std::string> candidates;
  if (std::string registered = internal_base::registered_hdf5_reader(); !registered.empty())
    candidates.push_back(std::move(registered));
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n > 0) {
    const std::string program(self, static_cast<std::size_t>(n));
    const std::size_t slash = program.rfind('/');
    if (slash != std::string::npos)
      candidates.push_back(program.substr(0, slash) + "/" + DISTCKPT_HDF5_READER_FROM_BINDIR);
  }
  candidates.push_back(DISTCKPT_HDF5_READER_BUILD_PATH);
  candidates.push_back(DISTCKPT_HDF5_READER_INSTALL_PATH);
  std::string tried;
  for (const std::string& candidate : candidates) {
    if (trusted_program(candidate)) return candidate;
    tried += (tried.empty() ? "" : ", ") + candidate;
  }
  return not_found(where + ": its reader program distckpt-hdf5-reader is at none of " + tried +
                   " (or not executable, or writable by other users; set DISTCKPT_HDF5_READER to where it is)");
}

// Starts the reader with its standard output on `out_fd`, standard input /dev/null and
// no other inherited descriptor beside stderr; no signal ignored or blocked.
Result<pid_t> spawn_reader(const std::string& program, const std::string& path, const std::string& file_name,
                           int out_fd, const std::string& where) {
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  if (::posix_spawn_file_actions_init(&actions) != 0) return io_error(where + ": posix_spawn: out of memory");
  if (::posix_spawnattr_init(&attr) != 0) {
    ::posix_spawn_file_actions_destroy(&actions);
    return io_error(where + ": posix_spawn: out of memory");
  }
  sigset_t none, defaults;
  sigemptyset(&none);
  sigfillset(&defaults);  // every signal the caller ignores is default again there
  int err = ::posix_spawn_file_actions_adddup2(&actions, out_fd, STDOUT_FILENO);
  if (err == 0) err = ::posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  if (err == 0) err = ::posix_spawn_file_actions_addclosefrom_np(&actions, STDERR_FILENO + 1);
  if (err == 0) err = ::posix_spawnattr_setsigmask(&attr, &none);
  if (err == 0) err = ::posix_spawnattr_setsigdefault(&attr, &defaults);
  if (err == 0) err = ::posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  std::vector<char*> argv = {const_cast<char*>("distckpt-hdf5-reader"), const_cast<char*>("--protocol"),
                             const_cast<char*>(kReaderProtocol), const_cast<char*>(path.c_str()),
                             const_cast<char*>(file_name.c_str()), nullptr};
  pid_t child = -1;
  if (err == 0) err = ::posix_spawn(&child, program.c_str(), &actions, &attr, argv.data(), environ);
  ::posix_spawn_file_actions_destroy(&actions);
  ::posix_spawnattr_destroy(&attr);
  if (err != 0) return io_error(where + ": cannot start its reader " + program + ": " + std::strerror(err));
  return child;
}

// The reader's last answer in this process, kept with the identity and change times of
// the file it read: `verify`, `inspect` and a load of one file start the reader once. A
// file changed since (written, truncated, replaced) is read again. One answer, so the
// memory kept is one index.
struct FileVersion {
  std::string path, file_name;
  dev_t dev = 0;
  ino_t ino = 0;
  off_t size = 0;
  int64_t mtime_ns = 0, ctime_ns = 0;
  bool operator==(const FileVersion&) const = default;
};

std::optional<FileVersion> file_version(const std::string& path, const std::string& file_name) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  return FileVersion{path,
                     file_name,
                     st.st_dev,
                     st.st_ino,
                     st.st_size,
                     st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec,
                     st.st_ctim.tv_sec * 1000000000LL + st.st_ctim.tv_nsec};
}

struct LastAnswer {
  std::mutex mu;
  std::optional<FileVersion> version;
  Result<proto::Index> answer = internal_error("no answer yet");
};

LastAnswer& last_answer() {
  static LastAnswer* last = new LastAnswer();  // never destroyed: readers may run at exit
  return *last;
}

Result<proto::Index> spawned_hdf5_index(const std::string& path, const std::string& file_name, bool& answered);

Result<proto::Index> watched_hdf5_index(const std::string& path, const std::string& file_name) {
  const std::optional<FileVersion> before = file_version(path, file_name);
  LastAnswer& last = last_answer();
  if (before) {
    std::lock_guard<std::mutex> lock(last.mu);
    if (last.version == before) return last.answer;
  }
  // Kept: an index, or damage the reader found; not an error that may pass (a missing
  // file, the reader out of memory). Nor the answer for a file changed within the last
  // second, which a write in the same timestamp tick could change unseen.
  bool answered = false;
  Result<proto::Index> answer = spawned_hdf5_index(path, file_name, answered);
  const bool lasting = answer.ok() || answer.status().code() == StatusCode::kCorruption ||
                       answer.status().code() == StatusCode::kUnsupported;
  struct timespec now;
  ::clock_gettime(CLOCK_REALTIME, &now);
  const bool settled =
      before && now.tv_sec * 1000000000LL + now.tv_nsec - std::max(before->mtime_ns, before->ctime_ns) > 1000000000LL;
  if (answered && lasting && settled && file_version(path, file_name) == before) {
    std::lock_guard<std::mutex> lock(last.mu);
    last.version = before;
    last.answer = answer;
  }
  return answer;
}

// One start of the reader. `answered`: the reader answered (an index or the error it
// found), as opposed to crashing, timing out or not starting, which may not repeat.
Result<proto::Index> spawned_hdf5_index(const std::string& path, const std::string& file_name, bool& answered) {
  const std::string where = "hdf5 '" + path + "'";
  DISTCKPT_ASSIGN_OR_RETURN(std::string program, hdf5_reader_path(where));
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return io_error(where + ": pipe: " + std::strerror(errno));
  if (fds[1] <= STDERR_FILENO) {  // a caller without stdin, stdout or stderr: keep clear of them
    const int moved = ::fcntl(fds[1], F_DUPFD_CLOEXEC, STDERR_FILENO + 1);
    const int saved_errno = errno;
    ::close(fds[1]);
    if (moved < 0) {
      ::close(fds[0]);
      return io_error(where + ": fcntl: " + std::strerror(saved_errno));
    }
    fds[1] = moved;
  }
  Result<pid_t> spawned = spawn_reader(program, path, file_name, fds[1], where);
  ::close(fds[1]);
  if (!spawned.ok()) {
    ::close(fds[0]);
    return spawned.status();
  }
  const pid_t child = *spawned;
  // The answer is complete when its length prefix says so, not at end of file: a fork
  // another thread made meanwhile (a data loader's worker) may hold the pipe open.
  std::string in;
  char buf[65536];
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kParseSeconds);
  auto ms_left = [&] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
  };
  auto complete = [&] {
    if (in.size() < kAnswerPrefix) return false;
    uint64_t length = 0;
    std::memcpy(&length, in.data(), kAnswerPrefix);
    return in.size() - kAnswerPrefix >= length;
  };
  bool timed_out = false;
  while (!complete()) {
    const auto left = ms_left();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    struct pollfd p{fds[0], POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(left));
    if (ready <= 0) continue;  // EINTR, or the deadline (checked above)
    const ssize_t n = ::read(fds[0], buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    in.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fds[0]);
  // Reaped within the same deadline (the reader exits right after its answer).
  int wstatus = 0;
  bool reaped = false, gone = false;  // gone: reaped by no one we can ask (SIGCHLD ignored)
  while (!timed_out && !reaped && !gone) {
    const pid_t r = ::waitpid(child, &wstatus, WNOHANG);
    if (r == child) reaped = true;
    else if (r < 0 && errno != EINTR) gone = true;
    else if (ms_left() <= 0) timed_out = true;
    else if (r == 0) ::usleep(1000);
  }
  if (!reaped && !gone) {
    ::kill(child, SIGKILL);
    while (::waitpid(child, &wstatus, 0) < 0 && errno == EINTR) {
    }
  }
  if (timed_out) return corruption(where + ": HDF5 found no end to it in " + std::to_string(kParseSeconds) + " s");
  if (!complete()) {
    if (reaped && WIFSIGNALED(wstatus))
      return corruption(where + ": libhdf5 crashed reading it (signal " + std::to_string(WTERMSIG(wstatus)) +
                        "): a damaged or hostile file");
    if (reaped && WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 2)
      return internal_error(where + ": the reader " + program +
                            " refused the request (exit 2): a reader from another build? (DISTCKPT_HDF5_READER)");
    return corruption(where + ": reading it failed (the reader " + program +
                      (reaped && WIFEXITED(wstatus) ? " exited " + std::to_string(WEXITSTATUS(wstatus))
                                                    : std::string(" ended without an answer")) +
                      ")");
  }
  const std::string_view answer = std::string_view(in).substr(kAnswerPrefix);
  if (answer.size() >= 2 && answer[0] == 'S') {
    const int code = static_cast<unsigned char>(answer[1]);
    static_assert(static_cast<int>(StatusCode::kAborted) == 11, "the last StatusCode: update the check below");
    if (code == 0 || code > static_cast<int>(StatusCode::kAborted))
      return internal_error(where + ": the reader answered an unknown status code " + std::to_string(code));
    answered = true;
    return Status(static_cast<StatusCode>(code), std::string(answer.substr(2)));
  }
  proto::Index index;
  if (answer.empty() || answer[0] != 'I' ||
      !index.ParseFromArray(answer.data() + 1, static_cast<int>(answer.size() - 1)))
    return internal_error(where + ": the reader's answer does not parse");
  answered = true;
  return index;
}

}  // namespace

Result<proto::Index> isolated_hdf5_index(const std::string& path, const std::string& file_name) {
  return watched_hdf5_index(path, file_name);
}

int hdf5_reader_main(int argc, char** argv) {
  if (argc != 5 || std::string_view(argv[1]) != "--protocol") {
    std::fprintf(stderr, "usage: distckpt-hdf5-reader --protocol %s FILE NAME (distckpt starts it; see hdf5_io.h)\n",
                 kReaderProtocol);
    return 2;
  }
  if (std::string_view(argv[2]) != kReaderProtocol) {
    std::fprintf(stderr, "distckpt-hdf5-reader: asked for protocol %s, speaks %s: a reader from another build\n",
                 argv[2], kReaderProtocol);
    return 2;
  }
  // Limits of its own, should its caller be gone: killed with the thread that started
  // it, and by an alarm past the caller's deadline; and the first to go when memory runs
  // out, not the training process beside it.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() == 1) return 3;  // the caller died before the line above
  ::alarm(kParseSeconds + 10);
  if (FILE* oom = std::fopen("/proc/self/oom_score_adj", "w")) {
    std::fputs("1000", oom);
    std::fclose(oom);
  }
  // The answer goes to the pipe alone (a descriptor above stderr), and whatever a library
  // prints to stderr, which is /dev/null if the caller had none.
  if (::fcntl(STDERR_FILENO, F_GETFD) < 0 && ::open("/dev/null", O_WRONLY) != STDERR_FILENO) return 3;
  const int answer_fd = ::fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, STDERR_FILENO + 1);
  if (answer_fd < 0 || ::dup2(STDERR_FILENO, STDOUT_FILENO) < 0) return 3;
  H5PLset_loading_state(0);  // no filter plugin is loaded for a file's sake
  const std::string out = encode_reader_answer(hdf5_index(argv[3], argv[4]));
  for (std::size_t done = 0; done < out.size();) {
    const ssize_t w = ::write(answer_fd, out.data() + done, out.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return 3;
    done += static_cast<std::size_t>(w);
  }
  // No exit-time work after the answer is out (libhdf5's teardown of what a hostile file
  // built), so that the exit status is the answer's.
  ::_exit(0);
}

}  // namespace distckpt::internal_format

namespace distckpt {

std::string hdf5_reader_program() {
  auto path = internal_format::hdf5_reader_path("hdf5");
  return path.ok() ? *path : std::string();
}

}  // namespace distckpt
