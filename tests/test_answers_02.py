"""The numbers in docs/answers/02_embeddings_positions.md, recomputed."""

import math
import re

import pytest
import torch
import torch.nn.functional as F
from transformers import GPT2Config

import labkit

from answer_key import AnswerKey, numbers

KEY = AnswerKey("02_embeddings_positions")
answer = KEY.answer


def analogy(model, a: str, b: str, c: str) -> str:
    """The token nearest (cosine) to E[a] - E[b] + E[c], the three words left out."""
    E = model.hf.get_input_embeddings().weight.detach().float()
    ia, ib, ic = (model.tokenizer(w)["input_ids"][0] for w in (a, b, c))
    scores = F.normalize(E, dim=-1) @ F.normalize(E[ia] - E[ib] + E[ic], dim=0)
    scores[[ia, ib, ic]] = -1
    return labkit.token_strings(model.tokenizer, [int(scores.argmax())])[0]


def test_answer_2_analogies(model):
    stated = re.findall(r'"([^"]*)"', answer(2))        # " swam", "Italy", " Rome"
    assert analogy(model, " walked", " walk", " swim") == stated[0]
    assert analogy(model, " Paris", " France", " Italy") == stated[1] != stated[2]


def test_answer_3_sinusoidal_dots():
    pe = labkit.sinusoidal_positions(64, 64)
    omega = 10000.0 ** (-torch.arange(0, 64, 2) / 64)
    stated = numbers(answer(3))                          # 32.0 0 | 30.9 1 | 18.9 20 (and the p's)
    for value, k in [(stated[-6], stated[-5]), (stated[-4], stated[-3]), (stated[-2], stated[-1])]:
        k = int(k)
        assert value == pytest.approx((pe[3] @ pe[3 + k]).item(), abs=0.05)
        assert value == pytest.approx(torch.cos(k * omega).sum().item(), abs=0.05)   # sum of cos(k w_i)


def test_answer_4_learned_tables(model):
    gpt2 = GPT2Config()
    stated = numbers(answer(4))                          # 2 786432 0.63 | 2 4718592 3.5 (the 2s of "GPT-2", "SmolLM2")
    gpt2_table = gpt2.n_positions * gpt2.n_embd
    smol_table = model.config.max_len * model.config.d_model
    assert stated[1] == gpt2_table
    assert stated[2] == pytest.approx(100 * gpt2_table / 124e6, abs=0.005)   # GPT-2 small: 124 M parameters
    assert stated[4] == smol_table
    assert stated[5] == pytest.approx(100 * smol_table / model.n_params, abs=0.05)


def test_answer_5_wavelength():
    wavelengths = [2 * math.pi * 10000 ** (2 * i / 64) for i in range(32)]
    best = min(range(32), key=lambda i: abs(wavelengths[i] - 64))
    pair, wavelength = numbers(answer(5))
    assert pair == best
    assert wavelength == pytest.approx(wavelengths[best], abs=0.005)
