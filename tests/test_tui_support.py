"""Fakes for the dashboard tests (no tests here): a Session that replays a recorded run,
a Session that fails, and telemetry fixed to a fake 2-node sysfs tree.

The replay comes from a real run of the engine (tests/fixtures/replay_*.jsonl, the JSON
lines `specdash run --json` printed, brought to schema 1: its settings lines filled in
with the settings that run had, and with the `supports` list the engine reports for that
configuration, as `specdash run --json --target smollm2-135m --draft lookup` prints it);
nothing in it is made up.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import queue
from pathlib import Path

from specdash.contract import events as C
from specdash.engine.settings import EngineSettings
from specdash.contract.events import SettingsEvent, Summary, from_dict
from specdash.contract.errors import SpecdashError
from specdash.telemetry import Hint, ProcessStats, TelemetrySnapshot, read_numa_nodes
from specdash.tui.app import DashboardOptions, SpecdashApp
from specdash.sources.embedded import WorkItem

FIXTURES = Path(__file__).parent / "fixtures"
TWO_NODE = FIXTURES / "sysfs_2node"
REPLAY = FIXTURES / "replay_smollm2_lookup.jsonl"

def load_replay(path: Path = REPLAY) -> list:
    return [from_dict(json.loads(line)) for line in path.read_text(encoding="utf-8").splitlines()]


class ReplaySession:
    """The Session interface over recorded events. The recording holds several runs (each
    ends with its Summary); the n-th run() replays the n-th. The last one is replayed
    without its Summary and then behaves like a paused engine: it blocks until Stop
    (then yields a "stopped" Summary), so the screen stays on the recorded state."""

    def __init__(self, settings: EngineSettings, progress=None, *, events=None):
        if progress:
            progress("loading target (replay)", None)
            progress("ready", 1.0)
        self.settings = settings
        self.groups: list[list] = [[]]
        for ev in load_replay() if events is None else events:
            self.groups[-1].append(ev)
            if isinstance(ev, Summary):
                self.groups.append([])
        self.groups = [g for g in self.groups if g]
        self.sent: list = []
        self.runs: list[str] = []
        self.closed = False
        self._commands: queue.Queue = queue.Queue()

    def send(self, cmd) -> None:
        self.sent.append(cmd)
        self._commands.put(cmd)

    def apply_pending(self):
        return []  # commands wait for the next run, as before

    def run(self, prompt: str, max_tokens=None):
        self.runs.append(prompt)
        group = self.groups[min(len(self.runs), len(self.groups)) - 1]
        last = len(self.runs) >= len(self.groups)
        for ev in group:
            if not (last and isinstance(ev, Summary)):
                yield ev
        if last:
            # Then behave like a paused engine that still applies settings commands, so
            # the dashboard's keys round-trip: command in, SettingsEvent out.
            current = [ev for ev in group if isinstance(ev, SettingsEvent)][-1]
            while not isinstance(cmd := self._commands.get(), C.Stop):
                match cmd:
                    case C.SetK(k):
                        current = dataclasses.replace(current, k=k, command=cmd.text())
                    case C.SetSampling(temperature=t) if t is not None:
                        current = dataclasses.replace(current, temperature=t, command=cmd.text())
                    case C.SetAdaptive(on):
                        current = dataclasses.replace(current, adaptive=on, command=cmd.text())
                    case _:
                        continue
                yield current
            yield dataclasses.replace(group[-1], stop_reason="stopped")

    def close(self) -> None:
        self.closed = True


class FailingSession:
    def __init__(self, settings, progress=None):
        raise SpecdashError("model 'nope': not a known model and no such file")


class FixedSampler:
    """Telemetry with no wall-clock or machine-dependent value: loads are a fixed
    pattern, NUMA memory comes from the fake 2-node sysfs tree."""

    def __init__(self, root: Path = TWO_NODE):
        self._nodes = tuple(read_numa_nodes(root))
        self.calls = 0

    def sample(self) -> TelemetrySnapshot:
        self.calls += 1
        loads = tuple(float((i * 37) % 101) for i in range(16))
        process = ProcessStats(pid=4242, rss_bytes=612 * 2**20, cpu_percent_of_core=187.0,
                               cpu_percent_of_machine=11.7, threads=9)
        return TelemetrySnapshot(timestamp=0.0, core_loads=loads, numa_nodes=self._nodes,
                                 process=process, sample_seconds=0.0)


HINTS = [
    Hint("warn", "omp", "OMP_NUM_THREADS is unset: set OMP_NUM_THREADS=2", "environment"),
    Hint("info", "thp", "transparent huge pages [madvise]", "/sys/kernel/mm/transparent_hugepage/enabled"),
    Hint("ok", "threads", "threads=2 fits the 2 physical cores", "/proc/cpuinfo"),
]


# The recorded session: three built-in prompts in turn (their texts are not needed: the
# replay ignores what it is asked).
WORKLOAD = [WorkItem(title, "") for title in
            ("code-generation (code)", "code-edit (edit)", "json-extraction (json)")]


def replay_app(tmp_path: Path | None = None, *, session_factory=None, prompt: str | None = None,
               theme: str = "specdash-dark", **options) -> SpecdashApp:
    settings = EngineSettings(adaptive=False, target="smollm2-135m", draft="lookup", k=4, threads=2)
    opts = DashboardOptions(
        settings=settings,
        prompt=prompt,
        workload=WORKLOAD,
        theme=theme,
        refresh=0.1,  # fixed telemetry: polls change nothing, and panels catch up fast
        screenshots_dir=str(tmp_path / "shots") if tmp_path else "/nonexistent",
        **options,
    )
    factory = session_factory or (lambda s, p: ReplaySession(s, p))
    return SpecdashApp(opts, session_factory=factory, sampler=FixedSampler(), cpu_meter=lambda: 1.5,
                       hints=lambda: HINTS)


def sync(test):
    """Run an async test function under asyncio.run (no pytest async plugin needed)."""

    @functools.wraps(test)
    def wrapper(*args, **kwargs):
        return asyncio.run(test(*args, **kwargs))

    return wrapper
