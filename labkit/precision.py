"""Lower precision side by side: bytes, speed and quality of the same model in fp32, bf16, int8...

Quantization (量化) and lower-precision floats make every weight smaller, so a
memory-bound decode step reads fewer bytes. Whether it is also *faster*
depends on the machine having a fast kernel for that format, and what it
*costs* is a slightly different model. This puts the three side by side:

    bytes     model.weight_nbytes: what one decode step must read
    speed     greedy generations timed on this machine: TTFT, TPOT
    quality   against the reference model, as labkit.quantize.compare measures it:
              KL divergence of the next-token distributions, top-1 agreement,
              greedy agreement

`measure_precisions(reference, {"bf16": m16, "int8": m8}, prompts)` returns one
`PrecisionResult` per model (the reference first); `precision_chart` draws them.

Left out: task-level quality (perplexity on a corpus, accuracy on a benchmark).
"""

from __future__ import annotations

from dataclasses import dataclass

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from . import charts
from .generation import generate
from .measure import device_label, sync
from .quantize import Quality, kl_divergence


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
    continuations are computed once (labkit.quantize.compare, which recomputes
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
            prefix.append(next((i for i, (a, b) in enumerate(zip(gen.token_ids, ref_ids[k])) if a != b),
                               len(ref_ids[k])))
        kl, agree = torch.cat(kls), torch.cat(top1).float()
        quality = None if is_ref else Quality(
            float(kl.mean()), float(kl.max()), float(agree.mean()),
            sum(p == max_new_tokens for p in prefix) / len(prompts),
            sum(prefix) / (max_new_tokens * len(prompts)), len(kl), len(prompts))
        decode = sorted(s.seconds for g in gens for s in g.steps[1:])
        results.append(PrecisionResult(name, model.weight_nbytes, gens[0].ttft_s,
                                       decode[len(decode) // 2] if decode else float("nan"),
                                       gens[0].text, gens[0].token_ids, quality, device_label(model)))
    return results


def precision_chart(results: list[PrecisionResult],
                    title: str = "Lower precision: bytes, speed and quality") -> go.Figure:
    """Three panels, one bar per model: weight bytes (MB), time per output token (ms),
    and mean KL divergence from the reference (nats; 0 = the same distribution)."""
    names = [r.name for r in results]
    panels = [("weights read per token (MB)", [r.weight_nbytes / 1e6 for r in results], "{:.0f}"),
              ("time per output token (ms)", [r.tpot_s * 1e3 for r in results], "{:.1f}"),
              ("KL from the reference (nats)", [r.kl_mean for r in results], "{:.2g}")]
    fig = make_subplots(rows=1, cols=3, subplot_titles=[p[0] for p in panels], horizontal_spacing=0.09)
    colours = [charts.PALETTE[i % len(charts.PALETTE)] for i in range(len(results))]
    for col, (label, values, fmt) in enumerate(panels, start=1):
        fig.add_trace(go.Bar(x=names, y=values, marker_color=colours, showlegend=False,
                             text=[fmt.format(v) for v in values], textposition="outside", cliponaxis=False,
                             hovertemplate=f"%{{x}}<br>{label}: %{{y:.4g}}<extra></extra>"), row=1, col=col)
        fig.update_yaxes(rangemode="tozero", range=[0, max(values + [1e-9]) * 1.25], row=1, col=col)
    agree = ", ".join(f"{r.name}: top-1 agreement {r.quality.top1_agreement:.0%}"
                      for r in results if r.quality)
    sub = f"measured on {results[0].device}" + (f"; {agree}" if agree else "")
    fig.update_layout(title=charts._title(title, sub), width=1050, height=460)
    return charts.fit_title(fig)
