"""`jaxwarm report RUN_DIR --plot init.png`: the init phases per process (folded when
identical), cold beside warm, the budget; a valid PNG of the size the number of bars gives,
its legend whole inside it, at exactly the path asked (a `.png`; no dir made outside the run
dir). Drawn from the fixture run's reports (real matplotlib, no JAX)."""

from __future__ import annotations

import shutil
import struct
import zlib
from pathlib import Path

import pytest

from jaxwarm.cli.main import main
from jaxwarm.core.errors import ConfigError
from jaxwarm.core.records import ORDER, TRAIN
from jaxwarm.core.rundir import pinned_config, report_path
from jaxwarm.report.plot import _pyplot, draw, plot_init, size_px
from jaxwarm.report.read import PrewarmedFunctions, fold_phases, load_reports
from jaxwarm.store.store import LocalStore
from tests.conftest import run_cli

FIXTURES = Path(__file__).parent / "fixtures"
RUN, CACHE = FIXTURES / "run", FIXTURES / "cache"


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk, after checking the signature and CRC."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and length == 13
    crc = struct.unpack(">I", data[16 + length:20 + length])[0]
    assert zlib.crc32(data[12:16 + length]) == crc
    assert data.endswith(b"IEND\xaeB`\x82")
    return struct.unpack(">II", data[16:24])


def test_the_picture_is_a_png_of_one_bar_per_process_outcome(tmp_path: Path) -> None:
    reports = load_reports(RUN)
    targets = PrewarmedFunctions.of(LocalStore(CACHE).manifest())
    bars = fold_phases(reports, targets)
    # The fixture's training job: process 0 loaded the step (warm), process 1 compiled it.
    assert [label for label, _ in bars] == ["train r0 p0  warm", "train r0 p1  cold"]
    assert sum(bars[0][1].values()) == pytest.approx(10.99)
    path = plot_init(reports, targets, 1800, tmp_path / "init.png", "run demo")
    assert png_size(path) == size_px(2)


def test_identical_processes_fold_into_one_bar_of_their_median(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    report_path(run, TRAIN, 0, 2).unlink()  # the fixture's malformed one
    one = report_path(run, TRAIN, 0, 1).read_text()
    for process in (2, 3):
        report_path(run, TRAIN, 0, process).write_text(
            one.replace('"process_index": 1', f'"process_index": {process}'))
    bars = fold_phases(load_reports(run), PrewarmedFunctions.of(LocalStore(CACHE).manifest()))
    assert [label for label, _ in bars] == [
        "train r0 p0  warm", "train r0 p1-p3 (3 processes, median)  cold"]
    path = plot_init(load_reports(run), PrewarmedFunctions.of(LocalStore(CACHE).manifest()), 12.0,
                     tmp_path / "budget.png", "run demo")  # a budget within the bars
    assert png_size(path) == size_px(2)


@pytest.mark.parametrize("phases", [1, 6, len(ORDER)])
@pytest.mark.parametrize("bars", [1, 3])
def test_the_legend_fits_whole_under_the_axis(phases: int, bars: int) -> None:
    """Every phase's entry inside the picture (the last one was cut off at the right edge)
    and below the axis label."""
    plt = _pyplot()
    drawn = [(f"train r0 p{i}  warm", {name: 1.0 for name in ORDER[:phases]})
             for i in range(bars)]
    figure = draw(plt, drawn, 1800, "run demo")
    try:
        figure.canvas.draw()
        (legend,) = figure.legends
        box = legend.get_window_extent()
        assert [text.get_text() for text in legend.get_texts()] == list(ORDER[:phases])
        assert 0 <= box.x0 and box.x1 <= figure.bbox.width
        assert 0 <= box.y0 and box.y1 < figure.axes[0].xaxis.label.get_window_extent().y0
        assert (figure.bbox.width, figure.bbox.height) == pytest.approx(size_px(bars))
    finally:
        plt.close(figure)


def pinned_run(tmp_path: Path) -> Path:
    """The fixture run with a pinned config that points at the fixture cache."""
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    pinned_config(run).write_text(
        f"run: {{name: demo}}\ncache: {{dir: {CACHE}}}\nmesh: {{axes: {{data: 1}}}}\n"
        f"step: {{factory: 'jaxwarm.workload.chunkwise:make_train_step'}}\n"
        f"entrypoint: {{command: [jaxwarm-train]}}\n")
    return run


def test_plot_writes_exactly_the_path_asked(tmp_path: Path) -> None:
    run = pinned_run(tmp_path)
    assert main(["report", str(run), "--plot", str(tmp_path / "init.png")]) == 0
    assert png_size(tmp_path / "init.png") == size_px(2)
    inside = run / "plots" / "init.PNG"  # a missing dir inside the run dir is made
    assert main(["report", str(run), "--plot", str(inside)]) == 0
    assert png_size(inside) == size_px(2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["init.png", "run"]


@pytest.mark.parametrize(("asked", "problem"), [
    ("runs", "--plot writes a PNG: give a path ending in .png"),
    ("init.svg", "--plot writes a PNG: give a path ending in .png"),
    ("elsewhere/deep/init.png", "it makes missing directories only inside the run dir"),
    ("a-dir.png", "got a directory"),
])
def test_a_plot_path_it_cannot_write_exactly_is_one_line(
        tmp_path: Path, asked: str, problem: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`--plot runs` wrote `runs.png` and said `runs`; a missing parent was made anywhere."""
    run = pinned_run(tmp_path)
    (tmp_path / "a-dir.png").mkdir()
    before = sorted(tmp_path.rglob("*"))
    assert main(["report", str(run), "--plot", str(tmp_path / asked)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [lines[0]] and lines[0].startswith(
        f"jaxwarm: error: {tmp_path / asked}: ") and problem in lines[0], lines
    assert sorted(tmp_path.rglob("*")) == before  # nothing written, no dir made


def test_nothing_to_draw_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no init report with phases"):
        plot_init([], PrewarmedFunctions.of({}), 1800, tmp_path / "x.png", "run empty")


@pytest.mark.e2e
def test_without_matplotlib_the_cli_says_how_to_get_it(tmp_path: Path) -> None:
    shadow = tmp_path / "shadow" / "matplotlib"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('no matplotlib here')\n")
    run = pinned_run(tmp_path)
    result = run_cli("report", str(run), "--plot", str(tmp_path / "init.png"),
                     env={"PYTHONPATH": str(tmp_path / "shadow")})
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == \
        "jaxwarm: error: --plot needs matplotlib: pip install 'jaxwarm[plot]'"
    ok = run_cli("report", str(run), "--plot", str(tmp_path / "init.png"))
    assert ok.returncode == 0, ok.stderr
    assert png_size(tmp_path / "init.png") == size_px(2)
