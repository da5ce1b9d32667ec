"""Lower precision side by side: bytes, speed and quality of the same model in fp32, bf16, int8...

Quantization (量化) and lower-precision floats make every weight smaller, so a
memory-bound decode step reads fewer bytes. Whether it is also *faster*
depends on the machine having a fast kernel for that format, and what it
*costs* is a slightly different model. This puts the three side by side:

    bytes     model.weight_nbytes: what one decode step must read
    speed     greedy generations timed on this machine: TTFT, TPOT
    quality   against the reference model, as labkit.quantize.measure_quality measures it:
              KL divergence of the next-token distributions, top-1 agreement,
              greedy agreement

`measure_precisions(reference, {"bf16": m16, "int8": m8}, prompts)` returns one
`PrecisionResult` per model (the reference first); `charts.precision_chart` draws them.

Left out: task-level quality (perplexity on a corpus, accuracy on a benchmark).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .generation import generate
from .quantize import Quality, common_prefix, kl_divergence
from .timing import device_label, median, sync


@dataclass
class PrecisionResult:
    name: str
    weight_nbytes: int           # bytes a decode step reads
    ttft_s: float
    tpot_s: float                # median decode step
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
def measure_precisions(reference, models: dict, prompts: list[str], max_new_tokens: int = 8,
                       reference_name: str = "fp32") -> list[PrecisionResult]:
    """Each model (the reference first) generates greedily from every prompt, timed;
    then reads the prompt and the *reference's* continuation in one forward pass
    (teacher forcing: every model sees the same tokens), and its next-token
    distributions are compared with the reference's at every position
    (labkit.quantize.kl_divergence). EOS is ignored, so every continuation has
    max_new_tokens tokens.

    One generation and one forward pass per model and prompt: the reference's
    continuations are computed once (labkit.quantize.measure_quality, which recomputes
    them for each model, costs twice as much). TTFT is the first prompt's; TPOT
    the median decode step over all prompts.
    """
    if not prompts:
        raise ValueError("give at least one prompt")
    results: list[PrecisionResult] = []
    ref_ids: list[list[int]] = []
    ref_logits: list[torch.Tensor] = []
    for i, (name, model) in enumerate([(reference_name, reference)] + list(models.items())):
        is_ref = i == 0
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
        tpot = median(s.seconds for g in gens for s in g.steps[1:])     # every prompt's decode steps
        results.append(PrecisionResult(name, model.weight_nbytes, gens[0].ttft_s, tpot,
                                       gens[0].text, gens[0].token_ids, quality, device_label(model)))
    return results
