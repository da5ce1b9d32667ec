"""How long the live views keep the kernel busy, on the default model.

Two interactions, each repeated (default 20 times), medians reported:

    temperature slider   SamplingExplorer: set the slider's value; re-filter the
                         logits computed once, redraw the distribution chart
    live step            LiveGeneration.step(): one decode step, sampling, and
                         the redraw of its four charts

in both chart modes: FigureWidget (changed in place) and the Output fallback
(re-rendered). There is no event loop here, so each update runs at once and
the time measured is the whole update. It is kernel time only: the browser
drawing the chart afterwards is not included.

Wall-clock time is what a lecturer sees, but on a shared machine it mostly
measures the neighbours; CPU time (of this process, all threads) is printed
beside it as a steadier measure of the work itself.

    python benchmarks/widgets_latency.py [--reps 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

import labkit
from labkit import views

PROMPT = "The capital of France is"


def medians_ms(fn, reps: int) -> tuple[float, float]:
    """Median wall-clock and CPU milliseconds of fn()."""
    wall, cpu = [], []
    for _ in range(reps):
        w, c = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - w)
        cpu.append(time.process_time() - c)
    return statistics.median(wall) * 1e3, statistics.median(cpu) * 1e3


def measure(model, reps: int, figure_mode: str) -> dict[str, tuple[float, float]]:
    explorer = views.SamplingExplorer(model, PROMPT, method="top_p", figure_mode=figure_mode)
    values = iter([0.7, 1.3] * (reps + 1))       # a new value every time, or nothing would fire

    def slide():
        explorer.controls.temperature.value = next(values)
        explorer.flush()
    slide()                                      # warm up
    slider = medians_ms(slide, reps)

    live = views.LiveGeneration(model, PROMPT, max_new_tokens=reps + 2, method="top_p", figure_mode=figure_mode)
    live.step()                                  # the prefill, not counted
    step = medians_ms(live.step, reps)
    redraw = medians_ms(live._redraw, reps)      # the same redraw again, without the model
    return {"slider": slider, "step": step, "redraw": redraw}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    model = labkit.load_model()
    print(f"{model!r}\ntorch threads: {torch.get_num_threads()}, repetitions: {args.reps}, "
          f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs\n")
    rows = [("FigureWidget", measure(model, args.reps, "figurewidget")),
            ("Output fallback", measure(model, args.reps, "display"))]
    print("median ms, wall / CPU   temperature slider     live step   of which redraw")
    for name, r in rows:
        cells = "".join(f"{r[k][0]:>9.0f} / {r[k][1]:<5.0f}" for k in ("slider", "step", "redraw"))
        print(f"{name:<22}{cells}")
    print(f"\nload average after: {os.getloadavg()[0]:.1f} (a busy machine slows the model part most)")


if __name__ == "__main__":
    main()
