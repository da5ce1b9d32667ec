"""labkit: the engine behind LLM Inference Lab.

    import labkit
    model = labkit.load_model()                              # SmolLM2-135M-Instruct, offline
    enc = labkit.encode(model, "The capital of France is")   # stage 1: enc.ids, enc.tokens
    cache = model.new_cache(max_len=1024)
    logits = model.forward(enc.ids, cache=cache)             # stage 2: (T, vocab); fills the cache
    token, probs = labkit.sample(logits[-1], method="top_p", temperature=0.8, top_p=0.9, seed=0)
    gen = labkit.generate(model, "The capital of France is", max_new_tokens=32)

The three stages and the two phases, each one named function in one file:

    stage 1, encode    encoding.encode          text -> token ids (chat template; NFKC if asked)
    stage 2, forward   model.Model.forward      token ids -> logits, through every block
    stage 3, sample    sampling.sample          logits -> the next token
    phase 1, prefill   generation.prefill       the whole prompt at once; fills the KV cache (most of TTFT)
    phase 2, decode    generation.decode_one_token   one token against the cache (one gap; TPOT is their mean)

`generation.Decoder` is the one decode loop (prefill, then decode, sample,
stop): `generate`, the live views, the dashboard and speculative decoding
all drive it. Its clocks (TTFT from the request, prefill time, TPOT as the
mean gap, ITL) are defined once, in labkit.generation.

The modules, in reading order:

    the engine         loading.py (find and load a model), encoding.py (stage 1),
                       model.py (stage 2), attention.py (mask, grouped-query heads,
                       the by-hand / SDPA / tiled choice), kv_cache.py, sampling.py
                       (stage 3), generation.py (prefill, decode, the loop, beam
                       search), trace.py (what a forward pass records)
    optimisations      quantize.py (int8 / int4 weights), kv_quant.py (an int8
                       KV cache), tiled_attention.py (FlashAttention's tiles),
                       speculative.py (prompt-lookup drafts, and a draft model
                       with the rejection-sampling rule), cuda_graphs.py (a
                       replayable decode step)
    measurement        costs.py (FLOPs and bytes, counted), timing.py (the clock,
                       device sync, bandwidth and FLOP/s probes), measure.py (the
                       sweeps of notebooks 06-07), precision.py (fp32 / bf16 /
                       int8 side by side), bench.py (python -m labkit.bench),
                       memory.py (what a process holds; room before a big allocation),
                       gpu_check.py (the check for a lent GPU)
    serving            batching.py (static vs continuous batching, simulated)
    the views          charts.py (every plotly figure), jupyter.py (figure box,
                       View base), controls.py (sliders), views.py (the live
                       views), dashboard.py (the lecture dashboard)
"""

from .loading import (DEFAULT_MODEL, ModelNotAvailableError, cache_dir, default_dtype, default_gguf_file,
                      load_model)
from .encoding import (Encoding, embed, encode, format_chat, learned_positions, model_rope_angles,
                       normalize, rope_angles, sinusoidal_positions, token_strings)
from .model import SUPPORTED, Model, ModelConfig
from .attention import attention_by_hand, causal_mask
from .kv_cache import KVCache
from .sampling import METHODS, SamplingParams, distribution, sample
from .generation import Decoder, Generation, Step, decode_one_token, generate, prefill, recompute
from .trace import Trace, logit_lens

__all__ = [
    "DEFAULT_MODEL", "Decoder", "Encoding", "Generation", "KVCache", "METHODS", "Model", "ModelConfig",
    "ModelNotAvailableError", "SUPPORTED", "SamplingParams", "Step", "Trace", "attention_by_hand", "cache_dir",
    "causal_mask",
    "decode_one_token", "default_dtype", "default_gguf_file", "distribution", "embed", "encode",
    "format_chat", "generate", "learned_positions", "load_model", "logit_lens", "model_rope_angles",
    "normalize", "prefill", "recompute", "rope_angles", "sample", "sinusoidal_positions", "token_strings",
]
