"""How long the widgets keep the kernel busy, on the default model.

Two interactions, each repeated (default 20 times), medians reported:

    temperature slider   SamplingExplorer: set the slider's value; re-filter the
                         logits computed once, redraw the distribution chart
    live step            LiveGeneration.step(): one decode step, sampling, and
                         the redraw of its four charts

in both chart modes: FigureWidget (changed in place) and the Output fallback
(re-rendered). There is no event loop here, so each update runs at once and
the time measured is the whole update. It is kernel time only: the browser
drawing the chart afterwards is not included.

    python benchmarks/widgets_latency.py [--reps 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

import labkit
from labkit import widgets as W

PROMPT = "The capital of France is"


def median_ms(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def measure(model, reps: int, figurewidget: bool) -> dict[str, float]:
    W.USE_FIGUREWIDGET = figurewidget

    explorer = W.SamplingExplorer(model, PROMPT, method="top_p")
    values = iter([0.7, 1.3] * reps)           # a new value every time, or nothing would fire

    def slide():
        explorer.controls.temperature.value = next(values)
        explorer.flush()
    slide()                                     # warm up
    slider = median_ms(slide, reps)

    live = W.LiveGeneration(model, PROMPT, max_new_tokens=reps + 2, method="top_p")
    live.step()                                 # the prefill, not counted
    step = median_ms(live.step, reps)
    model_part = statistics.median(live.seconds[1:]) * 1e3   # decode + sampling, as step() timed it
    return {"slider": slider, "step": step, "model": model_part, "redraw": step - model_part}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    model = labkit.load_model()
    print(f"{model!r}\ntorch threads: {torch.get_num_threads()}, repetitions: {args.reps}, "
          f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs\n")
    rows = [("FigureWidget", measure(model, args.reps, True)),
            ("Output fallback", measure(model, args.reps, False))]
    print(f"{'chart mode':<16} {'temperature slider':>19} {'live step':>10} {'(model':>8} {'+ redraw)':>10}")
    for name, r in rows:
        print(f"{name:<16} {r['slider']:>16.0f} ms {r['step']:>7.0f} ms {r['model']:>5.0f} ms "
              f"{r['redraw']:>7.0f} ms")
    print(f"\nload average after: {os.getloadavg()[0]:.1f} (a busy machine slows the model part most)")


if __name__ == "__main__":
    main()
