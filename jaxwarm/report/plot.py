"""`jaxwarm report RUN_DIR --plot init.png`: a run's init as a picture.

One horizontal bar per process (processes of one job attempt that did the same thing, hit
or miss per function, folded into one bar of their median phases), its init phases stacked
in the order they happen, cold bars (they compiled a prewarmed function) beside warm ones
(they loaded it), and the init budget as a vertical line. matplotlib is optional (the `plot`
extra); without it, one line says how to get it. The picture goes to exactly the path asked,
a `.png`, in a dir that exists (or inside the run dir): `plot_path`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from jaxwarm.core.errors import ConfigError
from jaxwarm.core.records import ORDER, TRAINER_INIT, InitReport
from jaxwarm.report.read import PrewarmedFunctions, fold_owners, fold_phases

# Pixels: 100 per inch. The height grows with the bars so that labels never overlap.
DPI = 100
WIDTH_PX = 1000
BASE_HEIGHT_PX = 160
BAR_HEIGHT_PX = 45
# The legend: at most this many phases a row (the longest names side by side fit the
# width), each row this many pixels high, under the axis label.
LEGEND_COLUMNS = 5
LEGEND_ROW_PX = 16
COLORS = {"imports": "#9e9e9e", "distributed": "#8d6e63", "trace": "#42a5f5",
          "lower": "#1565c0", "key prediction": "#ab47bc", "compile": "#e53935",
          "cache load": "#43a047", "waiting for ranks": "#6d4c41", "first step": "#ffb300",
          "the trainer's own init": "#80cbc4", "other": "#e0e0e0"}


# Roughly how wide one character of the owners' 6-point text is, in pixels.
OWNER_CHAR_PX = 3.6


def _name_owners(axes: Any, rows: list[int], bars: list[tuple[str, dict[str, float]]],
                 owners: list[dict[str, float]], limit: float, width_px: int) -> None:
    """Inside each bar's "the trainer's own init", its largest owners, as many as fit."""
    px_per_s = width_px * 0.67 / limit  # the axes take 67% of the width (subplots_adjust)
    for row, (_, phases), named in zip(rows, bars, owners, strict=True):
        own = phases.get(TRAINER_INIT, 0.0)
        # Where the segment's middle is: the phases before it, in ORDER, then half of it.
        middle = sum(v for n, v in phases.items() if ORDER.index(n) < ORDER.index(TRAINER_INIT))
        middle += own / 2
        text = ""
        for name, seconds in named.items():
            longer = f"{text}, {name} {seconds:.1f}" if text else f"{name} {seconds:.1f} s"
            if len(longer) * OWNER_CHAR_PX > own * px_per_s:
                break
            text = longer
        if text:
            axes.text(middle, row, text, ha="center", va="center", fontsize=6)


def size_px(bars: int) -> tuple[int, int]:
    """The picture's width and height in pixels for a number of bars."""
    return WIDTH_PX, BASE_HEIGHT_PX + BAR_HEIGHT_PX * bars


def plot_path(path: Path, run_dir: Path) -> Path:
    """Where `--plot` writes, checked before anything is read: a `.png` (matplotlib would add
    the suffix to any other name, and write another file than the one said), not a dir, in
    a dir that exists; a missing dir is made only inside the run dir."""
    if path.suffix.lower() != ".png":
        raise ConfigError(f"{path}: --plot writes a PNG: give a path ending in .png")
    if path.is_dir():
        raise ConfigError(f"{path}: --plot expects a file path ending in .png, got a directory")
    parent = path.absolute().parent
    if not parent.is_dir():
        if not parent.is_relative_to(run_dir.absolute()):
            raise ConfigError(f"{path}: --plot: no directory {parent}; it makes missing "
                              f"directories only inside the run dir {run_dir}")
        parent.mkdir(parents=True, exist_ok=True)
    return path


def _pyplot() -> Any:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("--plot needs matplotlib: pip install 'jaxwarm[plot]'") from None
    return plt


def plot_init(reports: list[InitReport], targets: PrewarmedFunctions, budget_s: float,
              path: Path, title: str) -> Path:
    """Draw the run's init phases into a PNG at exactly `path` (see `plot_path`)."""
    plt = _pyplot()
    bars = fold_phases(reports, targets)
    if not bars:
        raise ConfigError(f"{title}: no init report with phases to plot (a job writes them "
                          f"at its first step)")
    figure = draw(plt, bars, budget_s, title, fold_owners(reports, targets))
    figure.savefig(path, dpi=DPI, format="png")
    plt.close(figure)
    return path


def draw(plt: Any, bars: list[tuple[str, dict[str, float]]], budget_s: float | None,
         title: str, owners: list[dict[str, float]] | None = None) -> Any:
    """The figure of the bars (label, seconds by phase); with `owners` (what the init ledger
    named of the trainer's own init, per bar), the largest are named inside its segment; the
    init budget as a line, unless None (a benchmark's launches, which set none of their own)."""
    width, height = size_px(len(bars))
    figure, axes = plt.subplots(figsize=(width / DPI, height / DPI), dpi=DPI)
    labels = [label for label, _ in bars]
    rows = list(range(len(bars)))[::-1]  # the first bar on top
    for name in ORDER:
        lefts = [sum(v for n, v in phases.items() if ORDER.index(n) < ORDER.index(name))
                 for _, phases in bars]
        widths = [phases.get(name, 0.0) for _, phases in bars]
        if any(widths):
            axes.barh(rows, widths, left=lefts, height=0.6, color=COLORS[name], label=name,
                      edgecolor="white", linewidth=0.5)
    longest = max(sum(phases.values()) for _, phases in bars)
    for row, (_, phases) in zip(rows, bars, strict=True):
        axes.text(sum(phases.values()), row, f" {sum(phases.values()):.1f} s", va="center",
                  fontsize=8)
    limit = longest * 1.15
    if budget_s is not None and budget_s <= limit * 1.5:
        limit = max(limit, budget_s * 1.05)
        axes.axvline(budget_s, color="black", linestyle="--", linewidth=1)
        axes.text(budget_s, len(bars) - 0.45, f" budget {budget_s:g} s", fontsize=8,
                  va="bottom")
    elif budget_s is not None:  # far off to the right: said at the edge, bars readable
        axes.annotate(f"budget {budget_s:g} s \u2192", xy=(1.0, 1.0), xycoords="axes fraction",
                      ha="right", va="bottom", fontsize=8)
    axes.set_xlim(0, limit)
    _name_owners(axes, rows, bars, owners or [{}] * len(bars), limit, width)
    axes.set_ylim(-0.6, len(bars) - 0.4)
    axes.set_yticks(rows, labels, fontsize=8)
    axes.set_xlabel("seconds from process start to the first step")
    axes.set_title(f"init phases: {title}", fontsize=10, loc="left")
    handles, names = axes.get_legend_handles_labels()
    legend_rows = math.ceil(len(names) / LEGEND_COLUMNS)
    figure.legend(handles, names, ncol=math.ceil(len(names) / legend_rows), fontsize=7,
                  loc="lower center", bbox_to_anchor=(0.5, 4 / height), frameon=False)
    figure.subplots_adjust(left=0.3, right=0.97, top=1 - 45 / height,
                           bottom=(70 + LEGEND_ROW_PX * legend_rows) / height)
    return figure
