"""The folder of kept cost profiles: one TOML file per (machine, target, settings) key,
in whatif's format, loaded at start and saved after every run.

$SPECDASH_PROFILE_DIR says where (default $SPECDASH_CACHE/profiles). A server and a
`specdash run` may save at once: saves take an exclusive lock on the folder's `.lock`
and replace the file atomically (write a temporary, then rename), so a reader sees the
old file or the new one, never half of one; sizes another process timed and this one
did not are kept. A file that does not parse, or whose [key] is not this run's, is
said in one line and replaced by the next save: the run starts cold, never fails.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from specdash.costs.key import key_digest, profile_key
from specdash.engine.kept_costs import KeptCosts
from specdash.contract.errors import SpecdashError
from specdash.contract.paths import cache_dir
from specdash.costs.profile import Profile, parse_profile

if TYPE_CHECKING:
    from specdash.engine.llm import LLM

PROFILE_DIR_ENV = "SPECDASH_PROFILE_DIR"


def profile_dir() -> Path:
    env = os.environ.get(PROFILE_DIR_ENV)
    return Path(env).expanduser() if env else cache_dir() / "profiles"


@dataclass(frozen=True)
class KeptFile:
    """A kept profile as doctor lists it."""

    path: Path
    target: str
    age_s: float
    timings: int
    sizes: int
    problem: str = ""  # why it would be dropped ("" when it parses)


class ProfileStore:
    def __init__(self, folder: Path | None = None):
        self.folder = folder or profile_dir()
        # A loaded target's key, by what it is made of: it hashes the model file's first MiB
        # and reads /proc/cpuinfo, and a server saves after every request.
        self._keys: dict[tuple[str, int, int, int | None, str], dict[str, str | int]] = {}

    def key(self, target: LLM, experts: int | None) -> dict[str, str | int]:
        made_of = (str(target.path), int(target.n_threads), int(target.n_batch), experts, target.repack.mode)
        if made_of not in self._keys:
            self._keys[made_of] = profile_key(target, experts)
        return self._keys[made_of]

    def path_for(self, key: dict[str, str | int]) -> Path:
        return self.folder / f"{Path(str(key['target'])).stem}-{key_digest(key)}.toml"

    def load(self, target: LLM, experts: int | None) -> KeptCosts | str | None:
        key = self.key(target, experts)
        path = self.path_for(key)
        if not path.exists():
            return None
        profile = _read(path)
        if isinstance(profile, str):
            return f"kept cost profile {path}: {profile}; starting without it (it is replaced when this run saves)"
        differ = [k for k in key if profile.key.get(k) != key[k]]
        if differ:
            return (f"kept cost profile {path} was measured for another {', '.join(differ)}; "
                    "starting without it (it is replaced when this run saves)")
        return _kept(profile, path)

    def save(self, target: LLM, experts: int | None, kept: KeptCosts) -> str | None:
        key = self.key(target, experts)
        path = self.path_for(key)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            with _locked(self.folder / ".lock"):
                verify, samples, drafts = dict(kept.verify_ms), dict(kept.samples), dict(kept.draft_ms)
                other = _read(path) if path.exists() else None
                if isinstance(other, Profile) and other.key == key:
                    # What another process timed and this one did not (a server and a run at once).
                    for n, ms in other.verify.items():
                        if n not in verify:
                            verify[n], samples[n] = ms, other.samples.get(n, 1)
                    drafts = {**other.draft_models, **drafts}
                profile = Profile(
                    name=f"{path.stem}", verify=verify, samples=samples, key=key, draft_models=drafts,
                    note=f"kept by specdash: {key['target']} on {key['cpu']}, {key['threads']} threads",
                    measured=datetime.now(timezone.utc))
                tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
                tmp.write_text(profile.to_toml(), encoding="utf-8")
                os.replace(tmp, path)
        except OSError as exc:
            return f"could not keep the cost profile in {self.folder}: {exc.strerror or exc}"
        return None

    def files(self) -> list[KeptFile]:
        """Every kept profile here, newest first (doctor)."""
        out = []
        for path in sorted(self.folder.glob("*.toml")) if self.folder.is_dir() else []:
            profile = _read(path)
            if isinstance(profile, str):
                out.append(KeptFile(path, "?", time.time() - path.stat().st_mtime, 0, 0, profile))
                continue
            kept = _kept(profile, path)
            out.append(KeptFile(path, str(profile.key.get("target", "?")), kept.age_s, kept.timings, len(kept.verify_ms)))
        return sorted(out, key=lambda f: f.age_s)


def _read(path: Path) -> Profile | str:
    """The profile, or why it cannot be used (one line)."""
    try:
        profile = parse_profile(path.read_text(encoding="utf-8"), str(path))
    except (OSError, UnicodeDecodeError) as exc:
        return f"cannot read it ({exc.__class__.__name__})"
    except SpecdashError as exc:
        return str(exc).removeprefix(f"{path}: ")
    if not profile.key or profile.measured is None:
        return "not a kept profile (no [key] or measured)"
    return profile


def _kept(profile: Profile, path: Path) -> KeptCosts:
    assert profile.measured is not None
    age = max(0.0, (datetime.now(timezone.utc) - profile.measured).total_seconds())
    samples = {n: profile.samples.get(n, 1) for n in profile.verify}
    return KeptCosts(dict(profile.verify), samples, dict(profile.draft_models), str(path), age)


@contextmanager
def _locked(lock: Path) -> Iterator[None]:
    with open(lock, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def describe_kept(target: Path, threads: int | None = None, experts: int | None = None) -> str:
    """One line for `check`: the kept profile a run of `target` with default settings
    (this machine's physical cores, n_batch 512, the repack verdict) would load."""
    from specdash.costs.key import key_for
    from specdash.engine import repack
    from specdash.engine.kept_costs import age_text
    from specdash.telemetry.cpu import physical_cores

    key = key_for(target, threads or physical_cores().count, 512, experts, repack.resolve().mode)
    path = ProfileStore().path_for(key)
    if not path.is_file():
        return (f"costs: no kept profile for {target.name} here ({key['threads']} threads): the first run times "
                "each batch size when a decision needs it; `specdash calibrate` times them all now")
    profile = _read(path)
    if isinstance(profile, str):
        return f"costs: kept profile {path} is unusable ({profile}): the next run replaces it"
    kept = _kept(profile, path)
    return (f"costs: kept profile {path}: {kept.timings} timings of {len(kept.verify_ms)} batch sizes, "
            f"saved {age_text(kept.age_s)} ago")
