"""The loop: greedy tokens against transformers, cache against no cache, streaming, stopping."""

import pytest
import torch

import labkit


def hf_greedy(model, ids, n):
    with torch.inference_mode():
        out = model.hf.generate(ids[None], max_new_tokens=n, do_sample=False, min_new_tokens=n,
                                pad_token_id=model.tokenizer.pad_token_id or 0)
    return out[0, len(ids):].tolist()


@pytest.mark.parametrize("text", ["The capital of France is", "def fibonacci(n):"])
def test_greedy_tokens_match_transformers(model, text):
    ids = labkit.encode(model, text).ids
    gen = labkit.generate(model, ids, max_new_tokens=20, stop_at_eos=False)
    assert gen.token_ids == hf_greedy(model, ids, 20)


def test_paris_end_to_end(model):
    gen = labkit.generate(model, "The capital of France is", max_new_tokens=3)
    assert gen.text.startswith(" Paris")
    assert gen.steps[0].phase == "prefill" and gen.steps[1].phase == "decode"
    assert gen.ttft_s > 0 and gen.tpot_s > 0


def test_without_cache_same_tokens(model):
    with_cache = labkit.generate(model, "Once upon a time", max_new_tokens=12, stop_at_eos=False)
    without = labkit.generate(model, "Once upon a time", max_new_tokens=12, stop_at_eos=False,
                              use_cache=False)
    assert with_cache.token_ids == without.token_ids
    assert without.cache is None and all(s.cache_len == 0 for s in without.steps)


def test_steps_record_cache_growth(model):
    gen = labkit.generate(model, "The capital of France is", max_new_tokens=6, stop_at_eos=False)
    per_token = gen.cache.bytes_per_token
    assert [s.cache_len for s in gen.steps] == [5, 6, 7, 8, 9, 10]
    assert [s.cache_nbytes for s in gen.steps] == [n * per_token for n in range(5, 11)]
    c = model.config
    assert per_token == 2 * c.n_layers * c.n_kv_heads * c.head_dim * 4   # fp32: 4 bytes
    probs = [s.prob for s in gen.steps]
    assert all(0 < p <= 1 for p in probs)


def test_record_gives_the_decode_row(model):
    gen = labkit.generate(model, "The capital of France is", max_new_tokens=3, record=True,
                          stop_at_eos=False)
    c = model.config
    for step in gen.steps:
        assert step.attention.shape == (c.n_layers, c.n_heads, step.cache_len - 1 + 1)
        assert torch.allclose(step.attention.sum(-1), torch.ones(c.n_layers, c.n_heads), atol=1e-4)
    plain = labkit.generate(model, "The capital of France is", max_new_tokens=3, stop_at_eos=False)
    assert gen.token_ids == plain.token_ids


def test_streaming_never_splits_a_character(model):
    pieces = []
    prompt = [{"role": "user", "content": "用中文回答：法国的首都是哪里？"}]
    gen = labkit.generate(model, prompt, max_new_tokens=24, on_token=lambda piece, step: pieces.append(piece))
    assert "".join(pieces) == model.tokenizer.decode(gen.token_ids, skip_special_tokens=True)
    assert all("\ufffd" not in p for p in pieces[:-1])
    assert len(pieces) == len(gen.steps)


def test_stop_strings_and_eos(model):
    gen = labkit.generate(model, "The capital of France is", max_new_tokens=30, stop=["."])
    assert gen.finish_reason == "stop" and "." not in gen.text and gen.text.startswith(" Paris")
    chat = labkit.generate(model, "Say hi.", chat=True, max_new_tokens=60)
    assert chat.finish_reason == "eos"
    assert chat.token_ids[-1] in labkit.generate.__globals__["eos_ids"](model)


def test_sampling_with_seed_repeats(model):
    a = labkit.generate(model, "Once upon a time", max_new_tokens=10, method="top_p", top_p=0.9,
                        temperature=1.0, seed=3)
    b = labkit.generate(model, "Once upon a time", max_new_tokens=10, method="top_p", top_p=0.9,
                        temperature=1.0, seed=3)
    assert a.token_ids == b.token_ids


def test_beam_search_matches_transformers(model):
    ids = labkit.encode(model, "The capital of France is").ids
    ours = labkit.generate(model, ids, max_new_tokens=8, method="beam", num_beams=3, stop_at_eos=False)
    with torch.inference_mode():
        ref = model.hf.generate(ids[None], max_new_tokens=8, num_beams=3, do_sample=False,
                                early_stopping=False, length_penalty=1.0, eos_token_id=None,
                                pad_token_id=0)[0, len(ids):].tolist()
    assert ours.token_ids == ref


def test_beam_of_one_is_greedy(model):
    ids = labkit.encode(model, "Once upon a time").ids
    beam = labkit.generate(model, ids, max_new_tokens=8, method="beam", num_beams=1, stop_at_eos=False)
    greedy = labkit.generate(model, ids, max_new_tokens=8, stop_at_eos=False)
    assert beam.token_ids == greedy.token_ids


def test_cli(capsys):
    from labkit.__main__ import main

    assert main(["The capital of France is", "--max-new-tokens", "4"]) == 0
    out = capsys.readouterr().out
    assert "Paris" in out and "TTFT" in out and "TPOT" in out and "KV cache" in out
    assert main(["x", "--temperature", "-1", "--method", "temperature"]) == 2
    assert "temperature" in capsys.readouterr().err
