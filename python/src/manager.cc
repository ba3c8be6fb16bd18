// The manager's bindings: _Manager (CheckpointManager), _Async (AsyncCheckpointer),
// publish and the stop signals.
#include "state.h"

namespace distckpt::python {
namespace {

// The Status a Python exception becomes when it crosses back into C++ (a hook's): the
// package's exception classes keep their codes, anything else is kInvalidArgument. The
// exception is cleared; the Python layer keeps the original to raise it again.
Status status_of_python_error(py::error_already_set& e, const std::string& where) {
  StatusCode code = StatusCode::kInvalidArgument;
  if (e.matches(errors.mismatch)) code = StatusCode::kMismatch;
  else if (e.matches(errors.corruption)) code = StatusCode::kCorruption;
  else if (e.matches(errors.not_found)) code = StatusCode::kNotFound;
  else if (e.matches(errors.auth)) code = StatusCode::kAuthFailed;
  else if (e.matches(errors.base)) code = StatusCode::kIoError;
  return Status(code, where + ": " + e.what());
}

// CheckpointConfig::metadata_handler over the Python layer's adapter (_manager.py's
// _MetadataAdapter: every method present, Caffe2's signatures resolved). Called on rank
// 0's manager thread, with the GIL taken; a Python exception becomes the C++ one the
// manager catches and reports (a warning, or last_epoch's error).
class PyMetadataHandler final : public MetadataHandler {
 public:
  explicit PyMetadataHandler(py::handle adapter) : adapter_(held_under_gil(adapter)) {}
  void set_params(const Params& p) override {
    call([&] {
      (*adapter_).attr("set_params")(p.directory, p.prefix, p.format, p.hosts);
    });
  }
  Status write(int64_t epoch, int64_t step, const std::string& path) override {
    call([&] { (*adapter_).attr("write")(epoch, step, path); });
    return Status();
  }
  Result<std::optional<int64_t>> last_epoch(int64_t user_epoch) override {
    std::optional<int64_t> out;
    call([&] {
      py::object e = (*adapter_).attr("last_epoch")(user_epoch);
      if (!e.is_none()) out = e.cast<int64_t>();
    });
    return out;
  }
  bool cp_accessible() override {
    bool ok = true;
    call([&] { ok = (*adapter_).attr("cp_accessible")().cast<bool>(); });
    return ok;
  }
  void report(const std::string& action, const std::string& path, double seconds) override {
    call([&] { (*adapter_).attr("report")(action, path, seconds); });
  }

 private:
  template <typename F>
  static void call(F&& f) {
    py::gil_scoped_acquire locked;
    try {
      f();
    } catch (py::error_already_set& e) {
      const std::string what = e.what();
      e.restore();
      PyErr_Clear();
      throw std::runtime_error(what);
    }
  }
  std::shared_ptr<py::object> adapter_;
};

// A CheckpointConfig from canonical names (the Python layer resolves MindSpore's and
// MMEngine's aliases and refuses unknown ones); validated by the manager.
CheckpointConfig make_config(const py::dict& kw) {
  CheckpointConfig c;
  for (auto item : kw) {
    const std::string k = item.first.cast<std::string>();
    py::handle v = item.second;
    auto rule_of = [](const std::string& r) {
      if (r == "greater") return CompareRule::kGreater;
      if (r == "less") return CompareRule::kLess;
      if (r == "auto") return CompareRule::kAuto;
      throw py::value_error("rule: 'greater', 'less' or 'auto', not '" + r + "'");
    };
    try {
      if (k == "directory") c.directory = v.cast<std::string>();
      else if (k == "out_dir") c.out_dir = v.cast<std::string>();
      else if (k == "prefix") c.prefix = v.cast<std::string>();
      else if (k == "name_template") c.name_template = v.cast<std::string>();
      else if (k == "filename_tmpl") c.filename_tmpl = v.cast<std::string>();
      else if (k == "save_every_steps") c.save_every_steps = v.cast<int64_t>();
      else if (k == "save_every_seconds") c.save_every_seconds = v.cast<double>();
      else if (k == "save_every_epochs") c.save_every_epochs = v.cast<int64_t>();
      else if (k == "by_epoch") c.by_epoch = v.cast<bool>();
      else if (k == "save_begin") c.save_begin = v.cast<int64_t>();
      else if (k == "save_last") c.save_last = v.cast<bool>();
      else if (k == "keep_max") c.keep_max = v.cast<int>();
      else if (k == "keep_per_n_minutes") c.keep_per_n_minutes = v.cast<double>();
      else if (k == "best_metric") c.best_metric = v.cast<std::string>();
      else if (k == "keep_best") c.keep_best = v.cast<int>();
      else if (k == "save_best") c.save_best = v.cast<std::vector<std::string>>();
      else if (k == "rule") {
        c.save_best_rules.clear();
        for (const auto& r : v.cast<std::vector<std::string>>()) c.save_best_rules.push_back(rule_of(r));
      } else if (k == "greater_keys") c.greater_keys = v.cast<std::vector<std::string>>();
      else if (k == "less_keys") c.less_keys = v.cast<std::vector<std::string>>();
      else if (k == "format") c.format = format_from(v.cast<std::string>());
      else if (k == "integrated") c.integrated = v.cast<bool>();
      else if (k == "remove_redundancy") c.remove_redundancy = v.cast<bool>();
      else if (k == "ckpt_crc_footer") c.ckpt_crc_footer = v.cast<bool>();
      else if (k == "allow_unchecked") c.load.allow_unchecked = v.cast<bool>();
      else if (k == "upload_at_end") c.upload_at_end = v.cast<bool>();
      else if (k == "steps_per_epoch") c.steps_per_epoch = v.cast<int64_t>();
      else if (k == "save_at_start") c.save_at_start = v.cast<bool>();
      else if (k == "publish_at_end") c.publish_at_end = v.cast<bool>();
      else if (k == "save_prefixes") c.save_prefixes = v.cast<std::vector<std::string>>();
      else if (k == "best_prefixes") c.best_prefixes = v.cast<std::vector<std::string>>();
      else if (k == "regular_at_best") c.regular_at_best = v.cast<bool>();
      else if (k == "publish_only") c.publish_only = v.cast<std::vector<std::string>>();
      else if (k == "publish_format") c.publish_format = format_from(v.cast<std::string>());
      else if (k == "metadata_handler") c.metadata_handler = std::make_shared<PyMetadataHandler>(v);
      else if (k == "fsync") c.fsync = v.cast<bool>();
      else if (k == "async_save") c.async_save = v.cast<bool>();
      else if (k == "incremental") c.incremental = v.cast<bool>();
      else if (k == "exception_save") c.exception_save = v.cast<bool>();
      else if (k == "job_id") c.job_id = v.cast<std::string>();
      else if (k == "on_failure") {
        const std::string f = v.cast<std::string>();
        if (f != "stop" && f != "continue") throw py::value_error("on_failure: 'stop' or 'continue', not '" + f + "'");
        c.on_failure = f == "stop" ? OnSaveFailure::kStop : OnSaveFailure::kContinue;
      } else if (k == "enc_key") {
        c.encryption.key = key_from(py::reinterpret_borrow<py::object>(v));
      } else if (k == "enc_mode") {
        auto mode = encryption_mode_from_name(v.cast<std::string>());
        if (!mode) throw py::value_error("enc_mode: 'AES-GCM', 'AES-CBC' or 'SM4-CBC'");
        c.encryption.mode = *mode;
      } else if (k == "append_info") {
        for (auto kv : v.cast<py::dict>()) {
          const std::string key = kv.first.cast<std::string>();
          c.append_info[key] = to_info_value(key, kv.second);
        }
      } else if (k == "local_dir") c.local.dir = v.cast<std::string>();
      else if (k == "redundancy") c.local.redundancy = v.cast<std::string>();
      else if (k == "local_every_steps") c.local_every_steps = v.cast<int64_t>();
      else if (k == "global_every") c.global_every = v.cast<int>();
      else if (k == "keep_local") c.keep_local = v.cast<int>();
      else if (k == "keep_global") c.keep_global = v.cast<int>();
      else if (k == "upload_command") c.upload_command = v.cast<std::vector<std::string>>();
      else if (k == "upload_queue") c.upload_queue = v.cast<int>();
      else if (k == "upload_wait_s") c.upload_wait_s = v.cast<double>();
      else if (k == "upload") {
        // The hook runs on the uploader's thread: it takes the GIL; an exception is printed
        // with its traceback and counts as a failed upload, never raised. The Python
        // object is released under the GIL, whichever thread drops the last copy.
        std::shared_ptr<py::object> hook = held_under_gil(v);
        c.upload = [hook](const std::string& path) -> Status {
          py::gil_scoped_acquire locked;
          try {
            (*hook)(path);
            return Status();
          } catch (py::error_already_set& e) {
            const std::string what = e.what();
            e.restore();
            PyErr_Print();  // the traceback, on stderr
            return io_error("upload hook for '" + path + "' raised: " + what);
          }
        };
      } else throw py::type_error("CheckpointManager: unknown option '" + k + "'");
    } catch (const py::cast_error&) {  // pybind11's own message names neither option nor type
      type_error("CheckpointManager: option '" + k + "': a value of the wrong type (" +
                 std::string(Py_TYPE(v.ptr())->tp_name) + " " + std::string(py::repr(v)).substr(0, 80) + ")");
    }
  }
  return c;
}

py::dict outcome_dict(const StepOutcome& o) {
  py::dict d;
  d["saved"] = o.saved;
  d["path"] = o.path;
  d["in_flight"] = o.in_flight;
  d["committed"] = o.committed;
  d["removed"] = o.removed;
  d["stop"] = o.stop;
  d["save_error"] = o.save_error.ok() ? py::object(py::none()) : py::object(py::str(o.save_error.to_string()));
  d["best"] = o.best;
  d["tier"] = o.tier;
  d["drained"] = o.drained;
  d["exception_rank"] = o.exception_rank;
  d["exception"] = o.exception;
  d["skipped"] = o.skipped;
  d["background_error"] =
      o.background_error.ok() ? py::object(py::none()) : py::object(py::str(o.background_error.to_string()));
  d["published"] = o.published;
  d["uploaded"] = o.uploaded;
  d["upload_errors"] = o.upload_errors;
  d["drain_error"] = o.drain_error.ok() ? py::object(py::none()) : py::object(py::str(o.drain_error.to_string()));
  return d;
}

class PyManager {
 public:
  // `before_save`: None, or a callable run (with the GIL) before each save the manager
  // makes (CheckpointConfig::before_save; distckpt.torch refills the state dict there).
  PyManager(py::object comm, py::object state, const py::dict& config, py::object before_save)
      : comm_(comm), state_(state) {
    PyComm& pc = comm.cast<PyComm&>();
    PyStateDict& ps = state.cast<PyStateDict&>();
    Comm& native_comm = pc.get();
    CheckpointConfig c;
    agreed_arguments(native_comm, [&] {
      py::dict rest;
      for (auto item : config) {
        if (item.first.cast<std::string>() == "saved_network") {
          saved_network_ = py::reinterpret_borrow<py::object>(item.second);
          PyStateDict& network = saved_network_.cast<PyStateDict&>();
          if (network.get().rank() != ps.get().rank())
            throw py::value_error("CheckpointManager: saved_network was built for another rank");
        } else {
          rest[item.first] = item.second;
        }
      }
      c = make_config(rest);
      if (!saved_network_.is_none()) c.saved_network = &saved_network_.cast<PyStateDict&>().get();
    });
    if (!before_save.is_none()) {
      std::shared_ptr<py::object> hook = held_under_gil(before_save);
      c.before_save = [hook](const std::vector<std::string>& prefixes) -> Status {
        py::gil_scoped_acquire locked;
        try {
          (*hook)(prefixes);
          return Status();
        } catch (py::error_already_set& e) {
          return status_of_python_error(e, "the state's walk");
        }
      };
    }
    // Over MPI the manager makes its own AsyncCheckpointer from the MPI communicator; a
    // torch Comm has none, so it is made here, over two new gloo groups. Every rank makes
    // them when any asks (new_group must be called alike everywhere); a rank without
    // async_save then refuses it in create(), on every rank.
    std::unique_ptr<AsyncCheckpointer> async;
    if (pc.over_torch() &&
        without_gil([&] { return native_comm.allreduce_one(c.async_save ? 1 : 0, ReduceOp::kMax); }) != 0)
      async = take(pc.make_async(c.async));
    manager_ = take(without_gil(
        [&] { return CheckpointManager::create(native_comm, ps.get(), std::move(c), std::move(async)); }));
    pc.add_user();
  }
  ~PyManager() { close(); }
  CheckpointManager& get() {
    if (!manager_) throw py::value_error("this CheckpointManager was closed");
    return *manager_;
  }
  void refresh_or_abort() {
    try {
      state_.cast<PyStateDict&>().refresh();
      if (!saved_network_.is_none()) saved_network_.cast<PyStateDict&>().refresh();
    } catch (const std::exception& e) {
      abort_after_error(e.what());
      throw;
    }
  }
  template <typename F>
  py::dict step(F&& call) {
    CheckpointManager& self = get();
    // No agreement of our own here: a rank that threw in the loop meets the others in the
    // manager's step synchronization (save_after_exception). A tensor that cannot be
    // followed on this rank ends the manager on every rank, nothing saved
    // (abort_after_error: the others' call returns stop naming this rank), and raises.
    refresh_or_abort();
    Result<StepOutcome> r = without_gil([&] { return call(self); });
    return outcome_dict(take(std::move(r)));
  }
  // Metrics in the caller's order (a dict's), for save_best "auto": the first reported.
  using Ordered = std::vector<std::pair<std::string, double>>;
  py::dict step_end(int64_t step_, int64_t epoch, const Ordered& metrics, bool epoch_end) {
    return step([&](CheckpointManager& m) { return m.step_end(step_, epoch, CheckpointManager::MetricsInOrder{metrics}, epoch_end); });
  }
  py::dict end(int64_t step_, int64_t epoch, const Ordered& metrics, bool epoch_end) {
    return step([&](CheckpointManager& m) { return m.end(step_, epoch, CheckpointManager::MetricsInOrder{metrics}, epoch_end); });
  }
  py::dict save_now(int64_t step_, int64_t epoch, const Ordered& metrics, const std::string& suffix) {
    return step([&](CheckpointManager& m) { return m.save_now(step_, epoch, CheckpointManager::MetricsInOrder{metrics}, suffix); });
  }
  py::dict save_after_exception(const std::string& what) {
    CheckpointManager& self = get();
    // A tensor that cannot be followed any more: its old address may be freed memory, so
    // the exception is met without a save.
    try {
      state_.cast<PyStateDict&>().refresh();
    } catch (const std::exception& e) {
      const std::string why = what + "; and " + e.what() + ": nothing saved";
      Result<StepOutcome> r = without_gil([&] { return self.abort_after_error(why); });
      return outcome_dict(take(std::move(r)));
    }
    Result<StepOutcome> r = without_gil([&] { return self.save_after_exception(what); });
    return outcome_dict(take(std::move(r)));
  }
  // `load`: None, or a callable load(path) -> dict (step, epoch, info, missing,
  // unexpected, bytes_read, load_s) that loads the chosen checkpoint instead of the
  // state dict's load (ResumeOptions::load; distckpt.torch's load).
  py::dict resume(const std::string& target, int64_t step_, int64_t epoch, bool strict, bool fall_back, bool verify,
                  const std::vector<std::string>& only, bool allow_unexpected, py::object load,
                  const std::map<std::string, std::string>& rename, const std::map<std::string, std::string>& prefix_map,
                  const std::vector<std::string>& specify_prefix, const std::vector<std::string>& filter_prefix,
                  const py::object& choice_func, std::optional<bool> allow_unchecked) {
    PyStateDict& ps = state_.cast<PyStateDict&>();
    CheckpointManager* manager = nullptr;
    agreed_arguments(comm_.cast<PyComm&>().get(), [&] {
      manager = &get();  // closed on one rank only: the others must not resume alone
      ps.refresh();
      if (!ps.readonly().empty())
        type_error("resume: tensor '" + ps.readonly().front() + "' is read-only (a resume writes into every tensor)");
    });
    ResumeOptions o;
    o.target = target;
    o.step = step_;
    o.epoch = epoch;
    o.strict = strict;
    o.fall_back_to_previous = fall_back;
    o.verify = verify;
    o.only = only;
    o.allow_unexpected = allow_unexpected;
    if (!load.is_none()) o.load = python_loader(load);
    LoadOptions names;  // load()'s conversions of the same arguments
    set_name_options(names, rename, prefix_map, specify_prefix, filter_prefix, choice_func);
    o.specify_prefix = std::move(names.specify_prefix);
    o.filter_prefix = std::move(names.filter_prefix);
    o.choice_func = std::move(names.choice_func);
    o.rename = std::move(names.rename);
    o.rename_func = std::move(names.rename_func);
    o.allow_unchecked = allow_unchecked;
    Result<ResumeResult> r = without_gil([&] { return manager->resume(o); });
    ResumeResult rr = take(std::move(r));
    py::dict d;
    d["resumed"] = rr.resumed;
    d["path"] = rr.path;
    d["step"] = rr.step;
    d["epoch"] = rr.epoch;
    d["info"] = info_dict(rr.info);
    d["missing_in_checkpoint"] = rr.missing_in_checkpoint;
    d["unexpected_in_checkpoint"] = rr.unexpected_in_checkpoint;
    d["filtered_out"] = rr.filtered_out;
    d["skipped"] = rr.skipped;
    d["saved_at_start"] = rr.saved_at_start;
    return d;
  }
  static std::function<Result<LoadResult>(const std::string&, const LoadOptions&)> python_loader(py::handle load) {
    std::shared_ptr<py::object> hook = held_under_gil(load);
    return [hook](const std::string& path, const LoadOptions&) -> Result<LoadResult> {
      py::gil_scoped_acquire locked;
      try {
        py::dict d = (*hook)(path);
        LoadResult l;
        l.step = d["step"].cast<int64_t>();
        l.epoch = d["epoch"].cast<int64_t>();
        for (auto item : d["info"].cast<py::dict>()) {
          const std::string k = item.first.cast<std::string>();
          l.info[k] = to_info_value(k, item.second);
        }
        l.missing_in_checkpoint = d["missing"].cast<std::vector<std::string>>();
        l.unexpected_in_checkpoint = d["unexpected"].cast<std::vector<std::string>>();
        l.bytes_read = d["bytes_read"].cast<uint64_t>();
        l.load_s = d["load_s"].cast<double>();
        return l;
      } catch (py::error_already_set& e) {
        return status_of_python_error(e, "resume's load of '" + path + "'");
      } catch (const std::exception& e) {  // a reply of the wrong shape (pybind11's cast_error)
        return internal_error("resume's load of '" + path + "': " + e.what());
      }
    };
  }
  std::string best_checkpoint(const std::string& metric) {
    Result<std::string> r = without_gil([&, &self = get()] { return self.best_checkpoint(metric); });
    return take(std::move(r));
  }
  std::string publish(const std::string& target) {
    Result<std::string> r = without_gil([&, &self = get()] { return self.publish(target); });
    return take(std::move(r));
  }
  std::string series_prefix() { return get().series_prefix(); }
  // A step call cannot go on on this rank (a tensor that cannot be followed, or arguments
  // that failed the Python side's checks): the manager ends on every rank; the caller raises.
  void abort_after_error(const std::string& what) {
    CheckpointManager& self = get();
    (void)without_gil([&] { return self.abort_after_error(what); });
  }
  void close() {
    if (!manager_) return;
    {
      // Its destructor waits for a save in flight and for uploads, which may need the GIL.
      py::gil_scoped_release unlocked;
      manager_.reset();
    }
    comm_.cast<PyComm&>().drop_user();
  }
  bool closed() const { return !manager_; }

 private:
  py::object comm_, state_;  // kept alive while the manager uses them
  py::object saved_network_ = py::none();  // CheckpointConfig::saved_network's owner
  std::unique_ptr<CheckpointManager> manager_;
};

class PyAsync {
 public:
  // `comm` stays in use (it agrees on save_async's arguments): it may not be closed first.
  PyAsync(py::object comm, std::size_t staging_bytes, bool refuse_when_busy) : comm_(comm) {
    AsyncOptions o;
    o.staging_bytes = staging_bytes;
    o.refuse_when_busy = refuse_when_busy;
    PyComm& pc = comm.cast<PyComm&>();
    // The Python side's checks failed on a rank: that rank joins here (_agree_argument_error)
    // instead of the others waiting for it in make_async_checkpointer's collectives.
    agreed_arguments(pc.get(), [] {});
    async_ = take(pc.make_async(o));  // collective
    pc.add_user();
  }
  ~PyAsync() { close(); }
  AsyncCheckpointer& get() {
    if (!async_) throw py::value_error("this AsyncCheckpointer was closed");
    return *async_;
  }
  void save_async(PyStateDict& state, const std::string& root, const std::string& name, int64_t step, int64_t epoch,
                  const std::string& format, const py::object& key) {
    SaveOptions o;
    o.name = name;
    o.step = step;
    o.epoch = epoch;
    AsyncCheckpointer* async = nullptr;
    agreed_arguments(comm_.cast<PyComm&>().get(), [&] {
      async = &get();
      state.refresh();
      o.format = format_from(format);
      if (auto k = key_from(key)) o.encryption = {EncryptionMode::kAesGcm, k};
    });
    check(without_gil([&] { return async->save_async(state.get(), root, o); }));
  }
  py::dict wait() {
    Result<SaveResult> r = without_gil([&, &self = get()] { return self.wait(); });
    return save_result_dict(take(std::move(r)));
  }
  bool in_flight() { return get().in_flight(); }
  void end() {
    AsyncCheckpointer& async = get();
    check(without_gil([&] { return async.end(); }));
  }
  void close() {
    if (!async_) return;
    {
      py::gil_scoped_release unlocked;
      async_.reset();  // waits for a save in flight
    }
    comm_.cast<PyComm&>().drop_user();
  }
  bool closed() const { return !async_; }

 private:
  py::object comm_;
  std::unique_ptr<AsyncCheckpointer> async_;
};

std::string publish_path(const std::string& src, const std::string& format, const std::vector<std::string>& only,
                         const std::string& directory, const py::object& key) {
  PublishOptions o;
  o.format = format_from(format);
  o.only = only;
  o.directory = directory;
  o.key = key_from(key);
  Result<PublishResult> r = without_gil([&] { return publish_checkpoint(src, o); });
  return take(std::move(r)).path;
}

}  // namespace

void bind_manager(py::module_& m) {
  m.def("_install_signal_handlers", [] { check(CheckpointManager::install_signal_handlers()); });
  m.def("_signal_received", [] { return CheckpointManager::signal_received(); });
  m.def("_clear_signal", [] { CheckpointManager::clear_signal(); });

  py::class_<PyManager>(m, "_Manager")
      .def(py::init<py::object, py::object, const py::dict&, py::object>())
      .def("step_end", &PyManager::step_end)
      .def("end", &PyManager::end)
      .def("save_now", &PyManager::save_now)
      .def("save_after_exception", &PyManager::save_after_exception)
      .def("abort_after_error", &PyManager::abort_after_error)
      .def("resume", &PyManager::resume)
      .def("best_checkpoint", &PyManager::best_checkpoint)
      .def("publish", &PyManager::publish)
      .def("series_prefix", &PyManager::series_prefix)
      .def("close", &PyManager::close)
      .def_property_readonly("closed", &PyManager::closed);

  py::class_<PyAsync>(m, "_Async")
      .def(py::init<py::object, std::size_t, bool>())
      .def("save_async", &PyAsync::save_async)
      .def("wait", &PyAsync::wait)
      .def("in_flight", &PyAsync::in_flight)
      .def("end", &PyAsync::end)
      .def("close", &PyAsync::close)
      .def_property_readonly("closed", &PyAsync::closed);
  m.def("_publish", &publish_path);
}

}  // namespace distckpt::python
