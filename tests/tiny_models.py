"""Randomly initialised tiny transformers models, built in the test (no download).

transformers initialises weights with std 0.02 (initializer_range). On a
model this small that makes every output nearly flat: logits with std ~0.16,
attention rows uniform over the visible keys (normalised entropy 1.000), so
a wrong nonlinearity, a zeroed layer or a misplaced mask moves the logits by
less than any tolerance could notice (exact vs tanh GELU: 1e-5). The models
here are re-initialised with weights of std 0.2, norm weights scattered
around 1 and small random biases, so that each part of the model matters.
Measured on a 37-token random prompt (tests/test_forward.py):

    init            logit std   attention entropy   exact-GELU change   fp32 parity
                                (1 = uniform)       (GPT-2, max)        (labkit vs transformers)
    std 0.02        0.16-0.17   1.000               9.5e-6              2e-7
    std 0.2 (here)  1.5-1.7     0.50-0.54           1.9e-3              1.1e-5

std 0.3 sharpens attention further (entropy 0.23) but fp32 round-off grows
with the logits (cached vs uncached 5e-5), too close to the 1e-4 tolerances.
"""

import torch

INIT_STD = 0.2


def tiny_hf_model(kind: str, seed: int = 0, std: float | None = INIT_STD):
    """A randomly initialised tiny transformers model of one family (no download).

    std: standard deviation of every weight matrix and embedding table; None
    keeps transformers' own (nearly flat) initialisation.
    """
    from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM,
                              Qwen2Config, Qwen2ForCausalLM)

    torch.manual_seed(seed)
    common = dict(vocab_size=211, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
                  num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=256)
    if kind == "llama":
        hf = LlamaForCausalLM(LlamaConfig(**common, tie_word_embeddings=False))
    elif kind == "qwen2":
        hf = Qwen2ForCausalLM(Qwen2Config(**common, tie_word_embeddings=True))
    elif kind == "llama_mha":
        hf = LlamaForCausalLM(LlamaConfig(**{**common, "num_key_value_heads": 8}))
    elif kind == "gpt2":
        hf = GPT2LMHeadModel(GPT2Config(vocab_size=211, n_embd=64, n_layer=3, n_head=4, n_positions=256))
    else:
        raise ValueError(kind)
    if std is not None:
        informative_init(hf, std, seed)
    return hf.eval()


@torch.no_grad()
def informative_init(hf, std: float, seed: int = 0) -> None:
    """Re-initialise hf in place: matrices and embeddings ~ N(0, std), norm
    weights ~ 1 + N(0, 0.2) (so a norm that drops its weight is visible),
    biases ~ N(0, 0.1). Tied weights are one parameter and stay tied."""
    g = torch.Generator().manual_seed(seed)
    for name, p in hf.named_parameters():
        if p.dim() >= 2:
            p.copy_(torch.randn(p.shape, generator=g) * std)
        elif name.endswith("bias"):
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
        else:
            p.copy_(1 + torch.randn(p.shape, generator=g) * 0.2)
