"""Device tensors staged through host buffers, by torch's own copies.

distckpt reads and writes host memory. A tensor on a device (CUDA, or any other torch
device) is copied into a host buffer before a save writes it (and before an asynchronous
save returns), and a load fills the host buffer, then copies it into the tensor in place
before returning. On CUDA the buffers are pinned, up to a limit, and the copies run on a
side stream ordered after the work already queued on the device's current stream; an
event recorded after the copies is waited for before any byte is written.

The buffers are kept for the next call (one per device tensor of the last save or load,
reused while shape and dtype match), so the host memory held is this rank's device-tensor
bytes: staging_info() reports it, release_staging() frees it. Meta tensors have no data
and are refused. Devices other than CUDA go through Tensor.copy_ (untested). The staging
state is the process's: call these from one thread (the training loop's).
"""
import os as _os
from dataclasses import dataclass as _dataclass

# Test-only: CPU tensors take the staging path too (host to host), so that the staging logic
# runs on machines without a GPU. Never set in production.
_TEST_SWITCH = "DISTCKPT_TEST_STAGE_CPU"

_pinned_limit = 2 << 30
_buffers = {}  # path -> host tensor (the last call's)
_streams = {}  # CUDA device -> side stream


@_dataclass(frozen=True)
class StagingInfo:
    """Host memory held for device tensors: pinned_bytes (page-locked, CUDA), pageable_bytes
    (beyond the pinned limit, or other devices), and the pinned limit."""
    pinned_bytes: int
    pageable_bytes: int
    pinned_limit: int


def staging_info():
    """Local. The host memory distckpt.torch holds for staging device tensors."""
    pinned = sum(b.numel() * b.element_size() for b in _buffers.values() if b.is_pinned())
    total = sum(b.numel() * b.element_size() for b in _buffers.values())
    return StagingInfo(pinned, total - pinned, _pinned_limit)


def set_pinned_limit(nbytes):
    """Local. At most `nbytes` of staging are pinned (page-locked: fast DMA, but memory the
    kernel cannot swap or reclaim); buffers beyond are pageable. Default 2 GiB. TypeError for
    a value that is not an int >= 0."""
    global _pinned_limit
    if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes < 0:
        raise TypeError(f"set_pinned_limit: nbytes must be an int >= 0, not {nbytes!r}")
    _pinned_limit = nbytes


def release_staging():
    """Local. Frees the staging buffers (the next save or load of device tensors makes them again)."""
    _buffers.clear()
    _streams.clear()


def _staged(tensors):
    """path -> tensor of those that go through host buffers (none, quickly, on CPU)."""
    if _os.environ.get(_TEST_SWITCH) == "1":
        return dict(tensors)
    return {p: t for p, t in tensors.items() if t.device.type != "cpu"}


def _host_buffers(staged):
    """path -> host buffer for every staged tensor, reusing the last call's where they fit."""
    import torch
    pinned_used = 0
    out = {}
    for path, t in staged.items():
        nbytes = t.numel() * t.element_size()
        pin = t.device.type == "cuda" and pinned_used + nbytes <= _pinned_limit
        old = _buffers.get(path)
        if old is not None and old.shape == t.shape and old.dtype == t.dtype and old.is_pinned() == pin:
            out[path] = old
        else:
            out[path] = torch.empty(t.shape, dtype=t.dtype, pin_memory=pin)
        pinned_used += nbytes if pin else 0
    if out:  # (a call without device tensors keeps the last buffers)
        _buffers.clear()
        _buffers.update(out)
    return out


def _side_stream(device):
    import torch
    stream = _streams.get(device)
    if stream is None:
        stream = _streams[device] = torch.cuda.Stream(device=device)
    return stream


def stage_out(tensors):
    """Local. `tensors` with every device tensor replaced by a host copy, made and finished
    before this returns. (Meta tensors never get here: the walk refuses them.)"""
    staged = _staged(tensors)
    if not staged:
        return tensors
    buffers = _host_buffers(staged)
    import torch
    events = []
    with torch.no_grad():
        for device in {t.device for p, t in tensors.items() if p in buffers and t.device.type == "cuda"}:
            side = _side_stream(device)
            side.wait_stream(torch.cuda.current_stream(device))  # after the work that wrote them
            with torch.cuda.stream(side):
                for path, t in tensors.items():
                    if path in buffers and t.device == device:
                        buffers[path].copy_(t, non_blocking=True)
            event = torch.cuda.Event()
            event.record(side)
            events.append(event)
        for path, t in tensors.items():
            if path in buffers and t.device.type != "cuda":
                buffers[path].copy_(t)
    for event in events:  # before any byte is written
        event.synchronize()
    return {p: buffers.get(p, t) for p, t in tensors.items()}


def _refuse_unwritable(tensors):
    """A load writes each element once: the rule of the native loads (layout/strided.h) for
    the device tensors, whose host buffers are packed and so never show their strides."""
    for path, t in tensors.items():
        dims = [(st, n) for st, n in zip(t.stride(), t.shape) if n > 1]
        if any(st <= 0 for st, _ in dims):
            raise TypeError(f"tensor '{path}' has strides {tuple(t.stride())}: a load writes each element once, "
                            f"so strides must be positive (an expanded view can be saved, not loaded into)")
        span = 0
        for st, n in sorted(dims):
            if st <= span:
                raise TypeError(f"tensor '{path}' has overlapping strides {tuple(t.stride())}: a load would "
                                f"write some element twice")
            span += (n - 1) * st


def stage_in(tensors):
    """Local. (`tensors` with every device tensor replaced by a host buffer to load into,
    copy_back): copy_back() copies the buffers into the tensors in place and returns once
    the copies are done. TypeError naming a device tensor whose strides would write an
    element twice."""
    staged = _staged(tensors)
    if not staged:
        return tensors, lambda: None
    _refuse_unwritable(staged)
    buffers = _host_buffers(staged)

    def copy_back():
        if not buffers:
            return
        import torch
        devices = set()
        with torch.no_grad():
            for path, t in tensors.items():
                if path in buffers:
                    t.copy_(buffers[path], non_blocking=t.device.type == "cuda")
                    if t.device.type == "cuda":
                        devices.add(t.device)
        for device in devices:
            torch.cuda.current_stream(device).synchronize()
    return {p: buffers.get(p, t) for p, t in tensors.items()}, copy_back
