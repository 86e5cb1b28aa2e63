"""Running the real `specdash` command the way a user or a script does."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time


def specdash(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "specdash", *args], capture_output=True, text=True, timeout=timeout
    )


def assert_usage_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    """Exit 2, no traceback, exactly one line on stderr containing every needle.
    (A negative code such as -SIGABRT would mean llama.cpp saw bad input first.)"""
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def assert_ok(proc: subprocess.CompletedProcess) -> None:
    """Exit 0; otherwise fail saying how the child ended (a signal by name: a native crash
    in llama.cpp shows as "killed by SIGSEGV", with faulthandler's report) and what it
    printed on stderr."""
    from specdash.engine.repack import describe_exit

    assert proc.returncode == 0, f"{describe_exit(proc.returncode)}; stderr:\n{proc.stderr[-3000:]}"


def read_url(proc: subprocess.Popen, pattern: str, timeout: float = 60) -> tuple[str, list[str]]:
    """Read a server's stderr until a line matches `pattern` (its group 1 is the URL), then
    keep draining its stderr (and stdout, when piped) in threads, or the child blocks on a
    full pipe. Returns (URL, the lines so far, which go on growing)."""
    lines: list[str] = []
    assert proc.stderr is not None
    url = ""
    deadline = time.monotonic() + timeout
    while not url and time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        m = re.search(pattern, line)
        if m:
            url = m.group(1)
    assert url, "".join(lines)

    def drain(stream) -> None:
        for line in stream:
            lines.append(line)

    for stream in (proc.stderr, proc.stdout):
        if stream is not None:
            threading.Thread(target=drain, args=(stream,), daemon=True).start()
    return url, lines
