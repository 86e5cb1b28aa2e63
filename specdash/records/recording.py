"""Recordings: a run's whole event stream as JSON lines, and reading one back.

Line 1 is a header: schema and specdash version, when, the models (path, size, sha256)
and the machine (CPU model, cores, NUMA nodes). Every later line is one contract event
(specdash/contract/events.py). Lines are written and flushed as they come, so a crash loses at
most the line being written; a reader stops at the first bad line and says where.

The header needs the models, which are known once the source reports its settings, so
events before the first SettingsEvent (loading progress) wait in memory until then.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import platform
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from specdash import __version__
from specdash.contract import events as E
from specdash.contract.errors import SpecdashError

HEADER = "header"


@dataclass
class Recording:
    path: Path
    header: dict[str, Any]
    events: list[E.Event]
    problem: str = ""  # where and why reading stopped early; "" when the file was whole
    lines_read: int = 0

    @property
    def duration(self) -> float:
        """Seconds from the first timed event to the last."""
        times = [ev.t for ev in self.events if ev.t]
        return max(times) - min(times) if times else 0.0


class Recorder:
    """Appends events to `path` (a listener: feed it every event, from one thread)."""

    def __init__(self, path: str | Path, *, extra: dict[str, Any] | None = None,
                 late_extra: Callable[[], dict[str, Any]] | None = None):
        """extra: more header fields; late_extra: more, asked for when the header is
        written (what is known only once the source answered, e.g. a server's build)."""
        self.path = Path(path).expanduser()
        self._extra = extra or {}
        self._late_extra = late_extra
        self._file: IO[str] | None = None
        self._waiting: list[E.Event] = []
        self._lock = threading.Lock()  # `run` records telemetry from a second thread
        self.lines = 0
        self.bytes = 0
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Owner-only (prompts and answers are the user's), and never through a symlink
            # someone else planted in a shared folder under the name we picked.
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
            self._file = os.fdopen(fd, "w", encoding="utf-8")
        except OSError as exc:
            raise SpecdashError(f"--record {self.path}: cannot write it ({exc.strerror or exc})") from None

    def __call__(self, event: E.Event) -> None:
        self.feed(event)

    def feed(self, event: E.Event) -> None:
        with self._lock:
            self._feed(event)

    def _feed(self, event: E.Event) -> None:
        if self._file is None:
            return
        if self.lines == 0:
            if not isinstance(event, E.SettingsEvent):
                self._waiting.append(event)
                return
            self._write(make_header(event, self._header_extra()))
            waiting, self._waiting = self._waiting, []
            for ev in waiting:
                self._write(E.to_dict(ev))
        self._write(E.to_dict(event))

    def _header_extra(self) -> dict[str, Any]:
        late = self._late_extra() if self._late_extra is not None else {}
        return {**self._extra, **late}

    def _write(self, data: dict[str, Any]) -> None:
        assert self._file is not None
        line = json.dumps(data, ensure_ascii=False, separators=(",", ":")) + "\n"
        self._file.write(line)
        self._file.flush()  # a crash loses at most this line
        self.lines += 1
        self.bytes += len(line.encode("utf-8"))

    def close(self) -> None:
        with self._lock:
            self._close()

    def _close(self) -> None:
        if self._file is not None:
            for ev in self._waiting:  # a source that never reported settings: keep what came
                if self.lines == 0:
                    self._write(make_header(None, self._header_extra()))
                self._write(E.to_dict(ev))
            self._waiting = []
            self._file.close()
            self._file = None


def sample_telemetry(sink: Callable[[E.Event], None], interval: float = 1.0) -> Callable[[], None]:
    """Feed `sink` a TelemetryEvent every `interval` seconds from a thread (what the
    dashboard does on its timer, for `run --record`); returns the function that stops it."""
    from specdash.telemetry import TelemetrySampler

    stop = threading.Event()
    sampler = TelemetrySampler()

    def body() -> None:
        while not stop.wait(interval):
            sink(E.TelemetryEvent.of(sampler.sample()))

    threading.Thread(target=body, name="specdash-telemetry", daemon=True).start()
    return stop.set


def make_header(settings: E.SettingsEvent | None, extra: dict[str, Any]) -> dict[str, Any]:
    models = []
    if settings is not None:
        for role, spec, path in (("target", settings.target, settings.target_path),
                                 ("draft", settings.draft, settings.draft_path)):
            if path:
                models.append(model_entry(role, spec or "", Path(path)))
    return {
        "event": HEADER,
        "schema": E.SCHEMA,
        "specdash": __version__,
        "created": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "source": settings.source if settings else "",
        "models": models,
        "machine": machine(),
        **extra,
    }


def model_entry(role: str, spec: str, path: Path) -> dict[str, Any]:
    try:
        size = path.stat().st_size
    except OSError:
        return {"role": role, "name": spec, "path": str(path), "size": None, "sha256": None}
    return {"role": role, "name": spec, "path": str(path), "size": size, "sha256": file_sha256(path)}


def file_sha256(path: Path) -> str:
    """The file's sha256, remembered per (path, size, mtime) in the specdash cache: a
    1 GB model is hashed once (about a second), not at every recording. Built-in models
    were verified against the registry's sha256 when fetched, so that is used as is."""
    from specdash.models.registry import BUILTIN, cache_dir, model_path

    st = path.stat()
    for name, spec in BUILTIN.items():
        if model_path(name) == path and st.st_size == spec.size:
            return spec.sha256
    memo = cache_dir() / "sha256.json"
    key = f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}"
    try:
        known = json.loads(memo.read_text())
    except (OSError, ValueError):
        known = {}
    if key in known:
        return str(known[key])
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    known[key] = digest = h.hexdigest()
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo.with_suffix(".tmp")
        tmp.write_text(json.dumps(known))
        os.replace(tmp, memo)
    except OSError:
        pass  # the memo is an optimisation
    return digest


def machine() -> dict[str, Any]:
    from specdash.telemetry import physical_cores, read_numa_nodes

    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        numa = len([n for n in read_numa_nodes("/") if not n.source.startswith("proc")])
    except Exception:  # telemetry is best effort here: a recording must not fail for it
        numa = 0
    return {
        "cpu_model": cpu,
        "physical_cores": physical_cores().count,
        "logical_cpus": os.cpu_count(),
        "numa_nodes": numa,
        "system": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
    }


def read_recording(path: str | Path) -> Recording:
    """Everything up to the first bad line; `problem` says where reading stopped and why.
    A file that is not a recording at all (no header) is a SpecdashError."""
    path = Path(path).expanduser()
    try:
        handle = path.open("r", encoding="utf-8", errors="strict")
    except FileNotFoundError:
        raise SpecdashError(f"{path}: no such file") from None
    except OSError as exc:
        raise SpecdashError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    with handle:
        lines = numbered_lines(handle)
        first = next(lines, None)
        if first is None:
            raise SpecdashError(f"{path}: empty file; not a specdash recording")
        n, text = first
        try:
            header = json.loads(text) if text is not None else None
        except ValueError:
            header = None
        if not isinstance(header, dict) or header.get("event") != HEADER:
            raise SpecdashError(f"{path}: line 1 is not a specdash recording header "
                                "(record one with `specdash run --record FILE` or `specdash --record FILE`)")
        check_header_schema(header, path)
        rec = Recording(path, header, [], lines_read=1)
        for n, text in lines:
            if text is None:
                rec.problem = f"stopped at line {n}: not UTF-8 text"
                break
            try:
                data = json.loads(text)
            except ValueError:
                complete = text.endswith("\n")
                rec.problem = (f"stopped at line {n}: " +
                               ("not valid JSON" if complete else "the line is cut off (truncated file)"))
                break
            try:
                rec.events.append(E.from_dict(data))
            except E.ContractError as exc:
                rec.problem = f"stopped at line {n}: {exc}"
                break
            rec.lines_read = n
        return rec


def check_header_schema(header: dict[str, Any], path: Path) -> None:
    """A recording header this specdash can read, or a one-line error naming the file."""
    if not isinstance(header.get("schema"), int) or header["schema"] > E.SCHEMA:
        raise SpecdashError(f"{path}: recorded with schema {header.get('schema')!r}; this specdash reads "
                            f"schema {E.SCHEMA} and older: upgrade specdash")


def numbered_lines(handle: IO[str]) -> Iterator[tuple[int, str | None]]:
    """(line number, text) of every non-blank line; text None where the file stops being
    UTF-8 (nothing after it is read)."""
    n = 0
    while True:
        n += 1
        try:
            line = handle.readline()
        except UnicodeDecodeError:
            yield n, None
            return
        if not line:
            return
        if line.strip():
            yield n, line


def recording_path(record_dir: str | Path, prefix: str = "specdash") -> Path:
    """A fresh file name in `record_dir` (the `record_dir` config key: record always)."""
    folder = Path(record_dir).expanduser()
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    path, n = folder / f"{prefix}-{stamp}.jsonl", 1
    while path.exists():
        n += 1
        path = folder / f"{prefix}-{stamp}-{n}.jsonl"
    return path


__all__ = ["Recorder", "Recording", "read_recording", "recording_path", "file_sha256", "machine"]

