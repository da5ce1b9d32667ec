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


# ----------------------------------------------------------------------------
# A draft model with the rejection-sampling rule: the target's distribution, kept
# ----------------------------------------------------------------------------
#
# The check is a chi-square goodness-of-fit test: draw N tokens, count each
# token's occurrences, compare with N x its probability under the target. Bins
# with an expected count under 5 are pooled (the usual rule for the chi-square
# approximation). The critical value is scipy's chi-square quantile at
# significance 1e-3: a correct sampler fails about one seed in a thousand, and the
# seeds are fixed, so a pass is reproducible. The same test must catch broken
# rules (accept every draft token; resample from p instead of the residual; the
# bonus token drawn from the draft): their statistics are checked to be far above
# the critical value.

import torch
from scipy.stats import chi2

from labkit.sampling import SamplingParams, distribution
from tiny_models import tiny_hf_model

SIGNIFICANCE = 1e-3


def chi_square(samples, probs):
    """(statistic, critical value at SIGNIFICANCE) of the counts of `samples`
    (token ids) against `probs` (vocab,), rare tokens pooled into one bin."""
    n = len(samples)
    counts = torch.bincount(torch.tensor(samples), minlength=len(probs)).double()
    expected = probs.double() * n
    common = expected >= 5
    obs = torch.cat([counts[common], counts[~common].sum().view(1)])
    exp = torch.cat([expected[common], expected[~common].sum().view(1)])
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    assert len(exp) >= 3, "too few samples for a chi-square test: every bin pooled"
    stat = float(((obs - exp) ** 2 / exp).sum())
    return stat, float(chi2.ppf(1 - SIGNIFICANCE, len(exp) - 1))


def test_chi_square_helper_accepts_the_distribution_and_rejects_another():
    """The test itself: samples of p pass, samples of a visibly different q do not."""
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(30, generator=g), -1)
    q = torch.softmax(torch.randn(30, generator=g), -1)
    draws_p = torch.multinomial(p, 5000, replacement=True, generator=g).tolist()
    draws_q = torch.multinomial(q, 5000, replacement=True, generator=g).tolist()
    stat, crit = chi_square(draws_p, p)
    assert stat < crit
    stat, crit = chi_square(draws_q, p)
    assert stat > 3 * crit


VERIFY = S.verify      # the real rule (tests replace S.verify with broken ones)


# Broken rules, for showing that the test catches them.
def accept_everything(p, q, draft, generator=None):
    """Keep the whole draft: the output is then the draft model's distribution."""
    return len(draft), int(torch.multinomial(p[-1], 1, generator=generator))


def resample_from_p(p, q, draft, generator=None):
    """The acceptance test right, but a rejection redrawn from p instead of the residual."""
    for i, x in enumerate(draft):
        if torch.rand((), generator=generator) * q[i, x] < p[i, x]:
            continue
        return i, int(torch.multinomial(p[i], 1, generator=generator))
    return len(draft), int(torch.multinomial(p[-1], 1, generator=generator))


def bonus_from_q(p, q, draft, generator=None):
    """Right until all are accepted; then the bonus token comes from the draft's last q."""
    accepted, token = VERIFY(p, q, draft, generator)
    if accepted == len(draft) and draft:
        token = int(torch.multinomial(q[-1], 1, generator=generator))
    return accepted, token


def first_token_of_rule(rule, p, q, n, seed=0):
    """n first tokens of one round of `rule` with one draft token x ~ q."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        x = int(torch.multinomial(q, 1, generator=g))
        accepted, token = rule(torch.stack([p, p]), q[None], [x], g)
        out.append(x if accepted else token)
    return out


def test_verify_keeps_the_target_distribution():
    """The rule on fixed distributions, 20,000 draws: the first token is distributed as p,
    and each broken rule is rejected by the same test."""
    g = torch.Generator().manual_seed(1)
    p = torch.softmax(0.7 * torch.randn(12, generator=g), -1)
    q = torch.softmax(0.7 * torch.randn(12, generator=g), -1)
    alpha = float(S.acceptance_probability(p, q))
    assert 0.3 < alpha < 0.6                 # 0.41: p and q differ, both branches are taken often
    stat, crit = chi_square(first_token_of_rule(S.verify, p, q, 20_000), p)
    print(f"verify: chi2 {stat:.1f}, critical {crit:.1f}")
    assert stat < crit
    for wrong in (accept_everything, resample_from_p):
        stat, crit = chi_square(first_token_of_rule(wrong, p, q, 20_000), p)
        print(f"{wrong.__name__}: chi2 {stat:.1f}, critical {crit:.1f}")
        assert stat > 5 * crit


def test_verify_rule_details():
    p = torch.tensor([[0.0, 1.0, 0.0], [0.2, 0.3, 0.5]])
    q = torch.tensor([[1.0, 0.0, 0.0]])
    # p(x) = 0: always rejected; the residual max(0, p - q) is all on token 1.
    assert S.verify(p, q, [0]) == (0, 1)
    # q == p: always accepted (u * q < p for every u < 1), then the bonus from p's last row.
    accepted, _ = S.verify(torch.stack([p[1], p[1]]), p[1:], [2])
    assert accepted == 1
    assert torch.equal(S.residual(p[1], p[1]), p[1])              # nothing to correct
    torch.testing.assert_close(S.residual(torch.tensor([0.5, 0.5]), torch.tensor([0.9, 0.1])),
                               torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match="rows"):
        S.verify(p, q, [0, 1])


def test_expected_speedup_formula():
    # alpha = 0: every draft rejected, one token per pass; alpha = 1: gamma + 1.
    assert S.expected_tokens_per_pass(0.0, 4) == 1.0
    assert S.expected_tokens_per_pass(1.0, 4) == 5.0
    # A geometric series: 1 + a + a^2 + ... + a^gamma.
    assert S.expected_tokens_per_pass(0.8, 3) == pytest.approx(1 + 0.8 + 0.64 + 0.512)
    # Leviathan et al., Table/fig. 1 style: alpha 0.8, gamma 3, c 0.1: 2.952 / 1.3.
    assert S.expected_speedup(0.8, 3, 0.1) == pytest.approx(2.952 / 1.3)
    assert S.expected_speedup(0.5, 0, 0.5) == 1.0                # no draft: plain decoding
    for bad in (dict(alpha=1.5, num_draft=2), dict(alpha=0.5, num_draft=-1)):
        with pytest.raises(ValueError):
            S.expected_tokens_per_pass(**bad)
    with pytest.raises(ValueError, match="cost_ratio"):
        S.expected_speedup(0.5, 2, -1)


class NoTokenizer:
    """Tiny models have no tokenizer: the Decoder's streamer only needs decode()."""

    eos_token_id = None

    def decode(self, ids, skip_special_tokens=True):
        return ""


def tiny(seed):
    m = labkit.Model(tiny_hf_model("llama", seed=seed), tokenizer=NoTokenizer())
    return m


PROMPT = [5, 17, 42, 8, 99, 3]
PARAMS = SamplingParams("temperature", temperature=1.0)


@torch.inference_mode()
def target_distributions(target, params=PARAMS):
    """Exact p(first token) and p(second token) (marginal over the first) after PROMPT,
    under the sampling settings `params` (labkit.sampling.distribution)."""
    p1 = distribution(target.forward(PROMPT)[-1], params=params)              # (vocab,)
    V = len(p1)
    both = torch.cat([torch.tensor(PROMPT).expand(V, -1), torch.arange(V)[:, None]], dim=1)   # (V, T + 1)
    last = target.forward(both)[:, -1]                                        # (V, vocab): row x1
    p2_given = torch.stack([distribution(row, params=params) for row in last])
    return p1, p1 @ p2_given


def sample_pairs(target, draft, n, rule=None, monkeypatch=None, params=PARAMS):
    if rule is not None:
        monkeypatch.setattr(S, "verify", rule)
    firsts, seconds = [], []
    for seed in range(n):
        gen = S.speculative_sample(target, draft, PROMPT, max_new_tokens=2, num_draft=2, params=params,
                                   seed=seed, stop_at_eos=False)
        firsts.append(gen.token_ids[0])
        seconds.append(gen.token_ids[1])
    return firsts, seconds


N_MODEL = 600    # samples through the whole loop with tiny models (30-130 ms each on a busy 2-core CPU)


def test_speculative_sample_keeps_the_target_distribution_with_models(monkeypatch):
    """End to end with two different tiny models: the first token (accept or residual)
    and the second (accepted then bonus, or the next round) follow the target."""
    target, draft = tiny(0), tiny(1)
    p1, p2 = target_distributions(target)
    q1 = draft.forward(PROMPT)[-1].float().softmax(-1)
    alpha = float(S.acceptance_probability(p1, q1))
    assert 0.2 < alpha < 0.9, alpha            # the draft is wrong often enough to matter
    firsts, seconds = sample_pairs(target, draft, N_MODEL)
    for name, samples, p in (("first", firsts, p1), ("second", seconds, p2)):
        stat, crit = chi_square(samples, p)
        print(f"{name} token: chi2 {stat:.1f}, critical {crit:.1f}")
        assert stat < crit
    # The same test on the broken rules: accepting every draft token yields q, far from p.
    firsts, _ = sample_pairs(target, draft, 200, accept_everything, monkeypatch)
    stat, crit = chi_square(firsts, p1)
    print(f"accept everything: chi2 {stat:.1f}, critical {crit:.1f}")
    assert stat > 3 * crit


def test_bonus_token_rule_is_checked(monkeypatch):
    """Two copies of one model accept every draft token, so every second token is a
    bonus: drawn from q's last row (the first position's) instead of p after it, the
    second token's distribution is wrong and caught. top_k=5 keeps the marginal on
    at most 25 tokens, so 200 samples fill the bins."""
    target, draft = tiny(0), tiny(0)              # q == p: alpha = 1
    top5 = SamplingParams("top_k", top_k=5)
    p1, p2 = target_distributions(target, top5)
    firsts, seconds = sample_pairs(target, draft, 200, bonus_from_q, monkeypatch, top5)
    stat, crit = chi_square(firsts, p1)
    assert stat < crit                            # the first token is still right
    stat, crit = chi_square(seconds, p2)
    print(f"bonus from q: chi2 {stat:.1f}, critical {crit:.1f}")
    assert stat > 3 * crit
    monkeypatch.setattr(S, "verify", VERIFY)      # and the real rule passes the same check
    firsts, seconds = sample_pairs(target, draft, 200, params=top5)
    stat, crit = chi_square(seconds, p2)
    print(f"real rule, top-5: chi2 {stat:.1f}, critical {crit:.1f}")
    assert stat < crit


def test_greedy_speculative_sample_equals_greedy(model):
    """With greedy settings p and q are one-hot: the rule is greedy verification, so
    any draft (here the target's first 10 layers) gives plain greedy's tokens."""
    draft = S.early_exit(model, 10)
    plain = labkit.generate(model, "The capital of France is", max_new_tokens=8)
    spec = S.speculative_sample(model, draft, "The capital of France is", max_new_tokens=8,
                                params=SamplingParams("greedy"), num_draft=3)
    assert spec.token_ids == plain.token_ids and spec.finish_reason == plain.finish_reason
    assert sum(len(r.token_ids) for r in spec.rounds) == len(spec.token_ids)
    assert spec.rounds[0].phase == "prefill" and spec.rounds[0].draft     # the prefill verifies a draft too
    # Every round drafts, and the draft caches stay in step: no position is written twice.
    for r in spec.rounds:
        assert r.examined == r.accepted + (r.accepted < len(r.draft))
        assert len(r.accept_probs) == r.examined


def test_speculative_sample_bookkeeping_and_errors(model):
    draft = S.early_exit(model, 4)
    assert draft.config.n_layers == 4 and len(draft.blocks) == 4
    assert draft.blocks[0] is model.blocks[0]                     # weights shared, not copied
    assert model.config.n_layers == 30 and len(model.blocks) == 30
    gen = S.speculative_sample(model, draft, "The capital of France is", max_new_tokens=5, seed=0)
    assert len(gen.token_ids) == 5 and gen.forward_passes <= 5
    assert gen.generation.e2e_s == pytest.approx(gen.e2e_s, rel=0.5)
    assert gen.generation.ttft_s <= gen.e2e_s
    # The same seed: the same tokens.
    again = S.speculative_sample(model, draft, "The capital of France is", max_new_tokens=5, seed=0)
    assert again.token_ids == gen.token_ids
    # No draft: plain sampling by the target, one token per pass.
    plain = S.speculative_sample(model, draft, "The capital of France is", max_new_tokens=3, num_draft=0, seed=0)
    assert plain.forward_passes == 3 and plain.drafted == 0
    assert S.speculative_sample(model, draft, "Hi", max_new_tokens=0).token_ids == []
    with pytest.raises(ValueError, match="num_draft"):
        S.speculative_sample(model, draft, "Hi", num_draft=-1)
    with pytest.raises(ValueError, match="n_layers"):
        S.early_exit(model, 0)
    with pytest.raises(ValueError, match="vocabulary"):
        S.speculative_sample(model, tiny(0), "Hi")
