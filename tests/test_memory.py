"""Memory: weights memory-mapped and shared between processes, /proc readings, check_room."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import labkit
from labkit import memory
from labkit.quantize import quantize

linux = pytest.mark.skipif(not os.path.exists("/proc/self/smaps_rollup"), reason="reads Linux's /proc")


def _weights_file():
    return labkit.loading._converted_folder(labkit.default_gguf_file()) / "model.safetensors"


@linux
def test_process_memory_reads_proc():
    m = memory.process_memory()
    assert 0 < m.anon <= m.rss and 0 < m.pss <= m.rss <= m.peak_rss
    assert abs(memory.charge([os.getpid()]) - m.rss) < 0.02 * m.rss     # alone: private + its files = RSS
    assert memory.process_memory(2**22 + 12345) is None or True    # a missing pid: None, not an error
    tree = memory.tree_memory(os.getpid())
    assert tree.rss >= m.rss * 0.9


@linux
def test_default_fp32_weights_are_memory_mapped(model):
    """Every parameter is a view of the converted file's memory map: nothing private."""
    weights = memory.weight_memory(model.hf)
    assert weights.total == model.n_params * 4
    assert weights.private == 0 and weights.files == (os.path.realpath(_weights_file()),)
    assert "memory-mapped" in str(weights)


@linux
def test_quantize_and_forward_leave_the_mapped_weights_untouched(model):
    """Nothing labkit does writes a mapped weight in place: a write would copy the
    page into the process (copy-on-write), visible as anonymous pages of the mapping."""
    int8 = quantize(model, "int8")
    ids = labkit.encode(model, "The capital of France is").ids
    int8.forward(ids)
    labkit.generate(model, "The capital of France is", 3)
    mapped = memory.file_mapping_memory(_weights_file())
    assert mapped.rss > 0.9 * model.n_params * 4          # read in full by the forward passes
    assert mapped.anon == 0                               # and never written
    # The quantized model owns its int8 layers; at most its bf16 embedding table is
    # mapped, from labkit's bf16 file, never from the fp32 one.
    c = model.config
    own = memory.weight_memory(int8.hf)
    assert own.mapped in (0, c.vocab_size * c.d_model * 2)
    assert os.path.realpath(_weights_file()) not in own.files


@linux
def test_bf16_load_maps_its_own_file_with_the_same_weights(load_default):
    """bf16 is saved once beside the fp32 folder and mapped, like fp32: shared, and
    bit for bit what converting the fp32 weights on load gives."""
    m16, m32 = load_default("bf16"), load_default("fp32")
    weights = memory.weight_memory(m16.hf)
    assert weights.private == 0 and weights.total == m32.n_params * 2
    assert weights.files[0].endswith(".bfloat16/model.safetensors")
    for (name, a), b in zip(m16.hf.named_parameters(), m32.hf.parameters()):
        assert torch.equal(a, b.to(torch.bfloat16)), name


@linux
def test_map_safetensors_replaces_a_private_copy(tmp_path):
    """The fallback for transformers versions that read a private copy: the
    parameters become views of the file, logits unchanged, the file never written."""
    from tiny_models import tiny_hf_model

    hf = tiny_hf_model("llama")
    hf.save_pretrained(tmp_path)
    file = tmp_path / "model.safetensors"
    before = file.read_bytes()
    ids = torch.arange(10)[None]
    reference = hf(ids).logits
    assert memory.weight_memory(hf).mapped == 0                  # built in memory: private
    n = memory.map_safetensors(hf, file)
    weights = memory.weight_memory(hf)
    assert n > 0 and weights.private == 0 and weights.total == n
    assert torch.equal(hf(ids).logits, reference)
    with torch.no_grad():
        hf.model.norm.weight.mul_(2)                             # a write copies the page...
    assert file.read_bytes() == before                           # ...and never reaches the file


@linux
def test_two_processes_share_one_copy(tmp_path):
    """Two processes mapping the same file: each one's PSS of the mapping is half of it."""
    from safetensors.torch import save_file

    save_file({"w": torch.randn(2048, 4096)}, str(tmp_path / "w.safetensors"))    # 32 MiB
    code = textwrap.dedent(f"""
        import sys, torch
        from torch import nn
        from labkit import memory
        from safetensors.torch import load_file
        file = {str(tmp_path / 'w.safetensors')!r}
        m = nn.Module(); m.w = nn.Parameter(load_file(file)["w"], requires_grad=False)   # a private copy
        assert memory.map_safetensors(m, file) == 2048 * 4096 * 4
        print(float(m.w.sum()), flush=True)                    # reads every page
        sys.stdin.read()
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    procs = [subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env=env) for _ in range(2)]
    try:
        for p in procs:
            p.stdout.readline()
        maps = [memory.file_mapping_memory(tmp_path / "w.safetensors", p.pid) for p in procs]
        rss = [memory.process_memory(p.pid).rss for p in procs]
        together = memory.charge([p.pid for p in procs])          # the file once, libraries once
    finally:
        for p in procs:
            p.stdin.close()
            p.wait(60)
    size = 2048 * 4096 * 4
    for m in maps:
        assert m.rss >= 0.99 * size and m.anon == 0
        assert 0.45 * size <= m.pss <= 0.55 * size
    assert together <= sum(rss) - 0.95 * size


def test_check_room_says_what_and_how_much(monkeypatch):
    monkeypatch.setattr(memory, "available_bytes", lambda: 500 * 2**20)
    memory.check_room(300 * 2**20, "a small thing")               # fits with the margin
    with pytest.raises(memory.NotEnoughMemoryError, match=r"Not enough memory for the model in bfloat16.*"
                                                             r"needs about 629 MB.*524 MB is available"):
        memory.check_room(600 * 2**20, "the model in bfloat16")
    assert issubclass(memory.NotEnoughMemoryError, MemoryError)
    monkeypatch.setenv("LABKIT_MEMORY_CHECK", "0")
    memory.check_room(10**15, "anything")                          # switched off
    monkeypatch.setattr(memory, "available_bytes", lambda: None)   # cannot tell: no check
    monkeypatch.delenv("LABKIT_MEMORY_CHECK")
    memory.check_room(10**15, "anything")


def test_a_long_cache_is_checked_before_it_is_allocated(model, monkeypatch):
    monkeypatch.setattr(memory, "available_bytes", lambda: 200 * 2**20)
    model.new_cache(max_len=1024)                                  # 47 MB: fits
    with pytest.raises(memory.NotEnoughMemoryError, match="KV cache of 8192 tokens"):
        model.new_cache(max_len=8192)                              # 377 MB


def test_load_model_checks_room_before_converting(model, monkeypatch, tmp_path):
    """A fresh cache (the fp32 folder linked in, no fp16 one yet): writing the fp16
    file needs a private copy first, and load_model says so when there is no room."""
    folder = _weights_file().parent
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / folder.name).symlink_to(folder)
    monkeypatch.setenv("LABKIT_CACHE", str(tmp_path))
    monkeypatch.setattr(memory, "available_bytes", lambda: 100 * 2**20)
    monkeypatch.setattr(labkit.loading, "_loaded", {})              # not the already-loaded ones
    with pytest.raises(memory.NotEnoughMemoryError, match="converting the model to float16 .once, 269 MB"):
        labkit.load_model(device="cpu", dtype="fp16")
    assert not list((tmp_path / "models").glob("*float16*"))        # nothing half-written
    labkit.load_model(device="cpu", dtype="fp32", progress=False)    # fp32 maps the file: no room needed


def test_cgroup_limits_v2_and_v1(tmp_path):
    assert memory.cgroup_available(tmp_path) is None                # no files: no limit
    (tmp_path / "memory.max").write_text("max\n")
    (tmp_path / "memory.current").write_text("100\n")
    assert memory.cgroup_available(tmp_path) is None                # "max": no limit
    (tmp_path / "memory.max").write_text(f"{2 * 2**30}\n")
    (tmp_path / "memory.current").write_text(f"{1536 * 2**20}\n")
    (tmp_path / "memory.stat").write_text(f"anon 1000\ninactive_file {100 * 2**20}\nactive_file 5\n")
    assert memory.cgroup_available(tmp_path) == (2048 - 1536 + 100) * 2**20
    v1 = tmp_path / "v1"
    (v1 / "memory").mkdir(parents=True)
    (v1 / "memory" / "memory.limit_in_bytes").write_text(f"{2**30}\n")
    (v1 / "memory" / "memory.usage_in_bytes").write_text(f"{2**29}\n")
    assert memory.cgroup_available(v1) == 2**29
    (v1 / "memory" / "memory.limit_in_bytes").write_text(f"{2**63 - 4096}\n")   # v1's "no limit"
    assert memory.cgroup_available(v1) is None


def test_load_model_reports_memory(model):
    line = labkit.loading.memory_line(model)
    assert "weights 538 MB" in line and "memory-mapped" in line
    assert "46.1 kB per token" in line                    # 2 x 30 layers x 3 KV heads x 64 x 4 bytes
    assert "1024 tokens: 47 MB" in line


@linux
def test_sampler_keeps_the_peak():
    with memory.Sampler([os.getpid()], interval=0.01) as s:
        import mmap

        base = memory.process_memory().anon
        x = mmap.mmap(-1, 64 * 2**20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)   # 64 MiB, fresh
        x.write(b"\1" * len(x))                             # touched: resident
        s.sample()
        x.close()
    assert s.samples >= 2 and s.peak.anon >= base + 50 * 2**20
    assert s.peak.peak_rss >= s.peak.rss


def test_release_lets_a_model_be_freed(monkeypatch, model):
    import gc
    import weakref

    # A fresh bf16 load (another test may hold the session's bf16 model).
    monkeypatch.setattr(labkit.loading, "_loaded",
                        {k: m for k, m in labkit.loading._loaded.items() if k[2] != torch.bfloat16})
    m16 = labkit.load_model(device="cpu", dtype="bf16", progress=False)
    ref = weakref.ref(m16)
    labkit.loading.release(m16)
    del m16
    gc.collect()
    assert ref() is None
    assert labkit.load_model(device="cpu", dtype="fp32") is model      # the others are kept
