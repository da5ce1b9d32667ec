"""The numbers in docs/answers/10_serving.md, recomputed independently.

Each `**Answer N:**` line of the key is parsed and checked against a rerun of
the simulation (labkit.batching, deterministic with the fixed CostModel()),
with each figure recomputed here from the request records or from the cost
formula written out here, so that the key cannot silently go wrong.
"""

import re
from pathlib import Path

import pytest

from labkit import batching

KEY = Path(__file__).resolve().parents[1] / "docs" / "answers" / "10_serving.md"
BASE, PER_SEQ, PER_PROMPT_TOKEN = 0.020, 0.002, 0.0005        # CostModel()'s defaults, written out


def answer(n: str) -> str:
    found = re.search(rf"^\*\*Answer {n}:\*\*(.*)$", KEY.read_text(encoding="utf-8"), re.M)
    assert found, f"no '**Answer {n}:**' line in {KEY}"
    return found.group(1).strip()


def numbers(text: str) -> list[float]:
    """The numbers in text, skipping digits that are part of a name (p90, e2e)."""
    return [float(x.replace(",", "")) for x in re.findall(r"(?<![A-Za-z\d.])\d[\d,]*\.?\d*", text)]


def nearest_rank(values, q):
    """The smallest value with at least q% of the values at or below it."""
    return min(x for x in values if 100 * sum(v <= x for v in values) >= q * len(values))


def scenario(rate=8.0, max_batch=8):
    reqs = batching.make_requests(n=40, rate_per_s=rate, seed=0)
    assert batching.CostModel() == batching.CostModel(BASE, PER_SEQ, PER_PROMPT_TOKEN)
    return reqs, batching.compare(reqs, max_batch=max_batch, cost=batching.CostModel())


def ttfts(result):
    return [rec.first_token_s - rec.request.arrival_s for rec in result.records]   # from the arrival


def test_answer_1_light_and_heavy_load():
    rate, ratio, p90_static, p90_cont = numbers(answer("1a"))
    _, res = scenario(rate)
    st, co = res["static"], res["continuous"]
    assert ratio == pytest.approx(co.throughput / st.throughput, abs=0.005)
    assert p90_static == pytest.approx(nearest_rank(ttfts(st), 90), abs=0.005)
    assert p90_cont == pytest.approx(nearest_rank(ttfts(co), 90), abs=0.005)
    rate, ratio = numbers(answer("1b"))
    _, res = scenario(rate)
    assert ratio == pytest.approx(res["continuous"].throughput / res["static"].throughput, abs=0.005)


def test_answer_2_fullest_step():
    fullest, allowed = numbers(answer(2))
    reqs = batching.make_requests(n=40, rate_per_s=8.0, seed=0)
    r = batching.simulate(reqs, "continuous", max_batch=int(allowed), cost=batching.CostModel())
    assert fullest == max(len(s.running) for s in r.steps) < allowed


def test_answer_3_static_without_streaming():
    without, with_streaming = numbers(answer(3))
    _, res = scenario()
    st = res["static"]
    batch_end = {}
    for rec in st.records:
        batch_end[rec.start_s] = max(batch_end.get(rec.start_s, 0.0), rec.finish_s)
    returns = [batch_end[rec.start_s] - rec.request.arrival_s for rec in st.records]
    assert without == pytest.approx(sum(returns) / len(returns), abs=0.005)
    assert with_streaming == pytest.approx(sum(rec.finish_s - rec.request.arrival_s for rec in st.records) / 40,
                                           abs=0.005)


def test_answer_4_goodput():
    g_static, met_static, n, g_cont, met_cont, n2 = numbers(answer(4))
    _, res = scenario()
    for g, met, r in ((g_static, met_static, res["static"]), (g_cont, met_cont, res["continuous"])):
        ok = [rec for rec in r.records
              if rec.first_token_s - rec.request.arrival_s <= 0.5
              and (rec.finish_s - rec.first_token_s) / (rec.request.output_len - 1) <= 0.050]
        span = max(rec.finish_s for rec in r.records) - min(rec.request.arrival_s for rec in r.records)
        assert met == len(ok) and n == n2 == 40
        assert g == pytest.approx(len(ok) / span, abs=0.0005)


def test_answer_5_longest_step_and_chunking():
    seconds_ms, prompt_tokens = numbers(answer("5a"))
    _, res = scenario()
    longest = max(res["continuous"].steps, key=lambda s: s.seconds)
    reqs = {r.request.id: r.request for r in res["continuous"].records}
    assert prompt_tokens == sum(reqs[i].prompt_len for i in longest.prefilled)
    decoding = len(longest.running) - len(longest.prefilled)
    assert seconds_ms == pytest.approx(1e3 * (BASE + PER_SEQ * decoding + PER_PROMPT_TOKEN * prompt_tokens))
    assert seconds_ms == pytest.approx(longest.seconds * 1e3)
    (chunked_ms,) = numbers(answer("5b"))
    assert chunked_ms == pytest.approx(1e3 * (BASE + PER_SEQ * 7 + PER_PROMPT_TOKEN * 64))
