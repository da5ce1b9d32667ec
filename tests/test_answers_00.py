"""The numbers in docs/answers/00_overview.md, recomputed from the model.

Each `**Answer N:**` line of the key is parsed and checked against an
independent computation, so that the key cannot silently go wrong when the
model, labkit or the notebook changes.
"""

import re

import pytest

import labkit
from labkit import costs

from answer_key import AnswerKey, numbers

KEY = AnswerKey("00_overview")
answer = KEY.answer


def next_token_probs(model, prompt):
    return model.forward(labkit.encode(model, prompt).ids)[-1].softmax(-1)


def test_answer_1_germany(model):
    probs = next_token_probs(model, "The capital of Germany is")
    best = int(probs.argmax())
    stated_token = re.search(r'"([^"]*)"', answer(1)).group(1)
    assert labkit.token_strings(model.tokenizer, [best]) == [stated_token]
    assert numbers(answer(1))[-1] == pytest.approx(probs[best].item(), abs=0.0015)


def test_answer_2_top10_mass(model):
    stated = numbers(answer(2))
    france = next_token_probs(model, "The capital of France is").topk(10).values.sum().item()
    food = next_token_probs(model, "My favourite food is").topk(10).values.sum().item()
    assert stated[0] == 10                                     # "top 10"
    assert stated[1] == pytest.approx(france, abs=0.0015)
    assert stated[2] == pytest.approx(food, abs=0.0015)


def test_answer_3_top_p_half(model):
    logits = model.forward(labkit.encode(model, "The capital of France is").ids)[-1]
    draws = [labkit.sample(logits, method="top_p", top_p=0.5, seed=s)[0] for s in range(10)]
    count = labkit.token_strings(model.tokenizer, draws).count(" Paris")
    assert numbers(answer(3))[-2:] == [count, 10]


def test_answer_4_cache_share(model):
    gen = labkit.generate(model, "The capital of France is", max_new_tokens=64, stop_at_eos=False)
    n_positions = gen.steps[-1].cache_len                     # the prompt and 63 fed-back tokens
    share = n_positions * costs.kv_bytes_per_token(model.config, 4) / model.weight_nbytes
    stated = numbers(answer(4))
    assert len(gen.steps) == 64 and n_positions == 5 + 63
    assert stated[0] == n_positions
    assert stated[1] == pytest.approx(100 * share, abs=0.05)


def test_answer_4_stops_at_eos(model):
    gen = labkit.generate(model, "The capital of France is", max_new_tokens=64)
    assert gen.finish_reason == "eos"
    assert numbers(answer(4))[-1] == len(gen.steps)
