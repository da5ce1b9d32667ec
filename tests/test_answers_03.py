"""The numbers in docs/answers/03_attention.md, recomputed."""

import math

import pytest
import torch

import labkit
from labkit import charts

from answer_key import AnswerKey, numbers

KEY = AnswerKey("03_attention")
answer = KEY.answer


@pytest.fixture(scope="module")
def attentions(model):
    enc = labkit.encode(model, "The capital of France is")
    trace = labkit.Trace()
    model.forward(enc.ids, trace=trace)
    return enc.tokens, torch.stack(trace.attentions)      # (layers, heads, queries, keys)


def test_answer_1_layer0_head0(attentions):
    tokens, attn = attentions
    layer, head, weight = numbers(answer(1))
    assert (layer, head) == (0, 0)
    assert weight == pytest.approx(attn[0, 0, -1, tokens.index(" France")].item(), abs=0.0015)


def test_answer_2_row_maxima(model, attentions):
    tokens, attn = attentions
    france = tokens.index(" France")
    weights = attn[:, :, -1, france]
    layer, head = divmod(int(weights.argmax()), model.config.n_heads)   # the notebook's choice of head
    stated = numbers(answer(2))                                          # 1.000 | 0.804 0.903
    assert stated[0] == 1.0
    rows = attn[layer, head].max(dim=-1).values                         # with the division (the model's own)
    assert stated[1] == pytest.approx(rows[france].item(), abs=0.0015)
    assert stated[2] == pytest.approx(rows[-1].item(), abs=0.0015)


def test_answer_4_slowest_pair(model):
    c = model.config
    omega_last = c.rope_theta ** (-(c.head_dim - 2) / c.head_dim)      # the formula, not labkit
    angle = c.max_len * omega_last
    stated = numbers(answer(4))                                          # 8192 0.117 0.019 438000
    assert stated[0] == c.max_len
    assert stated[1] == pytest.approx(angle, abs=0.0005)
    assert stated[2] == pytest.approx(angle / (2 * math.pi), abs=0.0005)
    assert stated[3] == pytest.approx(2 * math.pi / omega_last, rel=0.005)
    assert angle == pytest.approx(labkit.model_rope_angles(model, [c.max_len])[0, -1].item(), rel=1e-5)


def test_answer_5_llama2_70b():
    gqa, mha = numbers(answer(5))
    assert gqa == 2 * 80 * 8 * 128 * 2 * 4096 == charts.kv_cache_bytes(80, 8, 128, 4096, 2)
    assert mha == 2 * 80 * 64 * 128 * 2 * 4096 == charts.kv_cache_bytes(80, 64, 128, 4096, 2)
