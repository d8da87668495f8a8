"""Wall clock and peak memory of `tokenmill report`'s aggregation on a
1M-record lineage, generated synthetically straight into it (no broker, no
S3: what is measured is the report's own work, which the command adds to
reading the objects and topics export also reads).

The lineage: a root run of N prompts (7% dead-lettered `length`, 2%
`failed`, the rest accepted S3 lines, 5% of them conversations) and a
redrive of the `length` ones at a larger max_tokens, all accepted; 8 GPUs'
progress records, one commit every 2 s for a day each. The records are
real lines and dead letters (bench/report_records.py, encoded with the
schemas and the sink's sample writer): a pool of templates whose prompt id
is rewritten per record, so generating them costs a fraction of a
microsecond and the baseline (the same child generating and iterating every
record without aggregating) shows what is generation.

Each side runs in a child process of its own, launched and timed here:
wall clock from launch to exit (interpreter start-up and imports
included), CPU seconds and peak RSS from os.wait4's rusage (a fresh
process, not a fork, so ru_maxrss is the child's own).

    python bench/bench_report.py [--records 1000000] [--out bench/results/bench_report-1m.txt]
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import msgspec  # noqa: E402

from bench import report_records  # noqa: E402

POOL = 4000
GPUS = 8
DAY_S = 86_400
COMMIT_S = 2.0


def _pool(run: str, max_tokens: int) -> tuple[list[bytes], list[bytes], list[bytes]]:
    """Accepted lines, `length` and `failed` dead letters to copy from."""
    accepted: list[bytes] = []
    length: list[bytes] = []
    failed: list[bytes] = []
    for ok, data in report_records.results(POOL * 3, run=run, max_tokens=max_tokens,
                                           conversations=0.05, failures=0.2):
        if ok:
            accepted.append(data)
        elif b'"reason":"failed"' in data:
            failed.append(data)
        else:
            length.append(data)
    return accepted[:POOL], length[:POOL] or accepted[:1], failed[:POOL]


def _with_id(template: bytes, i: int) -> bytes:
    """The template with prompt id i: every line and dead letter starts `{"id":"<32 hex>"`."""
    assert template.startswith(b'{"id":"') and template[39:40] == b'"'
    return b'{"id":"' + b"%032x" % i + template[39:]


def _fate(i: int) -> str:
    k = (i * 2654435761) % 100  # spread over the run, not in blocks
    return "length" if k < 7 else "failed" if k < 9 else "accepted"


def lineage(n: int) -> tuple[Iterator[bytes], Iterator[tuple[bytes, bytes]], Iterator[bytes]]:
    """The root's lines and (key, value) dead letters, and the redrive's lines."""
    accepted, length, failed = _pool("root", 4096)
    answers, _, _ = _pool("redrive", 16384)

    def root_lines() -> Iterator[bytes]:
        for i in range(n):
            if _fate(i) == "accepted":
                yield _with_id(accepted[i % len(accepted)], i)

    def root_letters() -> Iterator[tuple[bytes, bytes]]:
        for i in range(n):
            fate = _fate(i)
            if fate != "accepted":
                pool = length if fate == "length" else failed
                yield b"%032x" % i, _with_id(pool[i % len(pool)], i)

    def redrive_lines() -> Iterator[bytes]:
        for i in range(n):
            if _fate(i) == "length":
                yield _with_id(answers[i % len(answers)], i)

    return root_lines(), root_letters(), redrive_lines()


def child(n: int, aggregate: bool) -> None:
    from ops.dataset.index import LineageIndex, RunFacts
    from ops.report.aggregate import Aggregator, TimelineBuilder
    from ops.report.build import WriteFile, feed, write_report

    redriven = sum(1 for i in range(n) if _fate(i) == "length")
    facts = [RunFacts("root", "produce", prompts=n, accepted=n - redriven),
             RunFacts("redrive", "redrive", frozenset({"length"}), prompts=redriven,
                      accepted=redriven)]
    started = time.monotonic()
    if not aggregate:  # the baseline: generate and iterate, nothing else
        count = 0
        lines, letters, answers = lineage(n)
        for _ in lines:
            count += 1
        for _ in letters:
            count += 1
        for _ in answers:
            count += 1
        print(msgspec.json.encode({"records": count, "seconds": time.monotonic() - started})
              .decode())
        return
    index = LineageIndex(facts)
    _, letters, _ = lineage(n)
    index.add_run((key.decode(), "length" if b'"reason":"length"' in value else "failed")
                  for key, value in letters)
    index.add_run(())
    agg = Aggregator([4096, 16384])
    lines, letters, answers = lineage(n)
    feed(agg, index, 0, lines, letters)
    feed(agg, index, 1, answers, ())
    timeline = TimelineBuilder()
    timeline.add_plan("root", n / DAY_S)
    for record in report_records.progress("root", gpus=GPUS, seconds=DAY_S, every=COMMIT_S,
                                          total=n):
        timeline.add("root", record)
    found = agg.figures("bench", ["root", "redrive"], timeline.timeline(),
                        timeline.accept_by_gpu())
    sizes = [len(line) for line in _pool("root", 4096)[0]]
    out = Path(tempfile.mkdtemp(prefix="bench-report-"))
    write_report(WriteFile(out), found)
    print(msgspec.json.encode({
        "records": found.records, "accepted": found.accepted, "dead_letters": found.dead_letters,
        "progress_records": timeline.snapshots, "seconds": time.monotonic() - started,
        "page_bytes": (out / "report.html").stat().st_size,
        "line_bytes": sum(sizes) / len(sizes)}).decode())


def timed(n: int, aggregate: bool) -> dict[str, float]:
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, __file__, "--child", str(n),
                             *(["--aggregate"] if aggregate else [])], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    output = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - started
    if status != 0:
        raise SystemExit(f"child failed ({status})")
    found: dict[str, float] = msgspec.json.decode(output.splitlines()[-1])
    return {**found, "wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime,
            "peak_rss_mb": usage.ru_maxrss / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--aggregate", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args.child, args.aggregate)
        return
    random.seed(0)
    load = os.getloadavg()
    base = timed(args.records, False)
    report = timed(args.records, True)
    lines = [
        f"# python bench/bench_report.py --records {args.records}",
        f"# {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}, {os.cpu_count()} CPUs, "
        f"load average before {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}, after "
        f"{os.getloadavg()[0]:.1f}",
        f"lineage: {args.records:,} prompts (root + redrive of its length dead letters; S3 "
        f"lines of {report['line_bytes']:,.0f} B on average), "
        f"{report['progress_records']:,.0f} progress records ({GPUS} GPUs, a day, one commit "
        f"every {COMMIT_S:g} s)",
        f"{'what':<46} {'wall s':>7} {'CPU s':>7} {'peak RSS MB':>12} {'records':>10}",
        f"{'baseline: generate + iterate the records':<46} {base['wall_s']:>7.1f} "
        f"{base['cpu_s']:>7.1f} {base['peak_rss_mb']:>12.0f} {base['records']:>10,.0f}",
        f"{'tokenmill report: index + aggregate + render':<46} {report['wall_s']:>7.1f} "
        f"{report['cpu_s']:>7.1f} {report['peak_rss_mb']:>12.0f} {report['records']:>10,.0f}",
        f"report: {report['accepted']:,.0f} accepted, {report['dead_letters']:,.0f} dead letters"
        f" in the figures; page {report['page_bytes'] / 1024:,.0f} KB; targets: < 60 s "
        f"{'met' if report['wall_s'] < 60 else 'MISSED'}, < 500 MB "
        f"{'met' if report['peak_rss_mb'] < 500 else 'MISSED'}",
    ]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
