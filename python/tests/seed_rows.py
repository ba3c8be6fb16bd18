"""The seeds' options and behaviours, row by row: what distckpt calls each, whether it is
exact (the seed's semantics, defaults included, from C++ and from Python under the seed's
preset), differs (and how), or is refused (and why). test_seed_table.py checks every row
against the package and renders docs/seeds.md from them:

    python3 python/tests/seed_rows.py > docs/seeds.md

Each row's check is one of:
    ("accepts", preset, kwargs)                 the preset's manager is created with kwargs
    ("refuses", preset, kwargs, error, text)    creating it raises `error` matching `text`
    ("load", names)                             distckpt.load and CheckpointManager.resume take them
    ("load_lacks", name)                        distckpt.load has no such argument (refused: TypeError)
    ("test", path, name)                        that file defines a test of that name (gtest TEST or
                                                pytest function), which CI runs
A preset is "mindspore", "mmengine", "plain" (distckpt.CheckpointManager) or "torch-mmengine"
(distckpt.torch.CheckpointManager.mmengine).
"""
MS, MSL, MM, C2 = ("MindSpore CheckpointConfig / ModelCheckpoint", "MindSpore load_checkpoint",
                   "MMEngine CheckpointHook", "Caffe2 checkpoint.py (CheckpointManager, JobRunner)")

# The seeds' parameter lists, as their signatures give them (the walk covers every name).
SEED_PARAMETERS = {
    MS: ["save_checkpoint_steps", "save_checkpoint_seconds", "keep_checkpoint_max", "keep_checkpoint_per_n_minutes",
         "integrated_save", "async_save", "saved_network", "append_info", "enc_key", "enc_mode", "exception_save",
         "crc_check", "remove_redundancy", "format", "**kwargs", "prefix", "directory", "config"],
    MSL: ["ckpt_file_name", "net", "strict_load", "filter_prefix", "dec_key", "dec_mode", "specify_prefix",
          "choice_func", "crc_check", "remove_redundancy", "format"],
    MM: ["interval", "by_epoch", "save_optimizer", "save_param_scheduler", "out_dir", "max_keep_ckpts", "save_last",
         "save_best", "rule", "greater_keys", "less_keys", "file_client_args", "filename_tmpl", "backend_args",
         "published_keys", "save_begin", "**kwargs"],
    C2: ["db_prefix", "node_name", "db_type", "metadata_handler", "job", "checkpoint_manager", "resume_from_epoch",
         "upload_task_group_builder"],
}

T = "tests/manager_local_test.cc"
S = "tests/manager_seeds_test.cc"
PY = "python/tests/test_seed_manager.py"
PM = "python/tests/test_manager.py"

ROWS = [
    # ---- MindSpore CheckpointConfig and ModelCheckpoint ----
    (MS, "save_checkpoint_steps", "save_every_steps", "differs",
     "a save at each multiple of N counted from save_begin; MindSpore counts N from its last save: the same saves "
     "when step_end sees every step, others when a loop reports every k-th step and k does not divide N",
     ("accepts", "mindspore", {"save_checkpoint_steps": 3})),
    (MS, "save_checkpoint_seconds", "save_every_seconds", "exact",
     "more than N seconds since the last save was decided, on rank 0's clock for every rank; steps win when both "
     "are set",
     ("accepts", "mindspore", {"save_checkpoint_steps": 0, "save_checkpoint_seconds": 30})),
    (MS, "keep_checkpoint_max", "keep_max", "differs",
     "only this run's series is counted (MindSpore counts every file starting with the prefix, prefix_1's too); "
     "0 with keep_checkpoint_per_n_minutes 0 keeps 1 in the Python preset, as MindSpore, every checkpoint in "
     "C++",
     ("accepts", "mindspore", {"keep_checkpoint_max": 0, "keep_checkpoint_per_n_minutes": 0})),
    (MS, "keep_checkpoint_per_n_minutes", "keep_per_n_minutes", "exact",
     "MindSpore's window replayed: the previous save's start in memory, commit times as mtimes, a strict <",
     ("test", T, "KeepPerNMinutesReplaysMindSporesWindow")),
    (MS, "integrated_save", "integrated", "differs",
     "False with .ckpt writes MindSpore's per-rank set (NAME/rank_<r>/NAME.ckpt) without a strategy file, so "
     "MindSpore's merge tools cannot merge it; False with safetensors is refused",
     ("accepts", "mindspore", {"integrated_save": True})),
    (MS, "async_save", "async_save", "differs",
     "True and 'thread' save in the background; 'process' is refused (ValueError): the writer threads run "
     "without the GIL, and a process would copy the state once more",
     ("refuses", "mindspore", {"async_save": "process"}, ValueError, "process.*not supported")),
    (MS, "saved_network", "saved_network", "differs",
     "a StateDict of the same rank (MindSpore: a Cell); resume still loads the managed state",
     ("accepts", "mindspore", {"saved_network": "STATE"})),
    (MS, "append_info", "append_info", "differs",
     "'epoch_num' and 'step_num' are stored in every checkpoint whether listed or not; values are int, float, "
     "bool or str (no Tensor or Parameter)",
     ("accepts", "mindspore", {"append_info": ["epoch_num", "step_num", {"lr": 0.1}]})),
    (MS, "enc_key", "enc_key", "exact",
     "a .ckpt is encrypted whole in MindSpore 2.x's framing, which MindSpore's load_checkpoint(dec_key=...) "
     "decrypts (a native checkpoint: chunk by chunk, distckpt's own)",
     ("accepts", "mindspore", {"enc_key": b"k" * 16})),
    (MS, "enc_mode", "enc_mode", "exact",
     "AES-GCM, AES-CBC and SM4-CBC; with crc_check on a .ckpt refused (ValueError), as MindSpore",
     ("refuses", "mindspore", {"enc_key": b"k" * 16, "enc_mode": "AES-CBC", "crc_check": True}, ValueError,
      "mutually exclusive")),
    (MS, "exception_save", "exception_save + run()", "differs",
     "saved only when every rank's state is at the same step; the save does not move latest (resume takes it "
     "only when named)",
     ("accepts", "mindspore", {"exception_save": True})),
    (MS, "crc_check", "ckpt_crc_footer", "exact",
     "off in the preset, as MindSpore; the plain constructor writes the footer",
     ("accepts", "mindspore", {"crc_check": True})),
    (MS, "remove_redundancy", "remove_redundancy", "exact",
     "off in the preset, as MindSpore; the plain constructor writes each distinct slice once",
     ("accepts", "mindspore", {"remove_redundancy": True})),
    (MS, "format", "format", "exact", "'ckpt' (the preset's) and 'safetensors'; also 'native' and 'hdf5'",
     ("accepts", "mindspore", {"format": "safetensors"})),
    (MS, "**kwargs", "(none)", "refused", "an unknown name is a TypeError naming it",
     ("refuses", "mindspore", {"save_checkpoint_stepz": 1}, TypeError, "save_checkpoint_stepz")),
    (MS, "prefix", "prefix", "differs",
     "'CKP' in the preset; a second run in the same directory takes the first free prefix_N (MindSpore renames "
     "to the largest N + 1)",
     ("accepts", "mindspore", {"prefix": "LeNet5"})),
    (MS, "directory", "directory", "exact", "None is the current directory in the preset",
     ("accepts", "mindspore", {})),
    (MS, "config", "the preset's keyword arguments", "exact",
     "CheckpointConfig's options are passed to CheckpointManager.mindspore directly",
     ("accepts", "mindspore", {"keep_checkpoint_max": 2})),
    (MS, "ModelCheckpoint's saves (a step saved once, the end forced)", "step_end, end", "exact",
     "a second step_end of the same step saves nothing; end saves the last state unless just saved",
     ("test", PM, "test_step_end_twice_for_one_step_saves_once")),
    (MS, "every save and keep policy 0", "CheckpointManager.mindspore (Python)", "differs",
     "a ValueError in the Python preset, as CheckpointConfig raises; C++ validate() accepts it while save_last is "
     "on",
     ("refuses", "mindspore", {"save_checkpoint_steps": 0, "keep_checkpoint_max": 0}, ValueError, "all None or 0")),
    # ---- MindSpore load_checkpoint ----
    (MSL, "ckpt_file_name", "path", "exact", "a checkpoint or a root (its newest)", ("load", ["path"])),
    (MSL, "net", "state", "exact", "a StateDict (distckpt.torch: an application state)", ("load", ["state"])),
    (MSL, "strict_load", "strict", "differs",
     "strict=True by default (MindSpore: False) refuses missing tensors; no name-suffix matching",
     ("load", ["strict"])),
    (MSL, "filter_prefix", "filter_prefix", "exact", "also distckpt.CheckpointManager.resume() (not distckpt.torch's)",
     ("load", ["filter_prefix"])),
    (MSL, "specify_prefix", "specify_prefix", "exact", "also distckpt.CheckpointManager.resume() (not distckpt.torch's)",
     ("load", ["specify_prefix"])),
    (MSL, "choice_func", "choice_func", "exact",
     "called on every rank; also distckpt.CheckpointManager.resume() (not distckpt.torch's)", ("load", ["choice_func"])),
    (MSL, "dec_key", "key", "exact", "load's key; the manager's enc_key", ("load", ["key"])),
    (MSL, "dec_mode", "(read from the file)", "refused", "the mode is recorded in the checkpoint: nothing to pass",
     ("load_lacks", "dec_mode")),
    (MSL, "crc_check", "allow_unchecked", "differs",
     "every checksum a file carries is checked always; a .ckpt without any (MindSpore's default) loads with a "
     "warning unless allow_unchecked=False (crc_check=True); every .ckpt distckpt writes carries checksums",
     ("load", ["allow_unchecked"])),
    (MSL, "remove_redundancy", "(read from the file)", "refused",
     "a checkpoint saved without redundancy loads onto any layout: nothing to pass",
     ("load_lacks", "remove_redundancy")),
    (MSL, "format", "(read from the file)", "refused", "the format is detected from the file",
     ("load_lacks", "format")),
    # ---- MMEngine CheckpointHook ----
    (MM, "interval", "save_every_steps", "exact", "-1 (the preset's) saves nothing periodically; counts epochs "
     "with by_epoch", ("accepts", "mmengine", {"interval": 2})),
    (MM, "by_epoch", "by_epoch", "exact", "True in the preset; step_end(epoch_end=True) ends an epoch",
     ("accepts", "mmengine", {"by_epoch": False})),
    (MM, "save_optimizer", "save_optimizer (distckpt.torch), save_prefixes", "differs",
     "distckpt.torch's manager leaves optimizers out by type; a StateDict does not say which tensors are an "
     "optimizer's, so False is refused there (use save_prefixes)",
     ("refuses", "mmengine", {"save_optimizer": False}, ValueError, "save_prefixes")),
    (MM, "save_param_scheduler", "save_param_scheduler (distckpt.torch), save_prefixes", "differs",
     "as save_optimizer, for LR schedulers", ("accepts", "torch-mmengine", {"save_param_scheduler": False})),
    (MM, "out_dir", "out_dir", "exact", "out_dir/basename(work_dir)", ("accepts", "mmengine", {"out_dir": "OUT"})),
    (MM, "last_checkpoint file", "latest", "differs",
     "beside the checkpoints (MMEngine: in work_dir, also with out_dir), holding a name, not a path; it moves "
     "forward only, under a lock", ("test", "mpi_tests/checkpoint_mpi_test.cc", "BackToBackSavesMoveLatest")),
    (MM, "max_keep_ckpts", "keep_max", "exact", "-1 (the preset's) keeps all",
     ("accepts", "mmengine", {"max_keep_ckpts": 2})),
    (MM, "save_last", "save_last", "differs",
     "False with no periodic save and no save_best is refused, since nothing would ever be saved (MMEngine "
     "accepts the hook); with save_best it keeps only the bests",
     ("accepts", "mmengine", {"save_last": False, "save_best": "acc"})),
    (MM, "save_best", "save_best", "differs",
     "'auto' is the first metric reported (step_end, end and save_now keep the caller's order); a new best saves a regular checkpoint of its step too "
     "(regular_at_best); distckpt.torch's best leaves optimizers and schedulers out by type, a StateDict's holds "
     "every tensor unless best_prefixes. The best is named with the call's counter, which is MMEngine's "
     "runner.epoch/iter at validation (already advanced past the epoch or iteration it ends)",
     ("accepts", "torch-mmengine", {"save_best": "acc"})),
    (MM, "rule", "rule", "exact", "'greater', 'less' or None, one or one per metric",
     ("accepts", "mmengine", {"save_best": "acc", "rule": "greater"})),
    (MM, "greater_keys", "greater_keys", "differs", "an empty list means the default keys (MMEngine: none)",
     ("accepts", "mmengine", {"save_best": "f1", "greater_keys": ["f1"]})),
    (MM, "less_keys", "less_keys", "differs", "an empty list means the default keys (MMEngine: none)",
     ("accepts", "mmengine", {"save_best": "err", "less_keys": ["err"]})),
    (MM, "file_client_args", "(none)", "refused",
     "None or {} only: checkpoints go to file system paths (a mounted store works; upload copies elsewhere)",
     ("refuses", "mmengine", {"file_client_args": {"backend": "petrel"}}, ValueError, "not supported")),
    (MM, "filename_tmpl", "filename_tmpl", "differs",
     "epoch_{} / iter_{} in the preset; the file's extension is the format's (a native checkpoint is a "
     "directory named without .pth)", ("accepts", "mmengine", {"filename_tmpl": "ep_{}.pth"})),
    (MM, "backend_args", "(none)", "refused", "as file_client_args",
     ("refuses", "mmengine", {"backend_args": {"backend": "local", "x": 1}}, ValueError, "not supported")),
    (MM, "published_keys", "published_keys, publish_only", "differs",
     "the state's top-level keys; the published file is safetensors named -<sha256[:8]>, at end()",
     ("accepts", "mmengine", {"published_keys": ["model"]})),
    (MM, "save_begin", "save_begin", "exact", "", ("accepts", "mmengine", {"save_begin": 3})),
    (MM, "**kwargs", "(none)", "refused", "an unknown name is a TypeError naming it",
     ("refuses", "mmengine", {"intervall": 1}, TypeError, "intervall")),
    (MM, "_save_checkpoint_with_step after a new best", "regular_at_best", "differs",
     "on in the preset, once this run has committed a regular checkpoint (MMEngine's last_ckpt); a step that has "
     "one is never saved again (MMEngine rewrites it to store the best score, which our best copies hold)",
     ("test", S, "MMEngineSavesARegularCheckpointAtEachNewBest")),
    # ---- Caffe2 ----
    (C2, "db_prefix", "directory", "differs", "one collective checkpoint for all nodes, not a database per node",
     ("accepts", "plain", {})),
    (C2, "node_name", "(none)", "refused", "every rank writes its share of one checkpoint: no per-node name",
     ("refuses", "plain", {"node_name": "n0"}, TypeError, "node_name")),
    (C2, "db_type", "format", "differs", "native, ckpt, safetensors, hdf5 (not Caffe2's db types)",
     ("accepts", "plain", {"format": "hdf5"})),
    (C2, "metadata_handler", "metadata_handler", "differs",
     "rank 0's: write(epoch) after each save that ends an epoch, last_epoch(user_epoch) choosing resume's epoch "
     "(None: a fresh start), cp_accessible(None) before each save that moves latest (false: skipped, with a "
     "warning), report(action_name, {path: nanoseconds}), set_params(db_prefix=series, db_type=format, "
     "node_names=hosts, path_prefix=directory, path_type='posix'); missing methods do what the manager does. "
     "Not asked before best or exception saves (Caffe2 has none); a local tier's resume takes no epoch",
     ("test", PY, "test_a_caffe2_metadata_handler_is_called_as_job_runner_calls_it")),
    (C2, "job", "(the training loop)", "refused", "the caller's loop calls step_end; there is no task graph",
     ("refuses", "plain", {"job": "J"}, TypeError, "job")),
    (C2, "checkpoint_manager", "CheckpointManager", "differs",
     "the loop calls the manager (step_end, end, resume) where JobRunner runs its tasks",
     ("test", PM, "test_manager_policies_with_mindspore_and_mmengine_names")),
    (C2, "resume_from_epoch", "resume(epoch=E)", "differs",
     "an epoch without a checkpoint raises NotFoundError listing the epochs that have one",
     ("test", T, "EpochsAsCaffe2JobRunnerUsesThem")),
    (C2, "upload_task_group_builder", "upload, upload_command, upload_at_end", "differs",
     "a callback or a command given each checkpoint's path, not a task group; with upload_at_end once at the "
     "end, as JobRunner does, otherwise after every commit",
     ("accepts", "plain", {"upload_command": ["true"], "upload_at_end": True})),
    (C2, "the epoch-0 checkpoint and one per epoch", "save_at_start, save_every_epochs", "exact", "",
     ("test", T, "EpochsAsCaffe2JobRunnerUsesThem")),
    (C2, "load_blobs_from_checkpoint(blob_names, epoch)", "resume(only=..., epoch=E, strict=False)", "exact",
     "also load's specify_prefix", ("load", ["specify_prefix"])),
    (C2, "MultiNodeCheckpointManager", "the collective manager", "differs",
     "every rank commits one checkpoint together, rank 0 coordinating (not a database per node)",
     ("test", "mpi_tests/manager_mpi_test.cc", "StepsSecondsRetentionAndResumeAgreeOnEveryRank")),
    (C2, "report_checkpoint_stats", "metadata_handler.report, stats.jsonl", "differs",
     "the handler's report(action_name, {path: ns}) after each save and resume, 'checkpoint_load' also for a "
     "partial resume (only=), one path for all nodes; every save's and resume's figures in stats.jsonl",
     ("test", PY, "test_a_caffe2_metadata_handler_is_called_as_job_runner_calls_it")),
]

STATES = {"exact": "exact", "differs": "differs", "refused": "refused"}


def render():
    """docs/seeds.md, from ROWS."""
    out = ["# The seeds' options in distckpt",
           "",
           "Generated from `python/tests/seed_rows.py` by `python3 python/tests/seed_rows.py > docs/seeds.md`;",
           "`python/tests/test_seed_table.py` checks every row against the package and fails when this",
           "file differs from the rows. *exact*: the seed's semantics, defaults included, from C++ and from",
           "Python under the seed's preset (`CheckpointManager.mindspore` / `.mmengine`); *differs*: how;",
           "*refused*: why.",
           ""]
    counts = {s: sum(1 for r in ROWS if r[3] == s) for s in STATES}
    out.append(f"{len(ROWS)} rows: {counts['exact']} exact, {counts['differs']} differ, "
               f"{counts['refused']} refused.")
    for seed in SEED_PARAMETERS:
        out += ["", f"## {seed}", "", "| seed | distckpt | state | difference or note |", "| --- | --- | --- | --- |"]
        for row in ROWS:
            if row[0] == seed:
                out.append(f"| `{row[1]}` | `{row[2]}` | {row[3]} | {row[4]} |" if not row[1].count(" ")
                           else f"| {row[1]} | `{row[2]}` | {row[3]} | {row[4]} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    import sys
    sys.stdout.write(render())
