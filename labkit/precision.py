"""Lower precision side by side: bytes, speed and quality of the same model in fp32, bf16, int8...

Quantization (量化) and lower-precision floats make every weight smaller, so a
memory-bound decode step reads fewer bytes. Whether it is also *faster*
depends on the machine having a fast kernel for that format, and what it
*costs* is a slightly different model. This puts the three side by side:

    bytes     model.weight_nbytes: what one decode step must read
    speed     a greedy generation timed on this machine (labkit.measure): TTFT, TPOT
    quality   labkit.quantize.compare against the reference model: KL divergence of
              the next-token distributions, top-1 agreement, greedy agreement

`measure_precisions(reference, {"bf16": m16, "int8": m8}, prompts)` returns one
`PrecisionResult` per model (the reference first); `precision_chart` draws them.

Left out: task-level quality (perplexity on a corpus, accuracy on a benchmark).
"""

from __future__ import annotations

from dataclasses import dataclass

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from . import viz
from .generate import generate
from .measure import device_label, time_generation
from .quantize import Quality, compare


@dataclass
class PrecisionResult:
    name: str
    weight_nbytes: int           # bytes a decode step reads
    ttft_s: float
    tpot_s: float                # median decode step
    text: str                    # greedy continuation of the timed prompt
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


def measure_precisions(reference, models: dict, prompts: list[str], max_new_tokens: int = 12,
                       reference_name: str = "fp32") -> list[PrecisionResult]:
    """Time each model (reference first) on prompts[0] and compare each with the
    reference on all prompts (labkit.quantize.compare, greedy for max_new_tokens)."""
    if not prompts:
        raise ValueError("give at least one prompt")
    results = []
    for name, model in [(reference_name, reference)] + list(models.items()):
        generate(model, prompts[0], 2)          # warm-up: first calls pay one-off costs
        t = time_generation(model, prompts[0], max_new_tokens)
        quality = None if model is reference else compare(reference, model, prompts, max_new_tokens)
        results.append(PrecisionResult(name, model.weight_nbytes, t.ttft_s, t.tpot_s, t.text, t.token_ids,
                                       quality, device_label(model)))
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
    colours = [viz.PALETTE[i % len(viz.PALETTE)] for i in range(len(results))]
    for col, (label, values, fmt) in enumerate(panels, start=1):
        fig.add_trace(go.Bar(x=names, y=values, marker_color=colours, showlegend=False,
                             text=[fmt.format(v) for v in values], textposition="outside", cliponaxis=False,
                             hovertemplate=f"%{{x}}<br>{label}: %{{y:.4g}}<extra></extra>"), row=1, col=col)
        fig.update_yaxes(rangemode="tozero", range=[0, max(values + [1e-9]) * 1.25], row=1, col=col)
    agree = ", ".join(f"{r.name}: top-1 agreement {r.quality.top1_agreement:.0%}"
                      for r in results if r.quality)
    sub = f"measured on {results[0].device}" + (f"; {agree}" if agree else "")
    fig.update_layout(title=viz._title(title, sub), width=1100, height=460)
    return fig
