"""Reading init reports back and showing them: one row per job attempt and process.

On CPU only process 0 can hit (JAX hashes each process's local devices into the key there),
so the table shows every process as it is instead of summarising the run as "hit".
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

from launcher.rundir import JOBS, TRAIN, reports_dir
from prewarm.jaxkey.components import explain_miss

log = logging.getLogger("jaxwarm.report")

_REPORT_NAME = re.compile(r"^(?P<job>[a-z]+)-r(?P<restart>\d+)-p(?P<process>\d+)\.json$")
_JOB_ORDER = {job: order for order, job in enumerate(JOBS)}


def load_reports(run_dir: str | Path) -> list[dict[str, Any]]:
    """Every report of a run, in job, restart, process order."""
    found = []
    for path in reports_dir(run_dir).glob("*.json"):
        match = _REPORT_NAME.match(path.name)
        if match:
            try:
                report = json.loads(path.read_text())
            except (OSError, ValueError) as exc:
                log.warning("skipping %s: not a readable report (%s)", path, exc)
                continue
            found.append((_JOB_ORDER.get(match["job"], 9), int(match["restart"]),
                          int(match["process"]), report))
    return [report for *_, report in sorted(found, key=lambda item: item[:3])]


def short_key(key: str | None) -> str:
    """Module name plus the first 16 hex digits: enough to tell keys apart in a table."""
    if key is None:
        return "-"
    name, _, digest = key.rpartition("-")
    return f"{name}-{digest[:16]}" if name else key[:16]


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _status(report: dict[str, Any]) -> str:
    if report["job"] == "prewarm" or report["time_to_first_step_s"] is None:
        return ""
    return "OVER BUDGET" if report["over_budget"] else "ok"


def format_table(reports: list[dict[str, Any]]) -> str:
    """The init report as text: a summary row per process, then per-function rows."""
    if not reports:
        return "no init reports yet"
    header = ("job", "restart", "proc", "lookups", "hits", "misses", "compile_s",
              "retrieval_s", "first_step_s", "budget_s", "init")
    rows = [header]
    for r in reports:
        rows.append((r["job"], str(r["restart_count"]), str(r["process_index"]),
                     str(r["lookups"]), str(r["hits"]), str(r["misses"]),
                     _seconds(r["backend_compile_s"]), _seconds(r["retrieval_s"]),
                     _seconds(r["time_to_first_step_s"]), f"{r['init_budget_s']:.0f}",
                     _status(r)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip()
             for row in rows]
    lines.append("")
    lines.append("functions (cache lookups and compiles, per process):")
    for r in reports:
        for fn in r["functions"]:
            if fn["key"] is None:
                outcome = "NO-CACHE"
            else:
                outcome = "HIT" if fn["hit"] else "MISS"
            key = short_key(fn["key"])
            lines.append(f"  {r['job']:<7} r{r['restart_count']} p{r['process_index']}  "
                         f"{fn['name']:<28} {outcome:<8} {fn['seconds']:8.2f} s  {key}")
        for warning in r.get("warnings", []):
            lines.append(f"  WARNING {r['job']} r{r['restart_count']} p{r['process_index']}: "
                         f"{warning}")
    return "\n".join(lines)


def summarize(reports: list[dict[str, Any]], manifest: dict[str, Any]) -> list[str]:
    """Headline lines for the functions the prewarm manifest knows: did the latest training
    attempt hit them on process 0, how much compile time did that save, and why a miss."""
    train = [r for r in reports if r["job"] == TRAIN]
    if not train:
        return []
    latest = max(r["restart_count"] for r in train)
    attempt = [r for r in train if r["restart_count"] == latest]
    prewarmed = {entry.function for entry in manifest.values()}
    lines = []
    for report in attempt:
        if report["process_index"] != 0:
            continue
        for fn in report["functions"]:
            if fn["name"] not in prewarmed or fn["key"] is None:
                continue
            entry = manifest.get(fn["key"])
            if fn["hit"]:
                saved = "" if entry is None else (
                    f"; prewarm compiled it in {entry.compile_s:.2f} s, "
                    f"so this saved {entry.compile_s - fn['seconds']:.2f} s")
                lines.append(f"{fn['name']}: HIT on process 0 (restart {latest}), "
                             f"loaded in {fn['seconds']:.2f} s{saved}")
            else:
                lines.append(f"{fn['name']}: MISS on process 0 (restart {latest}), "
                             f"compiled in {fn['seconds']:.2f} s")
                lines.extend(f"  why: {line}"
                             for line in explain_miss(fn["name"], fn["components"], manifest))
    others = [r for r in attempt if r["process_index"] != 0]
    if others and not any(r["hits"] for r in others):
        which = "process 1" if len(others) == 1 else f"processes 1-{len(others)}"
        lines.append(f"{which}: no hits; on CPU JAX hashes each process's "
                     f"local devices into the key, so only process 0 can hit")
    return lines


def format_verdicts(verdicts: list[dict[str, Any]]) -> list[str]:
    """verify's answer per function: WARM or COLD, the key, the cost, and why when cold."""
    lines = []
    for v in verdicts:
        lines.append(f"{'WARM' if v['warm'] else 'COLD'}  {v['function']}  {v['key']}  "
                     f"(lowering {v['lower_s']:.2f} s + key {1e3 * v['predict_s']:.1f} ms)")
        lines.extend(f"      why: {line}" for line in v["explanation"])
    return lines


def attempt_summaries(reports: list[dict[str, Any]]) -> list[str]:
    """One line per attempt of the training job (restart 0, 1, ...), from process 0."""
    lines = []
    for r in reports:
        if r["job"] == TRAIN and r["process_index"] == 0:
            lines.append(f"attempt r{r['restart_count']}: {r['hits']} hit(s) of {r['lookups']} "
                         f"lookup(s) on process 0, compile {r['backend_compile_s']:.2f} s, "
                         f"first step {_seconds(r['time_to_first_step_s'])} s "
                         f"of a {r['init_budget_s']:.0f} s budget {_status(r)}")
    return lines
