"""labkit.batching: the static vs continuous batching simulation."""

import random
from types import SimpleNamespace

import pytest

from labkit import batching as B
from labkit import charts


@pytest.fixture(scope="module")
def busy():
    """A queue that keeps the engine busy: arrivals faster than it can serve one at a time."""
    return B.make_requests(n=30, rate_per_s=6.0, seed=1)


def test_requests_are_deterministic():
    a, b = B.make_requests(10, 2.0, seed=3), B.make_requests(10, 2.0, seed=3)
    assert a == b and a != B.make_requests(10, 2.0, seed=4)
    assert a[0].arrival_s == 0 and all(x.arrival_s <= y.arrival_s for x, y in zip(a, a[1:]))
    assert all(16 <= r.prompt_len <= 128 and 4 <= r.output_len <= 96 for r in a)
    with pytest.raises(ValueError):
        B.make_requests(0)
    with pytest.raises(ValueError):
        B.make_requests(3, output_len=(5, 2))


def test_cost_model():
    c = B.CostModel(0.01, 0.002, 0.001)
    assert c.step_s(0) == 0
    assert c.step_s(4) == pytest.approx(0.018)
    assert c.step_s(2, prefill_tokens=10) == pytest.approx(0.01 + 0.004 + 0.01)


def test_cost_model_fitted_from_a_sweep():
    sweep = SimpleNamespace(batch_sizes=[1, 2, 4, 8], decode_s=[0.012, 0.014, 0.018, 0.026],
                            prefill_s=[0.016, 0.032, 0.064, 0.128], prompt_len=16)
    c = B.CostModel.from_sweep(sweep)
    assert c.decode_base_s == pytest.approx(0.010) and c.decode_per_seq_s == pytest.approx(0.002)
    assert c.prefill_per_token_s == pytest.approx(0.001)
    # Noise that tilts the line down never gives a negative cost per sequence.
    noisy = SimpleNamespace(batch_sizes=[1, 2], decode_s=[0.02, 0.019], prefill_s=[0.01, 0.02], prompt_len=8)
    assert B.CostModel.from_sweep(noisy).decode_per_seq_s == 0
    # A prefill with a fixed part (the weight read, 10 ms) + 1 ms a token: only the
    # 1 ms is per token; the fixed part is the step's base, charged once a step.
    fixed = SimpleNamespace(batch_sizes=[1, 2, 4], decode_s=[0.012, 0.014, 0.018],
                            prefill_s=[0.010 + 0.001 * 16 * b for b in (1, 2, 4)], prompt_len=16)
    assert B.CostModel.from_sweep(fixed).prefill_per_token_s == pytest.approx(0.001)


@pytest.mark.parametrize("policy", ["static", "continuous"])
def test_every_request_gets_all_its_tokens(busy, policy):
    r = B.simulate(busy, policy, max_batch=4)
    produced = {q.id: 0 for q in busy}
    for step in r.steps:
        assert len(step.running) <= 4 and step.slots <= 4
        for i in step.running:
            produced[i] += 1
    assert produced == {q.id: q.output_len for q in busy}
    for rec in r.records:
        assert rec.request.arrival_s <= rec.start_s < rec.first_token_s <= rec.finish_s
    assert r.tokens == sum(q.output_len for q in busy)
    # Steps follow each other without overlapping.
    assert all(a.start_s + a.seconds <= b.start_s + 1e-12 for a, b in zip(r.steps, r.steps[1:]))
    assert 0 < r.slot_utilisation <= 1


def test_deterministic(busy):
    a, b = B.compare(busy, 4), B.compare(busy, 4)
    assert a["static"].summary() == b["static"].summary()
    assert a["continuous"].summary() == b["continuous"].summary()


def test_static_batches_do_not_take_newcomers(busy):
    r = B.simulate(busy, "static", max_batch=4)
    # Each request starts exactly when a batch starts, and a batch's slots are
    # occupied (finished sequences as padding) until its longest request ends.
    batch_starts = {s.start_s for s in r.steps if s.prefilled}
    assert {rec.start_s for rec in r.records} <= batch_starts
    for prev, s in zip(r.steps, r.steps[1:]):
        if not s.prefilled:                       # inside a batch: requests only leave
            assert set(s.running) <= set(prev.running) and s.slots == prev.slots
    assert r.padding_utilisation < 1


def test_continuous_beats_static_on_a_busy_queue(busy):
    res = B.compare(busy, max_batch=4)
    static, cont = res["static"], res["continuous"]
    assert cont.throughput > static.throughput
    assert cont.mean_latency_s < static.mean_latency_s
    assert cont.mean_ttft_s < static.mean_ttft_s
    assert cont.padding_utilisation == 1          # no padding slots
    assert cont.slot_utilisation > static.slot_utilisation


def test_one_slot_makes_the_policies_equal(busy):
    res = B.compare(busy, max_batch=1)
    assert res["static"].summary() | {"policy": ""} == res["continuous"].summary() | {"policy": ""}


def test_idle_engine_waits_for_arrivals():
    reqs = [B.Request(0, 0.0, 10, 2), B.Request(1, 100.0, 10, 2)]
    for policy in ("static", "continuous"):
        r = B.simulate(reqs, policy, max_batch=4)
        assert r.records[1].start_s == 100.0
        assert r.busy_s < 1 < r.makespan_s


def test_bad_arguments(busy):
    with pytest.raises(ValueError, match="policy"):
        B.simulate(busy, "dynamic")
    with pytest.raises(ValueError, match="max_batch"):
        B.simulate(busy, "static", max_batch=0)


def test_charts(busy):
    res = B.compare(busy, max_batch=4)
    fig = charts.timeline_chart(res)
    assert len([t for t in fig.data if t.type == "bar"]) == 5          # waiting, running x 2, static padding
    assert "static" in fig.layout.annotations[0].text and "continuous" in fig.layout.annotations[1].text
    fig = charts.summary_chart(res)
    assert len(fig.data) == 4 and list(fig.data[0].x) == ["static", "continuous"]


# --- percentiles: nearest rank, against the definition written out here ---------

def nearest_rank(values, q):
    """The smallest value with at least q% of the values at or below it (q in 0-100)."""
    return min(x for x in values if 100 * sum(v <= x for v in values) >= q * len(values))


@pytest.fixture(scope="module")
def one_result():
    return B.simulate([B.Request(0, 0.0, 4, 2)], "continuous")


@pytest.mark.parametrize("values, q, expected", [
    (range(1, 11), 50, 5), (range(1, 11), 90, 9), (range(1, 11), 100, 10), (range(1, 11), 0, 1),
    (range(1, 11), 91, 10), (range(1, 11), 10, 1), (range(1, 11), 11, 2),
    (range(1, 5), 50, 2), (range(1, 5), 75, 3), (range(1, 5), 76, 4), (range(1, 5), 25, 1),
    ([7.5], 0, 7.5), ([7.5], 50, 7.5), ([7.5], 100, 7.5),
    ([3, 1, 2], 50, 2),                          # unsorted input
    (range(1, 101), 7, 7),                       # 7/100 x 100 = 7.000000000000001 in floats
])
def test_percentile_hand_checked(one_result, values, q, expected):
    # The old round(q/100 x n + 0.5) - 1 rounded halves to even: p50 of 1..10 gave 6, p90 gave 10.
    assert one_result.percentile(q, list(values)) == expected


def test_percentile_matches_the_definition_on_random_data(one_result):
    rng = random.Random(0)
    for _ in range(500):
        n = rng.randint(1, 40)
        values = [rng.randint(0, 9) for _ in range(n)] if rng.random() < 0.5 \
            else [rng.random() for _ in range(n)]      # with and without ties
        q = rng.randint(0, 100)
        assert one_result.percentile(q, values) == nearest_rank(values, q), (values, q)


def test_p90_in_the_summary_is_the_latencies_nearest_rank(busy):
    r = B.simulate(busy, "static", max_batch=4)
    latencies = [rec.finish_s - rec.request.arrival_s for rec in r.records]
    # A percentile is one of the values, so it is equal, not close.
    assert r.summary()["p90_latency_s"] == nearest_rank(latencies, 90)
    assert r.percentile(100) == max(latencies) and r.percentile(0) == min(latencies)


# --- the serving metrics: TTFT from arrival (queueing included), TPOT, ITL, goodput --

@pytest.fixture(scope="module")
def three():
    """Two requests arriving together, a third 50 ms later that finds both slots taken.
    Worked by hand with CostModel(): step = 20 ms + 2 ms x decoding + 0.5 ms x prompt tokens."""
    reqs = [B.Request(0, 0.0, prompt_len=100, output_len=5), B.Request(1, 0.0, prompt_len=20, output_len=3),
            B.Request(2, 0.05, prompt_len=40, output_len=4)]
    return B.simulate(reqs, "continuous", max_batch=2, cost=B.CostModel())


def test_metrics_worked_by_hand(three):
    r0, r1, r2 = three.records
    # Step 1 prefills both prompts (120 tokens, nobody decoding): 20 + 60 = 80 ms.
    assert r0.ttft_s == r1.ttft_s == pytest.approx(0.080) and r0.queue_s == r1.queue_s == 0
    # Steps 2 and 3 decode both (24 ms each); request 1 (3 tokens) is done at 128 ms.
    assert r1.itl_s == pytest.approx([0.024, 0.024]) and r1.e2e_s == pytest.approx(0.128)
    # Request 2 waited from 50 ms to 128 ms, then its 40-token prefill ran beside request 0's
    # decode: 20 + 2 + 20 = 42 ms. Its TTFT counts the wait: 78 + 42 = 120 ms.
    assert r2.queue_s == pytest.approx(0.078) and r2.prefill_step_s == pytest.approx(0.042)
    assert r2.ttft_s == pytest.approx(0.120)
    # ... and request 0, decoding in that step, waited for the newcomer's prefill.
    assert r0.itl_s == pytest.approx([0.024, 0.024, 0.042, 0.024])
    assert r0.tpot_s == pytest.approx((0.024 * 3 + 0.042) / 4)
    assert r2.itl_s == pytest.approx([0.024, 0.022, 0.022])     # the last two steps decode it alone


@pytest.mark.parametrize("policy", ["static", "continuous"])
def test_metric_identities(busy, policy):
    r = B.simulate(busy, policy, max_batch=4)
    for rec in r.records:
        n = rec.request.output_len
        assert rec.ttft_s == pytest.approx(rec.queue_s + rec.prefill_step_s)
        assert rec.ttft_s == rec.first_token_s - rec.request.arrival_s     # from the arrival
        assert rec.e2e_s == rec.latency_s == rec.finish_s - rec.request.arrival_s
        assert len(rec.token_s) == n and rec.token_s[0] == rec.first_token_s and rec.token_s[-1] == rec.finish_s
        assert len(rec.itl_s) == n - 1
        if n > 1:
            assert rec.tpot_s == pytest.approx(sum(rec.itl_s) / (n - 1))
            assert rec.e2e_s == pytest.approx(rec.ttft_s + (n - 1) * rec.tpot_s)
    assert len(r.itls()) == r.tokens - len(r.records)
    assert r.summary()["p99_itl_s"] == B.percentile(r.itls(), 99)
    assert r.summary()["p90_ttft_s"] == B.percentile(r.ttfts(), 90)
    assert r.mean_tpot_s == pytest.approx(sum(r.tpots()) / len(r.tpots()))


def test_ttft_includes_the_queue():
    """A request arriving at a busy static engine waits for the whole batch: its TTFT holds that wait."""
    reqs = [B.Request(0, 0.0, 10, 50), B.Request(1, 0.001, 10, 2)]
    r = B.simulate(reqs, "static", max_batch=4)
    first, late = r.records
    assert late.start_s == first.finish_s
    assert late.ttft_s > late.queue_s >= first.finish_s - 0.001 > 1.0
    assert late.ttft_s == pytest.approx(late.queue_s + B.CostModel().step_s(0, 10))


def test_one_token_answer_has_no_tpot():
    r = B.simulate([B.Request(0, 0.0, 8, 1)], "continuous")
    rec = r.records[0]
    assert rec.itl_s == [] and rec.tpot_s != rec.tpot_s and r.tpots() == []
    assert rec.e2e_s == rec.ttft_s
    assert r.goodput(1.0, 1e-9) == pytest.approx(1 / r.makespan_s)   # nothing to miss on TPOT


def test_goodput_counts_only_requests_within_both_targets(three):
    span = three.makespan_s
    assert three.goodput(10, 10) == pytest.approx(3 / span) == pytest.approx(three.request_throughput)
    assert three.goodput(0.1, 10) == pytest.approx(2 / span)          # request 2's TTFT is 120 ms
    assert three.goodput(10, 0.025) == pytest.approx(2 / span)        # request 0's TPOT is 28.5 ms
    assert three.goodput(0.1, 0.025) == pytest.approx(1 / span)
    for bad in ((0, 1), (1, -1)):
        with pytest.raises(ValueError, match="slo"):
            three.goodput(*bad)


def test_continuous_batching_stalls_decode_behind_prefills(busy):
    """Static batching's gaps are plain decode steps; continuous batching puts newcomers'
    prefills into others' decode steps, so its ITL tail is longer."""
    cost = B.CostModel()
    res = B.compare(busy, max_batch=4, cost=cost)
    assert max(res["static"].itls()) <= cost.step_s(4) + 1e-12
    assert max(res["continuous"].itls()) > cost.step_s(4) + cost.prefill_per_token_s * 16


def test_percentile_is_timing_percentile():
    from labkit import timing
    assert B.percentile is timing.percentile
    assert B.percentile(range(1, 11), 90) == 9 and B.percentile([], 50) != B.percentile([], 50)
    with pytest.raises(ValueError):
        B.percentile([1, 2], 101)


def test_more_bad_arguments():
    with pytest.raises(ValueError, match="requests"):
        B.simulate([], "static")
    with pytest.raises(ValueError, match="rate_per_s"):
        B.make_requests(3, rate_per_s=0)
    with pytest.raises(ValueError, match="batch"):
        B.CostModel().step_s(-1)
