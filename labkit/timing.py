"""The clock: timing work on the device that runs it, and the machine's two roofs.

    from labkit import timing
    t, logits = timing.time_fn(lambda: model.forward(ids), model.device)
    t.median, t.min, t.samples               # seconds
    timing.device_label(model)               # 'cpu (Intel Xeon, 2 threads), torch.float32'
    timing.read_bandwidth(model.device)      # bytes/s, the roof a decode step runs into

Every timing in labkit
- waits for the device before it reads the clock (`sync`): a CUDA call returns
  as soon as the work is queued, so without `torch.cuda.synchronize()` a GPU
  would look impossibly fast;
- runs once untimed first on a GPU (warm-up: memory allocation, kernel
  selection), then reports the median of a few repeats, which a busy, shared
  machine disturbs less than the mean;
- carries the label of what it was measured on, so that a printed number
  never travels without its machine.

What is here:

    device_name, device_label        what a measurement ran on, in words
    sync                             wait until the device has finished
    median, percentile               the middle / the q-th percentile of measured times (ITL, latencies)
    Timing, time_fn                  time a function: warm-up, repeats, the seconds of each
    read_bandwidth, copy_bandwidth   memory bandwidth (bytes/s), the fastest of a few runs
    matmul_flops_per_s               matmul throughput (FLOP/s), the fastest of a few runs
    release_freed_memory             give freed memory back to the OS between measurements

The engine imports this file (Generation's ITL percentiles), so it holds
no plotting. The sweeps built on it are in labkit.measure, the formulas of
what a forward pass costs in labkit.costs.

Left out: CUDA events and profilers (perf_counter around a synchronize is
accurate to well under a millisecond, enough for steps of milliseconds), and
any tuning of the machine (threads, clocks): the point is to measure the
machine as the student has it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import math
import platform
import time
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch


# ----------------------------------------------------------------------------
# What a measurement ran on
# ----------------------------------------------------------------------------

def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


def device_name(device: str | torch.device) -> str:
    """The device in words: 'cpu (Intel Xeon, 2 threads)' or 'cuda:0 (NVIDIA H200)'."""
    device = torch.device(device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return f"cuda:{index} ({torch.cuda.get_device_name(index)})"
    if device.type == "cpu":
        return f"cpu ({_cpu_name()}, {torch.get_num_threads()} threads)"
    return str(device)


def device_label(model_or_device, dtype: torch.dtype | None = None) -> str:
    """What a measurement ran on: device, processor, threads and dtype."""
    if hasattr(model_or_device, "device") and hasattr(model_or_device, "dtype"):
        device, dtype = model_or_device.device, dtype or model_or_device.dtype
    else:
        device = model_or_device
    return device_name(device) + (f", {dtype}" if dtype is not None else "")


# ----------------------------------------------------------------------------
# The clock
# ----------------------------------------------------------------------------

def sync(device: str | torch.device) -> None:
    """Wait until the device has finished the work queued on it (a no-op on a CPU)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def median(values: Iterable[float]) -> float:
    """The middle of the sorted values: for an even count the upper of the two
    middle ones, so a median time is always a time that was measured. NaN when
    there are none (a generation of one token has no decode step to time)."""
    ordered = sorted(values)
    return float(ordered[len(ordered) // 2]) if ordered else float("nan")


def percentile(values: Iterable[float], q: float) -> float:
    """The q-th percentile (0-100), nearest rank: the smallest value with at
    least q% of the values at or below it, the ceil(q/100 x n)-th smallest
    (p50 of 1..10 is 5, p90 is 9; p0 is the minimum). Like `median`, always a
    value that was measured. NaN when there are none."""
    if not 0 <= q <= 100:
        raise ValueError(f"q must be a percentile between 0 and 100, got {q!r}")
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    # 1-based rank; q x n first, so 7% of 100 is 7, not 7.000000000000001 (ceil: 8),
    # and ceil, not round(), which rounds halves to even.
    rank = math.ceil(q * len(ordered) / 100)
    return float(ordered[min(len(ordered), max(1, rank)) - 1])


@dataclass
class Timing:
    """Seconds of each timed repeat (the warm-up is not among them)."""

    samples: list[float]

    @property
    def median(self) -> float:
        return median(self.samples)

    @property
    def min(self) -> float:
        """The fastest repeat: what the machine can reach (other programs only slow a run down)."""
        return min(self.samples)

    def __repr__(self) -> str:
        return f"Timing(median {self.median * 1e3:.2f} ms over {len(self.samples)} repeats)"


def default_warmup(device: str | torch.device) -> int:
    """Untimed runs before timing: one on a GPU (its first call of a new shape
    picks kernels and allocates), none on a CPU, where a first call costs about
    what the next ones do and a slow machine should not pay for it twice."""
    return 0 if torch.device(device).type == "cpu" else 1


def time_fn(fn: Callable[[], Any], device: str | torch.device, repeats: int = 3, warmup: int | None = None,
            setup: Callable[[], Any] | None = None) -> tuple[Timing, Any]:
    """Time `fn()` on `device`: `warmup` untimed calls, then `repeats` timed ones.

    warmup: None for `default_warmup(device)`.
    setup: called before every call, outside the timed region (e.g. to empty a cache).
    Returns the Timing and the result of the last call.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if warmup is None:
        warmup = default_warmup(device)
    result = None
    for _ in range(warmup):
        if setup:
            setup()
        result = fn()
    samples = []
    for _ in range(repeats):
        if setup:
            setup()
        sync(device)                 # the work queued before is not ours to time
        start = time.perf_counter()
        result = fn()
        sync(device)                 # ours is finished, not only queued
        samples.append(time.perf_counter() - start)
    return Timing(samples), result


def release_freed_memory(collect: bool = True) -> None:
    """Hand memory that was freed back to the operating system: a garbage
    collection, then glibc's malloc_trim (Linux). glibc keeps freed blocks of
    up to 32 MB in its heap for later, so after a sweep of large temporaries
    (a batch of KV caches, a model's worth of quantization buffers) the
    kernel would otherwise keep their peak as private memory (docs/memory.md).
    Called between measurements, never inside a timed region.
    collect=False: skip the garbage collection (tens of ms in a notebook
    kernel), when what was freed was freed by reference counting."""
    if collect:
        gc.collect()
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


_LIBC: list = []


def _libc():
    if not _LIBC:
        lib = None
        if platform.system() == "Linux":
            try:
                lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                lib.malloc_trim       # glibc only (musl has none)
            except (OSError, AttributeError):
                lib = None
        _LIBC.append(lib)
    return _LIBC[0]


# ----------------------------------------------------------------------------
# The roofline's two numbers: what the machine can reach
# ----------------------------------------------------------------------------
# Each is the fastest of a few runs, not the median: a roof is what the machine
# *can* reach, and other programs only ever slow a run down.

def _last_level_cache_bytes() -> int | None:
    """The CPU's largest cache in bytes (Linux sysfs), or None where it cannot be read."""
    sizes = []
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip().upper()
        except OSError:
            continue
        unit = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * unit)
    return max(sizes) if sizes else None


def _default_nbytes(device: torch.device) -> int:
    """Far larger than any cache, small enough for a notebook: 2 GiB on a GPU; on a
    CPU 4 x its last-level cache, from 128 to 256 MiB (256 MiB where the cache size
    is unknown). Measured on a 2-core EPYC with a 32 MiB L3: 128 and 256 MiB read
    at the same speed (71 and 70 GB/s), 64 MiB 25 % faster (partly from the cache);
    the buffer is private memory of the kernel, so no larger than it needs to be."""
    if device.type == "cuda":
        return 2 * 2**30
    llc = _last_level_cache_bytes()
    return 256 * 2**20 if llc is None else min(max(4 * llc, 128 * 2**20), 256 * 2**20)


def read_bandwidth(device: str | torch.device, nbytes: int | None = None, repeats: int = 5) -> float:
    """Memory read bandwidth (bytes/s): the time to sum an fp32 tensor of `nbytes`.

    A sum reads every byte once and does one addition per 4 bytes, so it is
    bound by memory, as a decode step is (it reads every weight and the KV
    cache once, for a few FLOPs per byte).
    nbytes must exceed the last-level cache, or the cache is what gets measured.
    """
    device = torch.device(device)
    x = torch.ones((nbytes or _default_nbytes(device)) // 4, dtype=torch.float32, device=device)
    t, _ = time_fn(lambda: x.sum(), device, repeats, warmup=1)
    return x.nbytes / t.min


def copy_bandwidth(device: str | torch.device, nbytes: int | None = None, repeats: int = 5) -> float:
    """Memory copy bandwidth (bytes/s): the bytes read plus the bytes written
    when one fp32 tensor of `nbytes` is copied into another."""
    device = torch.device(device)
    x = torch.ones((nbytes or _default_nbytes(device)) // 4, dtype=torch.float32, device=device)
    y = torch.empty_like(x)
    t, _ = time_fn(lambda: y.copy_(x), device, repeats, warmup=1)
    return 2 * x.nbytes / t.min


def matmul_flops_per_s(device: str | torch.device, dtype: torch.dtype = torch.float32,
                       n: int | None = None, repeats: int = 5) -> float:
    """Matmul throughput (FLOP/s) of an (n x n) @ (n x n) product: 2 n^3 FLOPs
    (a multiply and an add per term).

    The practical peak PyTorch reaches on this device in this dtype, usually
    below the data-sheet number. Default n: 1024 on a CPU (a fraction of a
    second), 8192 on a GPU (smaller products leave a large GPU partly idle).
    """
    device = torch.device(device)
    if n is None:
        n = 8192 if device.type == "cuda" else 1024
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, generator=g, device=device).to(dtype)
    b = torch.randn(n, n, generator=g, device=device).to(dtype)
    t, _ = time_fn(lambda: a @ b, device, repeats, warmup=1)
    return 2 * n**3 / t.min
