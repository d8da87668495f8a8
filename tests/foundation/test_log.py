"""tokenmill.log: structlog imported at the first log line, configured as
the last `configure` said, never a line out unconfigured."""

import io
import json
import subprocess
import sys

from tokenmill import log


def test_status_imports_neither_structlog_nor_rich_until_it_draws_or_logs() -> None:
    """`status --json` is run by monitoring every few seconds, and each of
    these imports cost a starting fleet's machine CPU for nothing."""
    code = ("import json, sys, tokenmill.cli, ops.status; "
            "print(json.dumps([m for m in ('structlog', 'rich') if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert json.loads(out) == []


def test_the_last_configure_before_a_line_is_the_one_applied() -> None:
    first, second = io.StringIO(), io.StringIO()
    logger = log.get_logger("t")  # made before configure, as module-level loggers are
    log.configure("info", "json", stream=first)
    logger.info("one", n=1)
    log.configure("warning", "json", stream=second)
    logger.info("filtered out")
    logger.bind(k="v").warning("two")
    assert [json.loads(line)["event"] for line in first.getvalue().splitlines()] == ["one"]
    assert [json.loads(line) | {"timestamp": None} for line in second.getvalue().splitlines()] == [
        {"k": "v", "event": "two", "level": "warning", "timestamp": None}]


def test_threads_logging_their_first_lines_at_once_all_go_to_the_configured_stream() -> None:
    """The first line applies `configure`; a thread that logs meanwhile waits
    for it rather than writing with structlog's defaults (to stdout)."""
    code = """
import io, sys, threading
from tokenmill import log
stream = io.StringIO()
log.configure("info", "json", stream=stream)
start = threading.Barrier(8)
def work(i):
    start.wait()
    log.get_logger("t").info("line", thread=i)
threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
for t in threads: t.start()
for t in threads: t.join()
sys.stderr.write(stream.getvalue())
"""
    for _ in range(5):
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              check=True)
        assert done.stdout == ""
        assert sorted(json.loads(line)["thread"] for line in done.stderr.splitlines()) == list(
            range(8))
