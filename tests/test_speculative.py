"""labkit.speculative: prompt-lookup drafts, verified in one pass, give plain greedy's tokens."""

import pytest

import labkit
from labkit import speculative as S

COPY_PROMPT = ("Change the name Alice to Bob in this text: Alice went to the market on Monday. "
               "Alice bought bread, milk and eggs. Then Alice walked home.")


def test_find_draft_takes_the_latest_match_longest_ngram_first():
    ids = [1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 2, 3]
    # "2 3" occurred at 1 and 6; the latest (6) is followed by 7 8 5 2 3.
    assert S.find_draft(ids, num_draft=3, ngram_max=2) == [7, 8, 5]
    # a 3-gram "5 2 3" never occurred before: falls back to the 2-gram
    assert S.find_draft(ids, num_draft=2, ngram_max=3) == [7, 8]
    assert S.find_draft([4, 5, 6], num_draft=3) == []                 # nothing recurs
    assert S.find_draft([4, 5, 4], num_draft=3) == [5, 4]             # a 1-gram match
    assert S.find_draft([4, 5, 4], num_draft=3, ngram_min=2) == []
    assert S.find_draft([4, 5, 4], num_draft=0) == []


@pytest.mark.parametrize("prompt,chat,n", [(COPY_PROMPT, True, 20), ("The capital of France is", False, 12)])
def test_same_tokens_as_greedy(model, prompt, chat, n):
    plain = labkit.generate(model, prompt, max_new_tokens=n, chat=chat)
    spec = S.speculative_generate(model, prompt, max_new_tokens=n, chat=chat)
    assert spec.token_ids == plain.token_ids
    assert spec.text == plain.text
    assert spec.finish_reason == plain.finish_reason
    # Bookkeeping: the rounds add up to the tokens; each round adds accepted + 1.
    assert sum(len(r.token_ids) for r in spec.rounds) == len(spec.token_ids)
    assert spec.rounds[0].phase == "prefill" and spec.forward_passes == len(spec.rounds)
    for r in spec.rounds[1:-1]:
        assert len(r.token_ids) == r.accepted + 1 and r.token_ids[:r.accepted] == r.draft[:r.accepted]
    assert 0 <= spec.accepted <= spec.drafted


def test_copying_prompt_accepts_drafts_and_saves_passes(model):
    spec = S.speculative_generate(model, COPY_PROMPT, max_new_tokens=20, chat=True)
    assert spec.accepted > 0 and spec.acceptance_rate > 0.3
    assert spec.forward_passes < len(spec.token_ids)          # more than one token per pass
    assert spec.tokens_per_pass > 1


def test_stops_at_eos_like_greedy(model):
    plain = labkit.generate(model, "What is the capital of France?", max_new_tokens=40, chat=True)
    assert plain.finish_reason == "eos"
    spec = S.speculative_generate(model, "What is the capital of France?", max_new_tokens=40, chat=True)
    assert spec.token_ids == plain.token_ids and spec.finish_reason == "eos"


def test_rejected_drafts_are_rolled_back(model, monkeypatch):
    """A draft the model never agrees with: every token still comes out right,
    and the cache never keeps the rejected positions."""
    monkeypatch.setattr(S, "find_draft", lambda ids, n, *a: [0] * n)   # token 0 is never the answer
    truncations = []
    real = labkit.KVCache.truncate

    def spy(cache, length):
        truncations.append((cache.length, length))
        real(cache, length)
    monkeypatch.setattr(labkit.KVCache, "truncate", spy)
    plain = labkit.generate(model, "The capital of France is", max_new_tokens=6)
    spec = S.speculative_generate(model, "The capital of France is", max_new_tokens=6, num_draft=3)
    assert spec.token_ids == plain.token_ids
    assert spec.accepted == 0 and spec.drafted > 0 and spec.acceptance_rate == 0
    # Each verifying pass wrote 1 + len(draft) positions and kept only 1.
    assert truncations and all(before - after == len(r.draft)
                               for (before, after), r in zip(truncations, spec.rounds[1:]))


def test_edge_cases(model):
    assert S.speculative_generate(model, "Hi", max_new_tokens=0).token_ids == []
    one = S.speculative_generate(model, "The capital of France is", max_new_tokens=1)
    assert one.token_ids == labkit.generate(model, "The capital of France is", max_new_tokens=1).token_ids
    assert one.forward_passes == 1 and one.acceptance_rate != one.acceptance_rate   # nan: nothing drafted
    with pytest.raises(ValueError, match="max_new_tokens"):
        S.speculative_generate(model, "Hi", max_new_tokens=-1)
    with pytest.raises(ValueError, match="ngram"):
        S.speculative_generate(model, "Hi", ngram_min=3, ngram_max=2)
    ids = labkit.encode(model, "The capital of France is").ids
    assert S.speculative_generate(model, ids, max_new_tokens=3).token_ids == \
        labkit.generate(model, ids, max_new_tokens=3).token_ids
