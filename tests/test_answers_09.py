"""The numbers in docs/answers/09_faster_decoding.md, recomputed independently.

Each `**Answer N:**` line of the key is parsed and checked against a formula
written out here (tile counts, score bytes, Leviathan et al.'s expected tokens
per pass), the model's config, and the operations and forward passes counted on
the model, so that the key cannot silently go wrong.
"""


import pytest

from answer_key import AnswerKey, numbers

KEY = AnswerKey("09_faster_decoding")
answer = KEY.answer


def test_answer_1_tiles():
    computed, skipped, block, T = numbers(answer(1))
    n = T // block                                     # query blocks = key blocks
    assert computed == n * (n + 1) / 2                 # causal: block i needs key blocks 0..i
    assert skipped == n * n - computed


def test_answer_1_against_the_kernel():
    import torch

    from labkit import tiled_attention

    computed, skipped, block, T = (int(x) for x in numbers(answer(1)))
    q = k = v = torch.zeros(1, 1, T, 4)
    _, stats = tiled_attention.flash_attention(q, k, v, block_size=block, return_stats=True)
    assert (stats.tiles_computed, stats.tiles_skipped) == (computed, skipped)


def test_answer_2_score_bytes(model):
    c = model.config
    scores, tiles = numbers(answer(2))
    assert scores == c.n_heads * 32768 ** 2 * 4       # heads x T^2 x fp32
    assert tiles == c.n_heads * 64 * 64 * 4


def test_answer_3_expected_speedup():
    per_pass, speedup, gamma, best_gamma, best = numbers(answer(3))
    alpha, c = 0.8, 0.25
    assert gamma == 4
    geometric = sum(alpha ** i for i in range(int(gamma) + 1))      # 1 + a + ... + a^gamma
    assert per_pass == pytest.approx(geometric, abs=1e-4)
    assert speedup == pytest.approx(geometric / (gamma * c + 1), abs=1e-4)
    speedups = {g: sum(alpha ** i for i in range(g + 1)) / (g * c + 1) for g in range(1, 11)}
    assert best_gamma == max(speedups, key=speedups.get)
    assert best == pytest.approx(speedups[best_gamma], abs=1e-3)


# The copying prompt of notebook 09, section 3a.
COPY_PROMPT = ("Change the name Alice to Bob in this text: Alice went to the market on Monday. "
               "Alice bought bread, milk and eggs. Then Alice walked home with her friend.")


def test_answer_4_counted(model):
    from labkit import speculative

    values = [int(x) for x in numbers(answer(4))]
    passes, accepted, drafted = values[0:4], values[4:8], values[8:12]
    assert len(values) == 12
    for i, num_draft in enumerate((1, 3, 5, 10)):
        gen = speculative.speculative_generate(model, COPY_PROMPT, max_new_tokens=24, chat=True,
                                               num_draft=num_draft)
        assert len(gen.token_ids) == 24
        assert (gen.forward_passes, gen.accepted, gen.drafted) == (passes[i], accepted[i], drafted[i])


def test_answer_5_launches(model):
    from labkit import cuda_graphs

    kernels, per_launch_us, launch_ms, read_ms = numbers(answer(5))
    ops, _ = cuda_graphs.measure_decode_step(model, context=32, repeats=1)
    assert kernels == ops.kernels                      # counted on the model, as in section 2
    assert launch_ms == pytest.approx(kernels * per_launch_us / 1e3, abs=1e-3)
    assert read_ms == pytest.approx(model.weight_nbytes / 3.35e12 * 1e3, abs=1e-3)
