"""`jaxwarm cache ls|stats|prune|verify|export|import`: the cache store from the command line.

Each command takes the cache of a config (CONFIG [KEY.SUB=VALUE ...]) or a cache dir path;
export and import need a config, which says what the run needs and where it runs. Each asks
the store; a remote cache dir refuses, in one line, what only a local or mounted one can do.
"""

from __future__ import annotations

import argparse
import re
import time
from dataclasses import dataclass
from pathlib import Path

from jaxwarm.core.config import CacheConfig, Config, add_overrides_argument, load_config
from jaxwarm.core.errors import EXIT_FAILED, EXIT_OK, ConfigError
from jaxwarm.core.files import canonical_path
from jaxwarm.core.jsonio import dumps
from jaxwarm.core.records import JobUsage
from jaxwarm.core.words import human_age, human_size, plural
from jaxwarm.jaxkey.entryformat import split_key
from jaxwarm.job.start.pinned import resolve_paths
from jaxwarm.store.bundle import DEFAULT_IMPORT_LIMIT
from jaxwarm.store.cachestore import CacheStore
from jaxwarm.store.entries import Entry
from jaxwarm.store.store import open_store
from jaxwarm.store.usage import KeyHistory

_SIZE = re.compile(r"^(?P<number>\d+(\.\d+)?)\s*(?P<unit>[KMGT]?i?B?)?$", re.IGNORECASE)
_AGE = re.compile(r"^(?P<number>\d+(\.\d+)?)\s*(?P<unit>[smhdw]?)$")
_AGE_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_size(text: str) -> int:
    """'500M', '10GB', '2GiB', '123' -> bytes (powers of 1024, as `du -h` shows them)."""
    match = _SIZE.match(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"expected a size like 500M or 10G, got {text!r}")
    unit = (match["unit"] or "").upper()[:1]
    return int(float(match["number"]) * 1024 ** " KMGT".index(unit or " "))


def parse_age(text: str) -> float:
    """'30m', '12h', '7d', '2w' or seconds -> seconds."""
    match = _AGE.match(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"expected an age like 12h or 7d, got {text!r}")
    return float(match["number"]) * _AGE_UNITS[match["unit"]]


def add_parser(commands: argparse._SubParsersAction) -> None:
    cache = commands.add_parser("cache", help="inspect, check, prune and move a cache")
    actions = cache.add_subparsers(dest="cache_command", required=True)

    def target(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("target", help="a config file (its cache.dir) or a cache dir")
        add_overrides_argument(parser)

    ls = actions.add_parser("ls", help="entries by function: size, age, last use, who used them")
    target(ls)
    ls.add_argument("--json", action="store_true", help="print one JSON list")
    stats = actions.add_parser("stats", help="total size, entries, hit history")
    target(stats)
    stats.add_argument("--json", action="store_true", help="print one JSON object")
    pruner = actions.add_parser(
        "prune", help="remove least recently used entries; safe while jobs run")
    target(pruner)
    pruner.add_argument("--max-size", type=parse_size, help="keep the cache within this size")
    pruner.add_argument("--older-than", type=parse_age, help="remove entries unused this long")
    pruner.add_argument("--include-pinned", action="store_true",
                        help="also remove entries a prewarm manifest lists")
    check = actions.add_parser(
        "verify", help="check every entry; quarantine bad ones (exit 1 when any was bad)")
    target(check)
    export = actions.add_parser("export", help="write the entries a config needs to one file")
    target(export)
    export.add_argument("-o", "--output", type=Path, required=True, help="bundle file (.tar)")
    export.add_argument("--all", action="store_true", help="every entry in the cache")
    importer = actions.add_parser("import", help="add a bundle's entries to a config's cache")
    importer.add_argument("bundle", type=Path)
    target(importer)
    importer.add_argument("--max-bytes", type=parse_size, default=DEFAULT_IMPORT_LIMIT,
                          help=f"refuse a bundle adding more than this (default "
                               f"{DEFAULT_IMPORT_LIMIT >> 30}G)")


def resolve_target(target: str, overrides: list[str]) -> tuple[CacheStore, Config | None]:
    """(cache store, config or None) of a CONFIG or DIR argument."""
    path = Path(target)
    if path.is_file():
        config = resolve_paths(load_config(path, overrides))
        store = open_store(config.cache.dir)
        store.check(config.cache, config.source)
        return store, config
    if overrides:
        raise ConfigError(f"{target}: overrides need a config file, got a directory")
    if not path.is_dir():
        raise ConfigError(f"{target}: expected a config file or an existing cache dir")
    store = open_store(canonical_path(path))
    store.check(CacheConfig(), target)
    return store, None


def require_config(config: Config | None, target: str, action: str) -> Config:
    if config is None:
        raise ConfigError(f"{target}: 'cache {action}' needs a config file (it says which "
                          f"entries the run needs and where it runs), got a directory")
    return config


@dataclass(frozen=True)
class EntryRow:
    """One entry as `cache ls` shows it (and prints with --json)."""

    function: str
    key: str
    size: int
    age_s: float
    last_used_s: float
    pinned: bool
    produced_by: str | None
    used_by: list[str]
    hits: int
    misses: int


def entry_rows(store: CacheStore) -> list[EntryRow]:
    histories = store.histories()
    manifest = store.manifest()
    now = time.time()
    rows = []
    for entry in store.scan(histories):
        history = histories.get(entry.key, KeyHistory())
        made = manifest.get(entry.key)
        rows.append(EntryRow(
            function=entry.function, key=entry.key, size=entry.size,
            age_s=now - entry.created, last_used_s=now - entry.last_used,
            pinned=made is not None,
            # The usage log knows the latest writer (e.g. a run that rewrote a quarantined
            # entry); the manifest knows the prewarm, for entries written before the log.
            produced_by=history.written_by or (f"{made.run} (prewarm)" if made else None),
            used_by=history.used_by, hits=history.hits, misses=history.misses))
    return sorted(rows, key=lambda r: (r.function, r.last_used_s))


def cmd_ls(store: CacheStore) -> list[str]:
    rows = entry_rows(store)
    lines = []
    for function in sorted({r.function for r in rows}):
        group = [r for r in rows if r.function == function]
        lines.append(f"{function}: {len(group)} {plural(len(group), 'entry', 'entries')}, "
                     f"{human_size(sum(r.size for r in group))}")
        for row in group:
            suffix = split_key(row.key)[1][:12]
            lines.append(
                f"  {suffix}  {human_size(row.size):>9}  age {human_age(row.age_s):>4}  "
                f"last used {human_age(row.last_used_s):>4} ago"
                f"{'  pinned' if row.pinned else ''}"
                f"  made by {row.produced_by or 'unknown'}"
                f"  used by {', '.join(row.used_by) or 'nobody yet'}")
    return lines or [f"{store.dir}: no entries"]


@dataclass(frozen=True)
class JobStart:
    """One job start of the usage log, as `cache stats` lists the latest ones."""

    time: float
    run: str
    job: str
    restart: int
    hits: int
    lookups: int


@dataclass(frozen=True)
class CacheStats:
    """What `cache stats` shows (and prints with --json)."""

    cache_dir: str
    entries: int
    total_bytes: int
    functions: int
    pinned: int
    quarantined: int
    jobs_recorded: int
    lookups: int
    hits: int
    history: list[JobStart]


def cache_stats(store: CacheStore) -> CacheStats:
    """The usage log is read once (the store keeps what it parsed): for the entries' last
    use and for the job history."""
    entries: list[Entry] = store.scan()
    jobs = [r for r in store.usage() if isinstance(r, JobUsage)]
    history = [JobStart(time=r.time, run=r.run, job=r.job, restart=r.restart,
                        hits=sum(f.hit for f in r.functions), lookups=len(r.functions))
               for r in jobs]
    return CacheStats(
        cache_dir=store.dir, entries=len(entries), total_bytes=sum(e.size for e in entries),
        functions=len({e.function for e in entries}),
        pinned=len(set(store.manifest()) & {e.key for e in entries}),
        quarantined=store.quarantined(),
        jobs_recorded=len(jobs), lookups=sum(item.lookups for item in history),
        hits=sum(item.hits for item in history), history=history[-10:])


def format_stats(stats: CacheStats) -> list[str]:
    lines = [f"{stats.cache_dir}: {stats.entries} entries of {stats.functions} "
             f"function(s), {human_size(stats.total_bytes)}, {stats.pinned} pinned by a "
             f"manifest, {stats.quarantined} quarantined",
             f"history: {stats.jobs_recorded} job start(s) recorded, {stats.hits} hit(s) "
             f"in {stats.lookups} lookup(s)"]
    for item in stats.history:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(item.time))
        lines.append(f"  {when}  {item.run} {item.job} r{item.restart}: "
                     f"{item.hits}/{item.lookups} hit")
    return lines


def run(args: argparse.Namespace) -> int:
    """Dispatch one `jaxwarm cache` command; returns the exit code."""
    store, config = resolve_target(args.target, args.overrides)
    action = args.cache_command
    if action == "ls":
        if args.json:
            print(dumps(entry_rows(store), indent=1))
        else:
            print("\n".join(cmd_ls(store)))
    elif action == "stats":
        stats = cache_stats(store)
        print(dumps(stats, indent=1) if args.json else "\n".join(format_stats(stats)))
    elif action == "prune":
        return cmd_prune(args, store)
    elif action == "verify":
        checks, seconds = store.check_and_quarantine()
        bad = [c for c in checks if not c.ok]
        for check in bad:
            print(f"QUARANTINED {check.key}: {check.problem}")
        with_sum = sum(c.checksum_known for c in checks)
        print(f"{len(checks)} entries checked in {seconds:.2f} s ({with_sum} against a recorded "
              f"checksum): {len(checks) - len(bad)} intact, {len(bad)} quarantined")
        return EXIT_FAILED if bad else EXIT_OK
    elif action == "export":
        return cmd_export(args, store, require_config(config, args.target, action))
    elif action == "import":
        config = require_config(config, args.target, action)
        store.prepare(config.cache, config.source)
        added, present = store.import_bundle(args.bundle, config, args.max_bytes)
        print(f"imported {len(added)} {plural(len(added), 'entry', 'entries')} "
              f"({len(present)} already there) into {store.dir}")
    return 0


def cmd_prune(args: argparse.Namespace, store: CacheStore) -> int:
    if args.max_size is None and args.older_than is None:
        raise ConfigError(f"{args.target}: 'cache prune' needs --max-size and/or --older-than")
    removed = store.prune(max_bytes=args.max_size, older_than_s=args.older_than,
                          include_pinned=args.include_pinned)
    left = store.scan()
    print(f"pruned {len(removed)} {plural(len(removed), 'entry', 'entries')} "
          f"({human_size(sum(e.size for e in removed))}); {len(left)} left, "
          f"{human_size(sum(e.size for e in left))}")
    if args.max_size is not None and sum(e.size for e in left) > args.max_size:
        print(f"still over {human_size(args.max_size)}: the rest is pinned by a prewarm "
              f"manifest (--include-pinned removes those too)")
    return 0


def cmd_export(args: argparse.Namespace, store: CacheStore, config: Config) -> int:
    meta = store.export_bundle(config, args.output, every=args.all)
    size = args.output.stat().st_size
    count = len(meta.entries)
    print(f"exported {count} {plural(count, 'entry', 'entries')} to {args.output} "
          f"({human_size(size)}; jax {meta.jax_version}, {meta.platform}, "
          f"{'portable' if meta.portable else 'only for cache dir ' + store.dir})")
    return 0

