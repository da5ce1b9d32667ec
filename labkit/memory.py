"""How much memory a process uses, how much the machine has left, and where the weights live.

Two numbers describe a process's memory on Linux (/proc/PID/smaps_rollup):

    RSS   resident set size: every page the process has in memory, including
          pages it shares with other processes (libraries, a memory-mapped
          weights file). What one process costs when it runs alone.
    PSS   proportional set size: each shared page divided by the number of
          processes sharing it. PSS of all processes sums to what they cost
          together, so two kernels that map the same weights file each count
          half of it.

The default model's fp32 weights are read from the converted safetensors file
through a private, copy-on-write memory map (transformers does this itself
since 5.x; `labkit.loading` checks it and maps the file itself when it did
not). Pages that are only read are the page cache's own pages: every kernel on
the machine shares one copy, and under memory pressure the kernel can drop
them (clean file pages) and read them again, instead of killing a process.
A write to a weight would give that process a private copy of the page, never
change the file. Converting to bf16 or fp16, or quantizing, makes new private
tensors.

`check_room(nbytes, what)` is called before something large is allocated (a
model in another precision, a long KV cache): when the machine, or the
container's cgroup limit, does not have that much available it raises
`NotEnoughMemoryError` with a sentence saying what and how much, instead of
the kernel being killed without a word.

Left out: GPU memory (torch.cuda.mem_get_info says it), macOS and Windows
(the /proc readings return None there, and `check_room` checks nothing).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

MB = 1e6

# Keep this much free beyond what is asked for: the allocation is never the
# only thing that grows (activations, Python objects, the notebook's outputs).
MARGIN_BYTES = 100 * 2**20


class NotEnoughMemoryError(MemoryError):
    """Raised by `check_room` when an allocation would not fit in the memory left."""


# ----------------------------------------------------------------------------
# One process
# ----------------------------------------------------------------------------

@dataclass
class ProcessMemory:
    """Memory of one process (or the sum over a process tree), in bytes."""

    rss: int          # resident, shared pages counted in full
    pss: int          # resident, shared pages divided among the processes sharing them
    anon: int         # private memory (heap, tensors that are not memory-mapped files)
    file: int         # resident pages of mapped files (libraries, weights)
    peak_rss: int     # VmHWM: the largest RSS so far (the sum of each process's, for a tree)

    def __add__(self, other: "ProcessMemory") -> "ProcessMemory":
        return ProcessMemory(*(a + b for a, b in zip(self.astuple(), other.astuple())))

    def astuple(self) -> tuple[int, ...]:
        return (self.rss, self.pss, self.anon, self.file, self.peak_rss)

    def __str__(self) -> str:
        return (f"RSS {self.rss / MB:.0f} MB (peak {self.peak_rss / MB:.0f} MB), PSS {self.pss / MB:.0f} MB, "
                f"private {self.anon / MB:.0f} MB, mapped files {self.file / MB:.0f} MB")


def _kb_fields(path: str) -> dict[str, int]:
    """'Name:   123 kB' lines of a /proc file -> {name: bytes}."""
    out = {}
    with open(path) as f:
        for line in f:
            m = re.match(r"(\w+):\s+(\d+) kB", line)
            if m:
                out[m.group(1)] = int(m.group(2)) * 1024
    return out


def process_memory(pid: int | str = "self") -> ProcessMemory | None:
    """RSS, PSS, private and file-backed memory of one process; None when /proc
    cannot tell (not Linux, or the process has ended)."""
    try:
        rollup = _kb_fields(f"/proc/{pid}/smaps_rollup")
        status = _kb_fields(f"/proc/{pid}/status")
    except OSError:
        return None
    anon = rollup.get("Anonymous", 0)
    return ProcessMemory(rss=rollup.get("Rss", 0), pss=rollup.get("Pss", 0), anon=anon,
                         file=max(rollup.get("Rss", 0) - anon, 0), peak_rss=status.get("VmHWM", 0))


def process_tree(pid: int) -> list[int]:
    """pid and all its descendants (a notebook kernel and whatever it started)."""
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        pids.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return pids


def file_mapping_memory(path: str | os.PathLike, pid: int | str = "self") -> ProcessMemory | None:
    """RSS, PSS and copied-on-write (anon) pages of one process's mappings of
    one file: how much of a weights file it holds, and its share of it."""
    path = os.path.realpath(path)
    total = [0, 0, 0]
    inside = False
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
                    parts = line.split(None, 5)
                    inside = len(parts) == 6 and parts[5].strip() == path
                elif inside:
                    for i, key in enumerate(("Rss:", "Pss:", "Anonymous:")):
                        if line.startswith(key):
                            total[i] += int(line.split()[1]) * 1024
    except OSError:
        return None
    rss, pss, anon = total
    return ProcessMemory(rss=rss, pss=pss, anon=anon, file=rss - anon, peak_rss=0)


def _file_rss(pid: int) -> dict[str, int]:
    """Resident bytes of each file one process maps (libraries, weights)."""
    out: dict[str, int] = {}
    path = None
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
                    parts = line.split(None, 5)
                    path = parts[5].strip() if len(parts) == 6 and parts[5].startswith("/") else None
                elif path and line.startswith("Rss:"):
                    out[path] = out.get(path, 0) + int(line.split()[1]) * 1024
                elif path and line.startswith("Anonymous:"):     # copied-on-write: counted as private
                    out[path] -= int(line.split()[1]) * 1024
    except OSError:
        pass
    return out


def charge(pids: list[int]) -> int:
    """What a container holding these process trees is charged, about: their
    private memory plus each mapped file once (the largest resident part any
    of them holds), whoever else on the machine maps the same files. PSS
    would divide shared libraries among every process on the machine that
    maps them, other users' included; this does not."""
    anon, files = 0, {}
    for pid in pids:
        for p in process_tree(pid):
            m = process_memory(p)
            if m is None:
                continue
            anon += m.anon
            for path, rss in _file_rss(p).items():
                files[path] = max(files.get(path, 0), rss)
    return anon + sum(files.values())


def tree_memory(pid: int) -> ProcessMemory | None:
    """The sum of `process_memory` over pid and its descendants."""
    total = None
    for p in process_tree(pid):
        m = process_memory(p)
        if m is not None:
            total = m if total is None else total + m
    return total


# ----------------------------------------------------------------------------
# The machine, or the container's limit
# ----------------------------------------------------------------------------

def _read_int(path: str) -> int | None:
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None   # "max": no limit


CGROUP_ROOT = "/sys/fs/cgroup"


def cgroup_available(root: str | os.PathLike = CGROUP_ROOT) -> int | None:
    """Bytes the container's cgroup (v2, else v1) still allows, or None without a limit.

    The usage the cgroup counts includes page cache; its inactive file pages
    (clean, dropped first under pressure) are counted as available, as
    Kubernetes does for its "working set"."""
    for limit_f, usage_f, stat_f, key in (
            ("memory.max", "memory.current", "memory.stat", "inactive_file"),
            ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes", "memory/memory.stat",
             "total_inactive_file")):
        limit_f, usage_f, stat_f = (os.path.join(root, f) for f in (limit_f, usage_f, stat_f))
        limit, usage = _read_int(limit_f), _read_int(usage_f)
        if limit is None or usage is None or limit >= 2**60:     # v1 writes a huge number for "no limit"
            continue
        inactive = 0
        try:
            for line in Path(stat_f).read_text().splitlines():
                name, _, value = line.partition(" ")
                if name == key:
                    inactive = int(value)
        except (OSError, ValueError):
            pass
        return max(limit - usage + inactive, 0)
    return None


def available_bytes() -> int | None:
    """Memory that can still be allocated without swapping or being killed:
    the smaller of the machine's MemAvailable and the cgroup's room; None
    when neither can be read."""
    try:
        machine = _kb_fields("/proc/meminfo").get("MemAvailable")
    except OSError:
        machine = None
    limits = [b for b in (machine, cgroup_available()) if b is not None]
    return min(limits) if limits else None


def check_room(nbytes: int, what: str, *, margin: int = MARGIN_BYTES) -> None:
    """Raise NotEnoughMemoryError, in words, when `nbytes` more (plus a margin)
    do not fit in the memory left: better a clear error in one cell than a
    kernel killed by the out-of-memory killer.

    Set LABKIT_MEMORY_CHECK=0 to skip the check (for example when swap makes
    more room than MemAvailable says)."""
    if os.environ.get("LABKIT_MEMORY_CHECK", "1") == "0":
        return
    free = available_bytes()
    if free is None or nbytes + margin <= free:
        return
    raise NotEnoughMemoryError(
        f"Not enough memory for {what}: it needs about {nbytes / MB:,.0f} MB and only "
        f"{free / MB:,.0f} MB is available on this machine{_limit_note()} (keeping {margin / MB:.0f} MB "
        "spare). Free memory first: shut down the kernels of other notebooks (JupyterLab: Kernel > "
        "Shut Down All Kernels, or the Running panel), or `del` large objects in this one. "
        "To try anyway, set the environment variable LABKIT_MEMORY_CHECK=0.")


def _limit_note() -> str:
    for path in ("memory.max", "memory/memory.limit_in_bytes"):
        limit = _read_int(os.path.join(CGROUP_ROOT, path))
        if limit is not None and limit < 2**60:
            return f" (the container's limit is {limit / MB:,.0f} MB)"
    return ""


# ----------------------------------------------------------------------------
# Where a model's weights are
# ----------------------------------------------------------------------------

def _mapped_files() -> list[tuple[int, int, str]]:
    """(start, end, path) of every file mapping of this process."""
    out = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) == 6 and parts[5].startswith("/"):
                    lo, hi = (int(x, 16) for x in parts[0].split("-"))
                    out.append((lo, hi, parts[5].strip()))
    except OSError:
        pass
    return out


def mapped_file(tensor, maps: list[tuple[int, int, str]] | None = None) -> str | None:
    """The file whose memory map holds this CPU tensor's data, or None (a private copy)."""
    if tensor.device.type != "cpu" or tensor.numel() == 0:
        return None
    ptr = tensor.data_ptr()
    for lo, hi, path in (maps if maps is not None else _mapped_files()):
        if lo <= ptr < hi:
            return path
    return None


@dataclass
class WeightMemory:
    """A model's parameters, each tensor once, in bytes (buffers such as RoPE
    frequencies are not weights and are left out)."""

    total: int
    mapped: int                 # memory-mapped from a file: shared page cache
    files: tuple[str, ...]      # the files they are mapped from

    @property
    def private(self) -> int:
        return self.total - self.mapped

    def __str__(self) -> str:
        if self.total and self.mapped == self.total:
            how = "memory-mapped read-only from the converted file, shared by every kernel on this machine"
        elif self.mapped:
            how = f"{self.mapped / MB:.0f} MB memory-mapped and shared, {self.private / MB:.0f} MB private"
        else:
            how = "a private copy in this process"
        return f"weights {self.total / MB:.0f} MB, {how}"


def weight_memory(hf) -> WeightMemory:
    """How many bytes a torch module's parameters take, and how many of them are
    memory-mapped from a file (shared) rather than private. (A quantized
    layer's int8 / int4 weights are buffers: they are private, and counted.)"""
    maps = _mapped_files()
    quantized = [b for name, b in hf.named_buffers() if name.endswith(("qweight", "scale", "scales_and_zeros"))]
    tensors = {t.data_ptr(): t for t in (*hf.parameters(), *quantized) if t.numel()}
    total = mapped = 0
    files = set()
    for t in tensors.values():
        n = t.numel() * t.element_size()
        total += n
        path = mapped_file(t, maps)
        if path is not None:
            mapped += n
            files.add(path)
    return WeightMemory(total, mapped, tuple(sorted(files)))


def map_safetensors(hf, file: str | os.PathLike) -> int:
    """Point every parameter and buffer of `hf` that is stored in the safetensors
    `file` with the same dtype and shape at a private, copy-on-write memory map
    of that file; return how many bytes now come from the map.

    transformers >= 5 already loads this way; older versions read a private
    copy, which this replaces (the copy is freed when nothing else holds it).
    Copy-on-write keeps the file safe: a write to a parameter copies that page
    into the process, and the file is never changed."""
    import json

    import torch

    file = str(file)
    size = os.path.getsize(file)
    with open(file, "rb") as f:
        header_len = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(header_len))
    # shared=False: MAP_PRIVATE, copy-on-write, the file is never written.
    storage = torch.UntypedStorage.from_file(file, shared=False, nbytes=size)
    names = dict(hf.named_parameters(remove_duplicate=False))
    names.update(dict(hf.named_buffers(remove_duplicate=False)))
    mapped = 0
    seen = set()
    for name, info in header.items():
        if name == "__metadata__" or name not in names:
            continue
        t = names[name]
        dtype = getattr(torch, {"F32": "float32", "F16": "float16", "BF16": "bfloat16",
                                "I64": "int64", "I32": "int32"}.get(info["dtype"], ""), None)
        start, end = info["data_offsets"]
        offset = 8 + header_len + start
        if (dtype is None or t.dtype != dtype or list(t.shape) != info["shape"] or t.device.type != "cpu"
                or offset % t.element_size()):
            continue
        view = torch.empty(0, dtype=dtype).set_(storage, offset // t.element_size(), t.shape)
        if not torch.equal(view, t):
            continue                                  # the model changed it since loading: keep its own
        if id(t) not in seen:
            t.data = view
            seen.add(id(t))
            mapped += end - start
    return mapped


# ----------------------------------------------------------------------------
# Peaks over time
# ----------------------------------------------------------------------------

def _max(a: ProcessMemory, b: ProcessMemory) -> ProcessMemory:
    return ProcessMemory(*(max(x, y) for x, y in zip(a.astuple(), b.astuple())))


class Sampler:
    """Samples the memory of some process trees every `interval` seconds in a
    background thread and keeps the peaks, so a notebook's highest PSS (which
    the kernel does not record, unlike peak RSS) can be measured.

        with Sampler([kernel_pid]) as s:
            ...                     # run the notebook
        s.peak.pss, s.peak.peak_rss, s.peak.anon

    peak: the largest value of each field of the sum over the trees, taken
    separately: peak.pss is the largest PSS of all the trees together
    (sampled), peak.peak_rss the sum of their VmHWM (kept by Linux, exact).
    `pids` can be changed while it runs (a kernel started later)."""

    def __init__(self, pids: list[int] | None = None, interval: float = 0.05, charge_every: int = 0):
        import threading

        self.pids = list(pids or [])
        self.interval = interval
        self.charge_every = charge_every   # also `charge` every n-th sample (slower: reads smaps); 0: never
        self.peak_charge = 0
        self.peak = ProcessMemory(0, 0, 0, 0, 0)
        self.window = ProcessMemory(0, 0, 0, 0, 0)   # peaks since the last new_window()
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> ProcessMemory | None:
        total = None
        for pid in list(self.pids):
            m = tree_memory(pid)
            if m is not None:
                total = m if total is None else total + m
        if total is not None:
            self.peak = _max(self.peak, total)
            self.window = _max(self.window, total)
            self.samples += 1
            if self.charge_every and self.samples % self.charge_every == 0:
                self.peak_charge = max(self.peak_charge, charge(self.pids))
        return total

    def new_window(self) -> ProcessMemory:
        """Start a new window (one notebook cell, say); return the last one's peaks."""
        last, self.window = self.window, ProcessMemory(0, 0, 0, 0, 0)
        self.sample()
        return last

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def __enter__(self) -> "Sampler":
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()
