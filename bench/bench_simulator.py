"""Requests/s one `tokenmill sim-sglang` process serves on one core at zero delay.

The simulator runs as a subprocess pinned to one core (os.sched_setaffinity),
answers short completions (``--zero-delay``, lengths ~16 tokens), and an
aiohttp client pinned to another core drives it with N concurrent
keep-alive connections. The same client then drives a minimal aiohttp
"hello" JSON handler (same core, same process setup) as a baseline, and the
table reports the simulator's rate as a ratio to it.

Both servers are timed the same way: answers counted by the same client over
the same wall-clock window (after a warm-up). A server has no "last
committed record", so this one benchmark measures a steady rate, not launch
to finish; the server's CPU seconds over the window are reported apart.

    python bench/bench_simulator.py [--seconds 5] [--concurrency 64]
                                    [--out bench/results/simulator.json]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.figures import Figure, Recorder, console_table, ratio

READY = "listening on "
TARGET_RPS = 2000.0

BASELINE_SERVER = """
import sys
from aiohttp import web
import msgspec
BODY = msgspec.json.encode({"hello": "world"})
async def hello(request):
    await request.read()
    return web.Response(body=BODY, content_type="application/json")
app = web.Application()
app.router.add_post("/v1/chat/completions", hello)
async def main():
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, backlog=4096)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    print("baseline listening on http://127.0.0.1:%d" % port, flush=True)
    import asyncio
    await asyncio.Event().wait()
import asyncio
asyncio.run(main())
"""


def _cores() -> tuple[set[int] | None, set[int] | None]:
    """(server core, client cores) when pinning is possible."""
    try:
        cores = sorted(os.sched_getaffinity(0))
    except AttributeError:
        return None, None
    if len(cores) < 2:
        return {cores[0]}, {cores[0]}
    return {cores[0]}, set(cores[1:])


def start(argv: list[str], core: set[int] | None) -> tuple[subprocess.Popen[str], str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, env=env, cwd=ROOT)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if READY not in line:
        proc.kill()
        raise RuntimeError(f"server did not start: {line!r}")
    if core is not None:
        os.sched_setaffinity(proc.pid, core)
    return proc, line.split(READY, 1)[1].strip()


class _Conn(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection sending requests back to back.

    A raw protocol instead of aiohttp's client: the Python HTTP client would
    saturate its own core long before one server core does.
    """

    def __init__(self, bench: _Load, wid: int) -> None:
        self.bench = bench
        self.wid = wid
        self.i = 0
        self.buf = bytearray()
        self.need = -1
        self.t0 = 0.0
        self.transport: asyncio.Transport | None = None
        self.closed = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.send()

    def send(self) -> None:
        b = self.bench
        if time.perf_counter() >= b.t_end:
            assert self.transport is not None
            self.transport.close()
            return
        body = (b'{"model":"bench","max_tokens":32,"messages":[{"role":"user","content":'
                b'"question %d-%d"}]}' % (self.wid, self.i))
        self.i += 1
        head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\n"
                b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                % (b.host, len(body)))
        self.t0 = time.perf_counter()
        assert self.transport is not None
        self.transport.write(head + body)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            if self.need < 0:
                end = self.buf.find(b"\r\n\r\n")
                if end < 0:
                    return
                head = bytes(self.buf[:end]).lower()
                pos = head.find(b"content-length:")
                eol = head.find(b"\r\n", pos)
                length = int(head[pos + 15 : eol if eol > 0 else None])
                self.status_ok = head.startswith(b"http/1.1 200")
                del self.buf[: end + 4]
                self.need = length
            if len(self.buf) < self.need:
                return
            del self.buf[: self.need]
            self.need = -1
            self.bench.record(time.perf_counter() - self.t0, self.status_ok)
            self.send()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


class _Load:
    def __init__(self, host: str, t_measure: float, t_end: float) -> None:
        self.host = host.encode()
        self.t_measure = t_measure
        self.t_end = t_end
        self.latencies: list[float] = []
        self.errors = 0

    def record(self, latency: float, ok: bool) -> None:
        if time.perf_counter() < self.t_measure:
            return
        if ok:
            self.latencies.append(latency)
        else:
            self.errors += 1


async def drive(url: str, seconds: float, concurrency: int, warmup: float) -> dict[str, float]:
    """Closed-loop load: `concurrency` connections posting back to back."""
    hostport = url.split("//", 1)[1]
    host, port = hostport.rsplit(":", 1)
    now = time.perf_counter()
    load = _Load(hostport, now + warmup, now + warmup + seconds)
    loop = asyncio.get_running_loop()
    conns = []
    for wid in range(concurrency):
        _, proto = await loop.create_connection(functools.partial(_Conn, load, wid), host,
                                                int(port))
        conns.append(proto)
    await asyncio.gather(*(c.closed for c in conns))
    lat = sorted(load.latencies)
    return {
        "rps": len(lat) / seconds,
        "p50_ms": 1000 * statistics.median(lat) if lat else float("nan"),
        "p99_ms": 1000 * lat[int(0.99 * (len(lat) - 1))] if lat else float("nan"),
        "errors": load.errors,
    }


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc), NaN elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def measure(argv: list[str], server_core: set[int] | None, seconds: float,
            concurrency: int) -> dict[str, float]:
    proc, url = start(argv, server_core)
    try:
        warmup = min(1.0, seconds / 3)
        cpu0, t0 = cpu_seconds(proc.pid), time.perf_counter()
        result = asyncio.run(drive(url, seconds, concurrency, warmup=warmup))
        cpu1, t1 = cpu_seconds(proc.pid), time.perf_counter()
        result["server_cpu"] = (cpu1 - cpu0) / (t1 - t0)
        result["server_cpu_s"] = (cpu1 - cpu0) * seconds / (t1 - t0)
        return result
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per target")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--out", type=Path, default=None, help="write the raw results (JSON)")
    args = parser.parse_args()
    recorder = Recorder("bench_simulator")

    from rich.console import Console
    from rich.table import Table

    server_core, client_cores = _cores()
    if client_cores is not None:
        os.sched_setaffinity(0, client_cores)
    sim_argv = [sys.executable, "-m", "tokenmill.cli", "sim-sglang", "--port", "0",
                "--zero-delay", "--length-median", "16", "--length-sigma", "0.3",
                "--length-max", "64", "--log-level", "warning", "--log-format", "json"]
    base_argv = [sys.executable, "-c", BASELINE_SERVER]
    results = {
        "aiohttp hello (baseline)": measure(base_argv, server_core, args.seconds,
                                            args.concurrency),
        "tokenmill sim-sglang": measure(sim_argv, server_core, args.seconds, args.concurrency),
    }
    base = results["aiohttp hello (baseline)"]["rps"]
    table = Table(title=f"one server process on core {sorted(server_core or [])}, "
                        f"{args.concurrency} connections, {args.seconds:g}s measured")
    for col in ("target", "req/s", "vs baseline", "p50 ms", "p99 ms", "server CPU",
                "req/CPU-s", "errors"):
        table.add_column(col, justify="right" if col != "target" else "left")
    for name, r in results.items():
        table.add_row(name, f"{r['rps']:,.0f}", f"{r['rps'] / base:.2f}x",
                      f"{r['p50_ms']:.2f}", f"{r['p99_ms']:.2f}",
                      f"{100 * r['server_cpu']:.0f}%", f"{r['rps'] / r['server_cpu']:,.0f}",
                      str(int(r["errors"])))
    console = Console(width=120)
    console.print(table)
    sim_r, base_r = results["tokenmill sim-sglang"], results["aiohttp hello (baseline)"]
    figure = Figure(
        name="simulator, zero delay, short answers", unit="req/s", tokenmill=round(sim_r["rps"]),
        baseline=round(base_r["rps"]), baseline_name="aiohttp 'hello' JSON handler",
        ratio=ratio(sim_r["rps"], base_r["rps"]), target=f">= {TARGET_RPS:,.0f} req/s",
        met=sim_r["rps"] >= TARGET_RPS,
        method=(f"wall clock, answers counted by the same closed-loop client ({args.concurrency} "
                f"keep-alive connections) over {args.seconds:g} s after a warm-up, each server "
                "in its own process pinned to one core (a server: a steady rate, not launch to "
                "finish)"),
        tokenmill_wall_s=args.seconds, baseline_wall_s=args.seconds,
        tokenmill_cpu_s=round(sim_r["server_cpu_s"], 2),
        baseline_cpu_s=round(base_r["server_cpu_s"], 2),
        details={name: {k: round(v, 3) for k, v in r.items()} for name, r in results.items()})
    recorder.write(args.out, [figure])
    console.print(console_table("simulator (wall clock)", [figure]))
    console.print("req/CPU-s = req/s divided by the server's CPU share: the rate one fully "
                  "busy core would serve (the client may keep the server below 100% CPU)")


if __name__ == "__main__":
    main()
