"""Lower precision side by side: bytes, speed and quality of the same model in fp32, bf16, int8...

Quantization (量化) and lower-precision floats make every weight smaller, so a
memory-bound decode step reads fewer bytes. Whether it is also *faster*
depends on the machine having a fast kernel for that format, and what it
*costs* is a slightly different model. This puts the three side by side:

    bytes     model.weight_nbytes: what one decode step must read
    speed     greedy generations timed on this machine: TTFT (from the request),
              TPOT (the mean, (e2e - TTFT) / (N - 1), as Generation.tpot_s)
    quality   against the reference model, as labkit.quantize.measure_quality measures it:
              KL divergence of the next-token distributions, top-1 agreement,
              greedy agreement

`measure_precisions(reference, {"bf16": m16, "int8": m8}, prompts)` returns one
`PrecisionResult` per model (the reference first); `charts.precision_chart` draws them.
Or give names (`measure_precisions(reference, ["bf16", "int8"], prompts)`):
each model is then built from the reference (`lower(reference, name)`),
measured and released before the next, so memory holds the reference and one
other copy, never all of them.

What "the reference" is: the bundled default model is SmolLM2-135M-Instruct
from a Q4_1 GGUF file (4-bit weights in blocks of 32, each block with an fp16
scale and minimum: 5 bits a weight; the tied embedding / LM head in Q8_0),
de-quantised to fp32. Loaded "in fp32" it holds the 4-bit values exactly, so
the KL of bf16 / int8 / int4 against it measures re-rounding values that were
4-bit to begin with, not the loss from the original trained weights.
`original_model_in_cache()` finds the original (unquantized) weights when
they are already in the local Hugging Face cache (nothing is downloaded).

Left out: task-level quality (perplexity on a corpus, accuracy on a benchmark).
"""

from __future__ import annotations

from dataclasses import dataclass

import copy

import torch
from torch import nn

from .generation import generate
from .quantize import Quality, common_prefix, kl_divergence
from .model import Model
from .quantize import SCHEMES, mapped_in_dtype, quantize
from .timing import device_label, median, release_freed_memory, sync

FLOAT_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
NAMES = (*FLOAT_DTYPES, *SCHEMES)     # what lower() builds


@dataclass
class PrecisionResult:
    name: str
    weight_nbytes: int           # bytes a decode step reads
    ttft_s: float                # the first prompt's time to first token, from the request
    tpot_s: float                # mean time per output token of each generation; median across prompts
    text: str                    # greedy continuation of the first prompt
    token_ids: list[int]
    quality: Quality | None      # None for the reference itself
    device: str

    @property
    def kl_mean(self) -> float:
        return self.quality.kl_mean if self.quality else 0.0

    def row(self) -> dict:
        q = self.quality
        return {"model": self.name, "weights_MB": round(self.weight_nbytes / 1e6, 1),
                "TTFT_ms": round(self.ttft_s * 1e3, 1), "TPOT_ms": round(self.tpot_s * 1e3, 1),
                "KL_mean": q.kl_mean if q else 0.0, "top1_agree": q.top1_agreement if q else 1.0,
                "greedy_identical": q.greedy_identical if q else 1.0}


@torch.inference_mode()
def cast(model: Model, dtype: str | torch.dtype) -> Model:
    """A copy of model with every parameter in dtype ("fp32", "bf16", "fp16"),
    converted one tensor at a time (memory never holds two full-precision
    copies); tied weights stay tied. Rounds as load_model(dtype=...) does
    (round to nearest even). The model passed in is not touched.
    The bundled default (or a GGUF file) loaded in fp32 on the CPU gets the
    copy memory-mapped from labkit's file of that dtype instead: the same
    values, shared, no private copy (quantize.mapped_in_dtype)."""
    dtype = FLOAT_DTYPES.get(dtype, dtype)
    if dtype not in FLOAT_DTYPES.values():
        raise ValueError(f"dtype must be one of {sorted(FLOAT_DTYPES)}, got {dtype!r}")
    name = [k for k, v in FLOAT_DTYPES.items() if v == dtype][0]
    hf = mapped_in_dtype(model, dtype)
    if hf is None:
        # deepcopy takes each parameter from the memo: its converted copy.
        memo = {id(p): nn.Parameter(p.detach().to(dtype), requires_grad=False) for p in model.hf.parameters()}
        hf = copy.deepcopy(model.hf, memo)
    return Model(hf, model.tokenizer, name=f"{model.name} ({name})")


def lower(model: Model, name: str) -> Model:
    """The model at a lower precision, by name: "fp32", "bf16", "fp16" (cast)
    or "int8", "int4" (labkit.quantize.quantize: weight-only, bf16 activations on a CPU)."""
    if name in FLOAT_DTYPES:
        return cast(model, name)
    if name in SCHEMES:
        return quantize(model, name)
    raise ValueError(f"name must be one of {NAMES}, got {name!r}")


ORIGINAL_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"   # the hub's unquantized weights of the default


def original_model_in_cache(repo_id: str = ORIGINAL_MODEL, cache_dir: str | None = None) -> str | None:
    """The local path of repo_id's model.safetensors if it is already in the
    Hugging Face cache (cache_dir, default the usual one; nothing is
    downloaded), else None."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    path = try_to_load_from_cache(repo_id, "model.safetensors", cache_dir=cache_dir)
    return path if isinstance(path, str) else None


@torch.inference_mode()
def measure_precisions(reference, models: dict | list[str], prompts: list[str], max_new_tokens: int = 8,
                       reference_name: str = "fp32") -> list[PrecisionResult]:
    """Each model (the reference first) generates greedily from every prompt, timed;
    then reads the prompt and the *reference's* continuation in one forward pass
    (teacher forcing: every model sees the same tokens), and its next-token
    distributions are compared with the reference's at every position
    (labkit.quantize.kl_divergence). EOS is ignored, so every continuation has
    max_new_tokens tokens.

    One generation and one forward pass per model and prompt: the reference's
    continuations are computed once (labkit.quantize.measure_quality, which recomputes
    them for each model, costs twice as much). TTFT is the first prompt's (from
    the request: tokenization included); TPOT is each generation's mean
    (Generation.tpot_s), and the median of those across prompts (nan with
    max_new_tokens=1: TPOT needs two tokens).

    models: name -> Model, or a list of names for lower() to build from the
      reference, each released (and garbage-collected) before the next is built.
    """
    if not prompts:
        raise ValueError("give at least one prompt")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    release_freed_memory()    # what earlier cells freed, back to the OS before the copies are built
    results: list[PrecisionResult] = []
    ref_ids: list[list[int]] = []
    ref_logits: list[torch.Tensor] = []
    built = not isinstance(models, dict)
    if built:
        for name in models:
            if name not in NAMES:
                raise ValueError(f"models: each name must be one of {NAMES}, got {name!r}")
        models = {name: name for name in models}
    for i, (name, model) in enumerate([(reference_name, reference)] + list(models.items())):
        is_ref = i == 0
        if built and not is_ref:
            model = lower(reference, model)
        generate(model, prompts[0], 1)              # warm-up: the first call pays one-off costs
        gens, kls, top1, prefix = [], [], [], []
        for k, prompt in enumerate(prompts):
            sync(model.device)
            gen = generate(model, prompt, max_new_tokens, stop_at_eos=False)
            sync(model.device)
            gens.append(gen)
            if is_ref:
                ref_ids.append(gen.token_ids)
            ids = torch.tensor(gen.prompt_ids + ref_ids[k][:-1])
            logits = model.forward(ids).float().cpu()                   # (T, vocab)
            if is_ref:
                ref_logits.append(logits)
            kls.append(kl_divergence(ref_logits[k], logits))
            top1.append(ref_logits[k].argmax(-1) == logits.argmax(-1))
            prefix.append(common_prefix(gen.token_ids, ref_ids[k]))
        kl, agree = torch.cat(kls), torch.cat(top1).float()
        quality = None if is_ref else Quality(
            float(kl.mean()), float(kl.max()), float(agree.mean()),
            sum(p == max_new_tokens for p in prefix) / len(prompts),
            sum(prefix) / (max_new_tokens * len(prompts)), len(kl), len(prompts))
        tpot = median(g.tpot_s for g in gens)          # each generation's mean; the median across prompts
        results.append(PrecisionResult(name, model.weight_nbytes, gens[0].ttft_s, tpot,
                                       gens[0].text, gens[0].token_ids, quality, device_label(model)))
        if built and not is_ref:      # release it before the next one is built
            del model, gens, logits
            release_freed_memory()    # gc, and glibc's heap back to the OS (docs/memory.md)
    return results
