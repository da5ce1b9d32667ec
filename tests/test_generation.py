"""The loop: tokens against transformers and against a loop written out by hand,
streaming, stopping, timing.

References never come from `generate` itself: greedy and beam tokens from
`model.hf.generate`, sampled tokens from a prefill + decode loop written here
(model.forward on a KV cache, labkit.sample with one torch.Generator seeded
as documented), text from the tokenizer.
"""

import time

import pytest
import torch

import labkit
from labkit.generation import Generation, Step

ONCE = "Once upon a time"


def hf_greedy(model, ids, n, **kwargs):
    with torch.inference_mode():
        out = model.hf.generate(ids[None], max_new_tokens=n, do_sample=False, min_new_tokens=n,
                                pad_token_id=model.tokenizer.pad_token_id or 0, **kwargs)
    return out[0, len(ids):].tolist()


_HF_GREEDY = {}


def hf_greedy_once(model, n=16):
    """transformers' greedy continuation of ONCE (computed once per session)."""
    if n not in _HF_GREEDY:
        _HF_GREEDY[n] = hf_greedy(model, labkit.encode(model, ONCE).ids, n)
    return _HF_GREEDY[n]


@pytest.mark.parametrize("text", ["The capital of France is", "def fibonacci(n):"])
def test_greedy_tokens_match_transformers(model, text):
    ids = labkit.encode(model, text).ids
    gen = labkit.generate(model, ids, max_new_tokens=20, stop_at_eos=False)
    assert gen.token_ids == hf_greedy(model, ids, 20)
    assert gen.finish_reason == "length" and len(gen.steps) == 20
    assert gen.text == model.tokenizer.decode(gen.token_ids, skip_special_tokens=True)


def test_paris_end_to_end(model):
    t0 = time.perf_counter()
    gen = labkit.generate(model, "The capital of France is", max_new_tokens=4)
    wall = time.perf_counter() - t0
    assert gen.text.startswith(" Paris")
    assert [s.phase for s in gen.steps] == ["prefill", "decode", "decode", "decode"]
    assert [s.index for s in gen.steps] == [0, 1, 2, 3]
    # Each step times itself only: all positive, and together no longer than the call.
    assert all(s.seconds > 0 for s in gen.steps)
    assert sum(s.seconds for s in gen.steps) <= gen.e2e_s <= wall
    assert gen.prefill_s == gen.steps[0].seconds <= gen.ttft_s and gen.tpot_s > 0


def test_timing_properties():
    """TTFT, prefill time, e2e, TPOT (mean), its median and the ITL percentiles
    on hand-made steps: each Step's at_s is when its token came out."""
    def gen_with(at, work=None, tokenize_s=0.0):
        work = work or [0.001] * len(at)
        steps = [Step(i, 0, "", 1.0, w, 0, 0, "prefill" if i == 0 else "decode", at_s=t)
                 for i, (t, w) in enumerate(zip(at, work))]
        return Generation("", [], steps=steps, tokenize_s=tokenize_s)

    g = gen_with([0.5, 0.8, 0.9, 1.1], work=[0.45, 0.29, 0.09, 0.19], tokenize_s=0.04)
    assert g.ttft_s == 0.5                       # from the request, not the prefill's 0.45
    assert g.prefill_s == 0.45 and g.tokenize_s == 0.04
    assert g.e2e_s == 1.1
    assert g.itl_s == pytest.approx([0.3, 0.1, 0.2])
    assert g.tpot_s == pytest.approx(0.2)        # (1.1 - 0.5) / (4 - 1)
    assert g.tpot_median_s == pytest.approx(0.2) # the middle of 0.1, 0.2, 0.3
    assert g.tokens_per_s == pytest.approx(5.0)
    # One slow gap moves the mean, not the median: 0.9, 0.05, 0.06, 0.07, 0.04.
    g = gen_with([0.01, 0.91, 0.96, 1.02, 1.09, 1.13])
    assert g.tpot_s == pytest.approx(1.12 / 5)
    assert g.tpot_median_s == pytest.approx(0.06)
    assert g.itl_percentile(50) == pytest.approx(0.06) and g.itl_percentile(90) == pytest.approx(0.9)
    assert g.itl_percentile(0) == pytest.approx(0.04) and g.itl_percentile(100) == pytest.approx(0.9)
    g = gen_with([0.25, 0.375])
    assert g.ttft_s == 0.25 and g.tpot_s == pytest.approx(0.125) and g.tokens_per_s == pytest.approx(8.0)
    one = gen_with([0.25])                       # one token: no gap to time
    assert one.ttft_s == 0.25 and one.tpot_s != one.tpot_s and one.tokens_per_s != one.tokens_per_s
    assert one.itl_s == [] and one.tpot_median_s != one.tpot_median_s
    empty = gen_with([])
    assert empty.ttft_s != empty.ttft_s and empty.e2e_s != empty.e2e_s
    assert "TTFT 250.0 ms" in repr(one)


def test_ttft_counts_tokenization_and_the_prefill(model):
    """Given text, TTFT runs from the call: tokenizing + prefill <= TTFT <= the
    whole call, and the decode gaps add up to e2e - TTFT."""
    t0 = time.perf_counter()
    gen = labkit.generate(model, "The capital of France is", max_new_tokens=4, stop_at_eos=False)
    wall = time.perf_counter() - t0
    assert gen.tokenize_s > 0
    assert gen.tokenize_s + gen.prefill_s <= gen.ttft_s <= gen.e2e_s <= wall
    assert sum(gen.itl_s) == pytest.approx(gen.e2e_s - gen.ttft_s)
    assert all(b.at_s > a.at_s for a, b in zip(gen.steps, gen.steps[1:]))
    # Each gap holds its step's work (plus the loop's own bookkeeping).
    assert all(gap >= s.seconds for gap, s in zip(gen.itl_s, gen.steps[1:]))


def test_without_cache_matches_transformers(model):
    ids = labkit.encode(model, ONCE).ids
    without = labkit.generate(model, ids, max_new_tokens=12, stop_at_eos=False, use_cache=False)
    assert without.token_ids == hf_greedy_once(model)[:12]
    assert without.finish_reason == "length"
    assert without.cache is None
    assert all(s.cache_len == 0 and s.cache_nbytes == 0 for s in without.steps)


def test_steps_record_cache_growth(model):
    ids = labkit.encode(model, "The capital of France is").ids
    gen = labkit.generate(model, ids, max_new_tokens=6, stop_at_eos=False)
    per_token = gen.cache.bytes_per_token
    assert [s.cache_len for s in gen.steps] == [5, 6, 7, 8, 9, 10]
    assert [s.cache_nbytes for s in gen.steps] == [n * per_token for n in range(5, 11)]
    c = model.config
    assert per_token == 2 * c.n_layers * c.n_kv_heads * c.head_dim * 4   # fp32: 4 bytes
    # Step.prob: the model's probability of the token, from transformers' logits.
    full = torch.cat([ids, torch.tensor(gen.token_ids)])
    with torch.inference_mode():
        hf_logits = model.hf(full[None]).logits[0, len(ids) - 1:-1].float()
    expected = hf_logits.softmax(-1)[torch.arange(6), torch.tensor(gen.token_ids)]
    assert torch.allclose(torch.tensor([s.prob for s in gen.steps]), expected, atol=1e-4)


def test_record_gives_the_decode_row(model):
    gen = labkit.generate(model, ONCE, max_new_tokens=3, record=True, stop_at_eos=False)
    c = model.config
    n_prompt = len(gen.prompt_ids)
    for i, step in enumerate(gen.steps):
        assert step.cache_len == n_prompt + i           # the new token enters the cache next step
        assert step.attention.shape == (c.n_layers, c.n_heads, n_prompt + i)   # one row over every key
        assert torch.allclose(step.attention.sum(-1), torch.ones(c.n_layers, c.n_heads), atol=1e-4)
    assert gen.prefill_trace is not None
    assert gen.token_ids == hf_greedy_once(model)[:3]


def test_streaming_never_splits_a_character(model):
    """The greedy continuation of this prompt is Chinese whose characters take
    two or three byte-level tokens each; 12 tokens end inside a character."""
    pieces, seen = [], []
    gen = labkit.generate(model, "法国的首都是巴黎。德国的首都是", max_new_tokens=12, stop_at_eos=False,
                          on_token=lambda piece, step: (pieces.append(piece), seen.append(step)))
    decode = model.tokenizer.decode
    assert len(pieces) == len(gen.steps) == 12 and seen == gen.steps
    assert [s.text for s in gen.steps] == pieces
    assert "".join(pieces) == decode(gen.token_ids, skip_special_tokens=True)
    assert "".join(pieces) == gen.text
    assert "" in pieces[:-1]                           # measured: a character did span tokens ...
    assert any("\u4e00" <= ch <= "\u9fff" for ch in gen.text)   # ... and the text is Chinese
    assert all("\ufffd" not in p for p in pieces[:-1])
    assert pieces[-1].endswith("\ufffd")               # cut off at the length limit mid-character: flushed
    for i in range(12):
        so_far = decode(gen.token_ids[:i + 1], skip_special_tokens=True)
        if not so_far.endswith("\ufffd"):              # whenever the text is whole, the stream has all of it
            assert "".join(pieces[:i + 1]) == so_far


def test_stop_strings(model):
    decode = model.tokenizer.decode
    gen = labkit.generate(model, "The capital of France is", max_new_tokens=30, stop=["."])
    full = decode(gen.token_ids, skip_special_tokens=True)
    assert gen.finish_reason == "stop" and gen.text.startswith(" Paris")
    assert gen.text == full[:full.index(".")]           # cut just before the stop string
    assert "." not in decode(gen.token_ids[:-1])         # stopped at the first token that made it
    # a plain string works too; stopping on the last allowed token is still "stop"
    last = labkit.generate(model, "The capital of France is", max_new_tokens=len(gen.token_ids), stop=".")
    assert last.token_ids == gen.token_ids and last.finish_reason == "stop" and last.text == gen.text
    # with several stop strings the text is cut at the earliest one found
    first = labkit.generate(model, "The capital of France is", max_new_tokens=5, stop=["ris", " P"])
    assert decode(first.token_ids) == " Paris"           # one token contained both
    assert first.finish_reason == "stop" and first.text == ""
    other = labkit.generate(model, "The capital of France is", max_new_tokens=5, stop=["xyz", "ris"])
    assert other.finish_reason == "stop" and other.text == " Pa"


def test_eos_and_length(model):
    prompt = "What is 2+2? Answer with just the number."
    eos = model.tokenizer.eos_token_id
    chat = labkit.generate(model, prompt, chat=True, max_new_tokens=30)
    n = len(chat.token_ids)
    assert chat.finish_reason == "eos" and n < 30          # measured: "2 + 2 = 4", 8 tokens
    assert chat.token_ids[-1] == eos and eos not in chat.token_ids[:-1]
    assert "4" in chat.text and chat.text == model.tokenizer.decode(chat.token_ids, skip_special_tokens=True)
    # EOS on the last allowed token is still "eos"
    exact = labkit.generate(model, prompt, chat=True, max_new_tokens=n)
    assert exact.token_ids == chat.token_ids and exact.finish_reason == "eos"
    # stop_at_eos=False runs past it to the length limit
    past = labkit.generate(model, prompt, chat=True, max_new_tokens=n + 1, stop_at_eos=False)
    assert past.token_ids[:n] == chat.token_ids and len(past.token_ids) == n + 1
    assert past.finish_reason == "length"
    one = labkit.generate(model, prompt, chat=True, max_new_tokens=1)
    assert one.token_ids == chat.token_ids[:1] and one.finish_reason == "length"
    none = labkit.generate(model, prompt, chat=True, max_new_tokens=0)
    assert none.token_ids == [] and none.steps == [] and none.text == "" and none.finish_reason == ""


def test_repetition_penalty_matches_transformers(model):
    ids = labkit.encode(model, ONCE).ids
    gen = labkit.generate(model, ids, max_new_tokens=12, repetition_penalty=1.5, stop_at_eos=False)
    assert gen.token_ids == hf_greedy(model, ids, 12, repetition_penalty=1.5)
    assert gen.token_ids != hf_greedy_once(model)[:12]   # the penalty changed the text (measured)


# ----------------------------------------------------------------------------
# Sampling: generate against a prefill + decode loop written out by hand
# ----------------------------------------------------------------------------

def sampled_by_hand(model, ids, n, method, seed, **kwargs):
    """Prefill, then decode one token at a time on a KV cache, drawing every
    token from one torch.Generator seeded with `seed` (what generate(seed=)
    documents). Returns the tokens and the model's probability of each."""
    g = torch.Generator(device=model.device)
    g.manual_seed(seed)
    cache = model.new_cache(max_len=len(ids) + n)
    previous = ids.tolist()
    tokens, probs = [], []
    for i in range(n):
        logits = model.forward(ids if i == 0 else torch.tensor(tokens[-1:]), cache=cache)[-1]
        token, _ = labkit.sample(logits, method, generator=g, previous_ids=previous, **kwargs)
        probs.append(float(logits.float().softmax(-1)[token]))
        tokens.append(token)
        previous.append(token)
    return tokens, probs


@pytest.mark.parametrize("method, kwargs, seed", [
    ("temperature", dict(temperature=1.5), 1),
    ("top_k", dict(temperature=1.5, top_k=20), 2),
    ("top_p", dict(temperature=1.5, top_p=0.9), 3),
    ("min_p", dict(temperature=1.5, min_p=0.05, repetition_penalty=1.3), 4),
])
def test_sampling_matches_a_loop_by_hand(model, method, kwargs, seed):
    n = 12
    ids = labkit.encode(model, ONCE).ids
    gen = labkit.generate(model, ids, max_new_tokens=n, method=method, seed=seed, stop_at_eos=False, **kwargs)
    tokens, probs = sampled_by_hand(model, ids, n, method, seed, **kwargs)
    assert gen.token_ids == tokens
    assert [s.token_id for s in gen.steps] == tokens
    assert [s.prob for s in gen.steps] == pytest.approx(probs, rel=1e-4, abs=1e-6)   # softmax at T = 1
    assert tokens != hf_greedy_once(model)[:n]           # sampling, not the argmax
    other = labkit.generate(model, ids, max_new_tokens=n, method=method, seed=seed + 100,
                            stop_at_eos=False, **kwargs)
    assert other.token_ids != tokens                     # another seed, another text


# ----------------------------------------------------------------------------
# The pieces: prefill, decode_one_token, recompute and the Decoder stepper
# ----------------------------------------------------------------------------

def test_the_phase_functions_agree_with_one_forward_pass(model):
    ids = labkit.encode(model, ONCE).ids
    with torch.inference_mode():
        full = model.hf(ids[None]).logits[0].float()               # transformers, every position
    cache = model.new_cache(max_len=len(ids))
    first = labkit.prefill(model, ids[:-1], cache)                  # (vocab,)
    assert first.shape == (model.config.vocab_size,) and cache.length == len(ids) - 1
    last = labkit.decode_one_token(model, ids[-1:], cache)          # one token against the cache
    assert cache.length == len(ids)
    baseline = labkit.recompute(model, ids)                         # the whole sequence, no cache
    assert torch.allclose(first, full[-2], atol=1e-4)
    assert torch.allclose(last, full[-1], atol=1e-4) and torch.allclose(baseline, full[-1], atol=1e-4)


def test_decoder_steps_are_generate(model):
    params = labkit.SamplingParams("top_p", temperature=1.5, top_p=0.9, seed=3)
    dec = labkit.Decoder(model, ONCE, 6, params, stop_at_eos=False)
    n_prompt = len(dec.prompt_ids)
    first = dec.step()
    assert first.phase == "prefill" and first.index == 0 and first.cache_len == n_prompt
    assert dec.last_logits.shape == dec.last_probs.shape == (model.config.vocab_size,)
    assert dec.last_probs[first.token_id] > 0 and float(dec.last_probs.sum()) == pytest.approx(1, abs=1e-5)
    more = dec.run(2)
    assert [s.index for s in more] == [1, 2] and {s.phase for s in more} == {"decode"}
    dec.run()
    assert dec.finished and dec.finish_reason == "length" and dec.step() is None and dec.run() == []
    gen = labkit.generate(model, ONCE, max_new_tokens=6, params=params, stop_at_eos=False)
    assert dec.token_ids == gen.token_ids and dec.text == gen.text
    assert dec.generation.token_ids == gen.token_ids and dec.cache.length == n_prompt + 5
    # generate's keywords make the same SamplingParams
    same = labkit.generate(model, ONCE, 6, "top_p", temperature=1.5, top_p=0.9, seed=3, stop_at_eos=False)
    assert same.token_ids == gen.token_ids


def test_decoder_params_apply_from_the_next_step(model):
    dec = labkit.Decoder(model, ONCE, 4, stop_at_eos=False)          # greedy
    dec.run(2)
    dec.params = labkit.SamplingParams("temperature", temperature=1.5, seed=1)
    dec.run()
    greedy = hf_greedy_once(model)[:4]
    assert dec.token_ids[:2] == greedy[:2] and dec.token_ids != greedy


# ----------------------------------------------------------------------------
# Beam search
# ----------------------------------------------------------------------------

def test_beam_search_matches_transformers(model):
    ids = labkit.encode(model, "The capital of France is").ids
    ours = labkit.generate(model, ids, max_new_tokens=8, method="beam", num_beams=3, stop_at_eos=False)
    with torch.inference_mode():
        ref = model.hf.generate(ids[None], max_new_tokens=8, num_beams=3, do_sample=False,
                                early_stopping=False, length_penalty=1.0, eos_token_id=None,
                                pad_token_id=0)[0, len(ids):].tolist()
    assert ours.token_ids == ref


def test_beam_of_one_is_greedy(model):
    ids = labkit.encode(model, ONCE).ids
    beam = labkit.generate(model, ids, max_new_tokens=8, method="beam", num_beams=1, stop_at_eos=False)
    assert beam.token_ids == hf_greedy_once(model)[:8]


# ----------------------------------------------------------------------------
# Arguments
# ----------------------------------------------------------------------------

def test_generate_checks_its_arguments(model):
    limit = model.config.max_len
    with pytest.raises(ValueError, match="max_new_tokens"):
        labkit.generate(model, [1, 2], max_new_tokens=-1)
    with pytest.raises(ValueError, match="max_new_tokens"):
        labkit.generate(model, [1, 2], max_new_tokens=2.0)
    with pytest.raises(ValueError, match="method"):
        labkit.generate(model, [1, 2], method="nucleus")
    with pytest.raises(ValueError, match="temperature"):
        labkit.generate(model, [1, 2], method="temperature", temperature=-1)
    with pytest.raises(ValueError, match="num_beams"):
        labkit.generate(model, [1, 2], method="beam", num_beams=0)
    with pytest.raises(ValueError, match="empty"):
        labkit.generate(model, torch.tensor([], dtype=torch.long))
    # The context is the limit: a prompt that fills it exactly is allowed (with nothing to add) ...
    full = labkit.generate(model, [1] * limit, max_new_tokens=0)
    assert full.prompt_ids == [1] * limit and full.token_ids == []
    # ... one token more, or one new token too many, is not.
    with pytest.raises(ValueError, match="more than the model's context"):
        labkit.generate(model, [1] * (limit + 1), max_new_tokens=0)
    with pytest.raises(ValueError, match="max_new_tokens must be <= 0"):
        labkit.generate(model, [1] * limit, max_new_tokens=1)
    with pytest.raises(ValueError, match="max_new_tokens must be <= 1 "):
        labkit.generate(model, [1] * (limit - 1), max_new_tokens=2)


def test_cli(capsys):
    from labkit.__main__ import main

    assert main(["The capital of France is", "--max-new-tokens", "4"]) == 0
    out = capsys.readouterr().out
    assert "Paris" in out and "TTFT" in out and "TPOT" in out and "KV cache" in out
    assert main(["x", "--temperature", "-1", "--method", "temperature"]) == 2
    assert "temperature" in capsys.readouterr().err
