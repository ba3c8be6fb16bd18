"""What the package's calls return: typed, read-only records (dataclasses).

Each class names the C++ struct it mirrors; the fields keep the C++ names. A record is
built from the native module's reply by `_from`, which refuses a reply with fields the
class does not know or lacks (a package and a native module of different versions).
"""
from dataclasses import dataclass, field, fields
from typing import Dict, List, Optional, Union

InfoValue = Union[int, float, bool, str]


def _from(cls, reply):
    names = {f.name for f in fields(cls)}
    unknown, lacking = set(reply) - names, names - set(reply)
    if unknown or lacking:
        raise RuntimeError(f"distckpt: the native module's {cls.__name__} has fields {sorted(reply)}, the package "
                           f"expects {sorted(names)} (a package and a _distckpt of different versions?)")
    return cls(**reply)


@dataclass(frozen=True)
class SaveResult:
    """A committed save (C++ SaveResult). Sizes in bytes, summed over ranks."""
    path: str  #: the checkpoint written (a directory, or a single file with its extension)
    bytes_unique: int  #: the tensors' unique bytes
    bytes_written: int  #: data bytes written (an incremental save references the rest)
    bytes_referenced: int  #: bytes an incremental save took from older checkpoints
    incremental_base: str  #: the checkpoint an incremental save built on ("" for a full one)
    index_bytes: int  #: the index file's size
    plan_s: float
    write_s: float
    commit_s: float
    warning: str  #: a problem after the commit that did not fail the save ("" for none)


@dataclass(frozen=True)
class LoadResult:
    """A load (C++ LoadResult)."""
    step: int
    epoch: int
    info: Dict[str, InfoValue]  #: every info value stored with the checkpoint
    loaded: List[str]  #: the state's tensors loaded
    missing_in_checkpoint: List[str]  #: the state's tensors the checkpoint lacks (strict=False)
    unexpected_in_checkpoint: List[str]  #: stored tensors the state has no place for
    bytes_read: int  #: read from storage, summed over ranks
    bytes_needed: int  #: the boxes' bytes: bytes_read / bytes_needed is the read amplification
    load_s: float
    warning: str


@dataclass(frozen=True)
class ResumeResult:
    """CheckpointManager.resume's result (C++ ResumeResult). resumed is False on a fresh
    start (nothing to resume from), which is no error."""
    resumed: bool
    path: str
    step: int
    epoch: int
    info: Dict[str, InfoValue]
    missing_in_checkpoint: List[str]
    unexpected_in_checkpoint: List[str]
    filtered_out: List[str]
    skipped: List[str]  #: damaged checkpoints passed over (fall_back_to_previous)
    saved_at_start: str


@dataclass(frozen=True)
class StepOutcome:
    """What a manager's step_end, end or save_now did (C++ StepOutcome)."""
    saved: bool
    path: str
    in_flight: bool  #: async_save: `path` is being written; a later call reports it in `committed`
    committed: List[str]
    removed: List[str]  #: checkpoints retention deleted after those commits
    stop: bool  #: a signal or an exception on some rank: end the loop now
    save_error: Optional[str]  #: on_failure="continue": this call's failed save, else None
    best: List[str]
    tier: str
    drained: List[str]
    exception_rank: int
    exception: str = ""  #: what the exception on exception_rank said
    skipped: str = ""  #: a save that was due and was not made, and why (metadata_handler.cp_accessible)
    #: on_failure="continue" with async_save: a background save started earlier failed
    background_error: Optional[str] = None
    published: List[str] = field(default_factory=list)  #: end() with publish_at_end / published_keys
    uploaded: List[str] = field(default_factory=list)  #: uploads finished since the last call
    upload_errors: List[str] = field(default_factory=list)  #: uploads that failed or were skipped
    drain_error: Optional[str] = None  #: a local tier's drain that failed (the local checkpoint stays)


@dataclass(frozen=True)
class VerifyReport:
    """verify's report (C++ VerifyReport)."""
    tensors: int
    chunks: int
    files: int
    bytes_checked: int
    deep: bool  #: every file was dropped from the page cache first: the bytes came from storage
    checksums: bool  #: the data carries checksums (per chunk or per file); False: structure only
    authenticated: bool  #: an encrypted checkpoint whose every chunk authenticated
    checked: str  #: what was checked, in words ("sizes and every chunk's CRC32C", ...)
    warning: str  #: data nothing checks that passed all the same, in one line; "" when all was checked


@dataclass(frozen=True)
class CheckpointEntry:
    """One committed checkpoint of a root (list_checkpoints)."""
    name: str
    step: int
    epoch: int
    bytes: int
    referenced_bytes: int  #: bytes of older checkpoints an incremental one references
    references: List[str]
    format: str
    latest: bool  #: the one `latest` names
    per_rank_files: bool  #: a per-rank .ckpt set (MindSpore's integrated_save=False), listed as one
    detail: str  #: a warning, as `distckpt ls` shows it ("unchecked: ...", "no MindSpore strategy: ..."), or ""


@dataclass(frozen=True)
class CheckpointInfo:
    """A checkpoint's description (Reader.info)."""
    name: str
    step: int
    epoch: int
    world_size: int
    info: Dict[str, InfoValue] = field(default_factory=dict)  #: every stored info value
    writer_version: str = ""  #: the distckpt version that wrote it ("" for files of earlier builds and other writers)
