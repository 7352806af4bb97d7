"""The benchmark's chart: what the step costs cold and warm, by number of layers.

matplotlib is an optional extra (`pip install -e '.[bench]'`); without it the benchmark
still prints its tables and writes its JSON, and `python -m bench.chart RESULT.json [PNG]`
draws the chart from that JSON later, wherever matplotlib is installed (this module needs
nothing else).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def describe(result: dict[str, Any]) -> str:
    """The machine and settings of a result: the chart's title, and the line above the tables."""
    box = result["machine"]
    return (f"{box['cpus']} CPUs ({box['cpu_model']}), jax {box['jax']}, {box['layout']}; "
            f"median of {result['settings']['repeats']} fresh process(es)"
            f"{'; the step at its smallest width' if result['settings'].get('tiny') else ''}")


def write_chart(rows: list[dict[str, float]], title: str, path: Path) -> bool:
    """Write the PNG; False (and nothing written) when matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    from matplotlib import pyplot

    layers = [row["layers"] for row in rows]
    figure, (step, init) = pyplot.subplots(1, 2, figsize=(11, 4.2))
    for key, label, scale in (("cold_compile_s", "cold: backend compile", 1.0),
                              ("lower_s", "lowering (paid cold and warm)", 1.0),
                              ("warm_load_s", "warm: cache retrieval", 1.0),
                              ("verify_extra_ms", "verify on top of lowering", 1e-3)):
        step.plot(layers, [scale * row[key] for row in rows], marker="o", label=label)
    step.set(title="jit_train_step", xlabel="layers", ylabel="seconds (log)", yscale="log")
    for key, label in (("cold_first_step_s", "time to first step, cold"),
                       ("warm_first_step_s", "time to first step, warm"),
                       ("bare_wall_s", "bare lower().compile() process"),
                       ("prewarm_wall_s", "prewarm job")):
        init.plot(layers, [row[key] for row in rows], marker="o", label=label)
    init.set(title="whole process, from its start", xlabel="layers", ylabel="seconds")
    init.set_ylim(bottom=0)
    save_figure(figure, [step, init], layers, title, path)
    return True


def save_figure(figure: Any, panels: list[Any], ticks: list[int], title: str,
                path: Path) -> None:
    """Every benchmark chart's finish: a log2 x axis ticked at the measured sizes, a grid
    and a legend per panel, the title, the PNG."""
    from matplotlib import pyplot

    for axes in panels:
        axes.set_xscale("log", base=2)
        axes.set_xticks(ticks, [str(n) for n in ticks])
        axes.grid(alpha=0.3)
        axes.legend(fontsize=8)
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    pyplot.close(figure)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (1, 2):
        print("usage: python -m bench.chart RESULT.json [PNG]", file=sys.stderr)
        return 2
    source = Path(args[0])
    target = Path(args[1]) if len(args) == 2 else source.with_suffix(".png")
    result = json.loads(source.read_text())
    if not write_chart(result["step"]["rows"], describe(result), target):
        print("bench.chart: matplotlib is not installed (pip install -e '.[bench]')",
              file=sys.stderr)
        return 1
    print(f"chart: {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
