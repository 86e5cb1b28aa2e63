"""Weight repacking: whether llama.cpp may move weights into its extra CPU buffer types,
decided per machine by trying, never from the CPU's name.

llama.cpp (`llama_model_params.use_extra_bufts`, on by default) repacks weights at load
into layouts its faster CPU kernels read: CPU_REPACK (interleaved rows for AVX2/AVX-512
and NEON) and, on Intel CPUs with AMX, an AMX buffer type listed first. On some AMX
machines (KVM guests among them) the AMX matmul faults on the first batch of more than
one token: SIGSEGV at `ldtilecfg` in `ggml_backend_amx_mul_mat` (llama.cpp #20824,
closed unfixed). A one-token decode works, so a quick check looks fine, and then every
verify batch kills the process. A crash cannot be caught, so it is found in a child
process: the probe loads a tiny model whose weights have the bundled models' types
(Q4_K, Q6_K, Q8_0, Q4_1) and decodes batches of several tokens, once per machine; the
verdict is cached in $SPECDASH_CACHE/repack, keyed by the CPU and llama-cpp-python.

Modes, in the order "auto" tries them (fastest first: benchmarks/results/repack.txt):
- ``on``: llama.cpp's default, every extra buffer type.
- ``no-amx``: extra buffer types off, and the weights CPU_REPACK can take pointed at it
  one by one (`tensor_buft_overrides`): AMX avoided, the AVX2/AVX-512 repacking kept.
  Only offered where llama.cpp lists an AMX buffer type.
- ``off``: no repacking at all, as llama-server's `--no-repack`.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specdash.contract.errors import SpecdashError
from specdash.contract.paths import cache_dir

SETTINGS = ("auto", "on", "no-amx", "off")
MODES = ("on", "no-amx", "off")
ENV = "SPECDASH_REPACK"
UPSTREAM = "llama.cpp #20824 (segfault in ggml_backend_amx_mul_mat)"
# Bump when the probe changes what it proves: older cached verdicts are then ignored.
PROBE_VERSION = 1
PROBE_TIMEOUT_S = 120.0  # a tiny model loads and decodes in about a second; a busy host is slower

# ggml types CPU_REPACK takes on x86 with AVX2 (AVX-512 for Q2_K), for a weight with a
# multiple of 8 rows: ggml_repack_get_optimal_repack_type in the vendored
# ggml/src/ggml-cpu/repack.cpp. Anything else stays in plain CPU memory under "no-amx"
# (a weight placed in CPU_REPACK that it cannot repack aborts the load).
_Q4_0, _Q2_K, _Q4_K, _IQ4_NL, _MXFP4 = 2, 10, 12, 20, 39
_REPACK_X86 = {_Q4_0: "avx2", _Q4_K: "avx2", _Q2_K: "avx512", _IQ4_NL: "avx2", _MXFP4: "avx2"}
# Weights that only ever enter a MUL_MAT (MUL_MAT_ID for experts). Embeddings are read by
# GET_ROWS, which a repacked layout cannot serve (llama-arch.cpp: LLM_TENSOR_TOKEN_EMBD).
_MATMUL_WEIGHT = re.compile(
    r"^(output|blk\.\d+\.(attn_(q|k|v|qkv|output|q_a|q_b|kv_a_mqa|kv_b|gate)|"
    r"ffn_(gate|up|down)(_exps|_shexp)?|ssm_(in|out)))\.weight$"
)


@dataclass(frozen=True, slots=True)
class Verdict:
    """What this process loads models with, and why."""

    mode: str  # "on" | "no-amx" | "off"
    setting: str  # what was asked: "auto" | "on" | "no-amx" | "off"
    origin: str  # "probe" (just now), "cache" (an earlier probe here), "setting", "env"
    tried: tuple[tuple[str, str], ...] = ()  # the probe's (mode, outcome) in order: ("on", "killed by SIGSEGV")
    extra_bufts: tuple[str, ...] = ()  # llama.cpp's extra CPU buffer types here, e.g. ("AMX", "CPU_REPACK")
    cpu: str = ""

    @property
    def crashed(self) -> tuple[str, str] | None:
        """The first probed mode that failed, with how."""
        return next(((m, o) for m, o in self.tried if o != "ok"), None)

    def why(self) -> str:
        """Why this mode, in a few words: "AMX crashed in a probe", "repack = off"."""
        if self.origin == "setting":
            return f"repack = {self.setting}"
        if self.origin == "env":
            return f"{ENV}={self.setting}"
        failed = self.crashed
        if failed is None:
            return "a probe decoded with it" if self.extra_bufts else "llama.cpp has no extra buffer type here"
        mode, outcome = failed
        what = "AMX" if mode == "on" and "AMX" in self.extra_bufts else f"repack {mode}"
        return f"{what} crashed in a probe" if outcome.startswith("killed") else f"{what} failed in a probe ({outcome})"

    def label(self) -> str:
        """For the status line, the help screen and settings events: "off (AMX crashed in a probe)"."""
        return self.mode if self.mode == "on" and self.origin != "setting" else f"{self.mode} ({self.why()})"

    def describe(self) -> str:
        """One line for doctor and the first run on a machine."""
        tried = "; ".join(f"{m}: {o}" for m, o in self.tried)
        bufts = ", ".join(self.extra_bufts) or "none"
        text = f"weight repacking {self.mode}: {self.why()} (extra buffer types: {bufts}"
        text += f"; probe: {tried})" if tried else ")"
        if self.crashed:
            text += f"; upstream: {UPSTREAM}; override with --repack, repack = ... in the config, or {ENV}"
        return text


# ------------------------------------------------------------------ what llama.cpp offers


def _libggml() -> Any:
    """llama-cpp-python's handle on libggml (whose dependencies include ggml-base and
    ggml-cpu): dlsym through it finds their symbols."""
    from llama_cpp._ggml import libggml  # internal module of the pinned llama-cpp-python

    return libggml


def extra_bufts() -> dict[str, int]:
    """llama.cpp's extra CPU buffer types, by name, as `make_cpu_buft_list` lists them
    (ggml_backend_dev_get_extra_bufts of the CPU device); {} if they cannot be read."""
    try:
        lib = _libggml()
        lib.ggml_backend_dev_by_type.restype = ctypes.c_void_p
        lib.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
        lib.ggml_backend_dev_backend_reg.restype = ctypes.c_void_p
        lib.ggml_backend_dev_backend_reg.argtypes = [ctypes.c_void_p]
        lib.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
        lib.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        lib.ggml_backend_buft_name.restype = ctypes.c_char_p
        lib.ggml_backend_buft_name.argtypes = [ctypes.c_void_p]
        dev = lib.ggml_backend_dev_by_type(0)  # GGML_BACKEND_DEVICE_TYPE_CPU
        reg = lib.ggml_backend_dev_backend_reg(dev) if dev else None
        addr = lib.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_dev_get_extra_bufts") if reg else None
        if not addr:
            return {}
        get = ctypes.CFUNCTYPE(ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)(addr)
        arr = get(dev)
        out: dict[str, int] = {}
        i = 0
        while arr and arr[i]:
            out[lib.ggml_backend_buft_name(arr[i]).decode()] = int(arr[i])
            i += 1
        return out
    except (AttributeError, OSError, ImportError):
        return {}


def _cpu_has(feature: str) -> bool:
    """What ggml-cpu was built for and runs on (ggml_cpu_has_avx2, ...)."""
    try:
        fn = getattr(_libggml(), f"ggml_cpu_has_{feature}")
    except (AttributeError, OSError, ImportError):
        return False
    fn.restype = ctypes.c_int
    return bool(fn())


def repack_overrides(tensors: Sequence[Any]) -> list[str]:
    """Names of the weights (gguf_header.TensorInfo: name, ggml_type, shape as ggml ne)
    that CPU_REPACK takes on this CPU: the "no-amx" mode points exactly these at it."""
    flags = {f: _cpu_has(f) for f in set(_REPACK_X86.values())}
    names = []
    for t in tensors:
        need = _REPACK_X86.get(t.ggml_type)
        dims = len(t.shape)
        experts = t.name.endswith("_exps.weight")
        if (need and flags[need] and _MATMUL_WEIGHT.match(t.name) and dims == (3 if experts else 2)
                and t.shape[1] % 8 == 0):
            names.append(t.name)
    return names


class ModelParams:
    """Applies a verdict to one `llama_model_params`; keep it alive until the load
    returns (llama.cpp reads the override array during the load)."""

    def __init__(self, mparams: Any, path: str | Path, verdict: Verdict):
        self._keep: list[Any] = []
        mparams.use_extra_bufts = verdict.mode == "on"
        if verdict.mode != "no-amx" or getattr(mparams, "vocab_only", False):
            return
        repack = extra_bufts().get("CPU_REPACK")
        if not repack:
            return
        from specdash.models.gguf_header import read_gguf_header

        names = repack_overrides(read_gguf_header(path).tensors)
        if not names:
            return
        # One pattern: llama.cpp compiles every override's regex for every tensor.
        pattern = ("^(" + "|".join(re.escape(n) for n in names) + ")$").encode()

        class Override(ctypes.Structure):
            _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]

        arr = (Override * 2)()
        arr[0].pattern, arr[0].buft = pattern, repack
        arr[1].pattern, arr[1].buft = None, None  # the terminator
        self._keep += [pattern, arr]
        mparams.tensor_buft_overrides = ctypes.cast(arr, ctypes.c_void_p).value


# ------------------------------------------------------------------ the probe

ChildArgv = Callable[[str, Path], list[str]]


def _child_argv(mode: str, model: Path) -> list[str]:
    return [sys.executable, "-m", "specdash.engine.repack_child", mode, str(model)]


def run_probe(mode: str, model: Path, *, child_argv: ChildArgv = _child_argv,
              timeout: float = PROBE_TIMEOUT_S) -> str:
    """Load and decode in a child with `mode`: "ok", "killed by SIGSEGV", "timed out
    after 120 s" or "exit 3: <its last stderr line>"."""
    env = dict(os.environ, **{ENV: mode})
    try:
        proc = subprocess.run(child_argv(mode, model), capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout:g} s"
    if proc.returncode == 0:
        return "ok"
    return describe_exit(proc.returncode, proc.stderr)


def describe_exit(returncode: int, stderr: str = "") -> str:
    """A child's end as words: "killed by SIGSEGV", "exit 3: <last stderr line>"."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    last = next((ln.strip() for ln in reversed(stderr.splitlines()) if ln.strip()), "")
    return f"exit {returncode}" + (f": {last[:160]}" if last else "")


def cpu_identity() -> tuple[str, str]:
    """(model name, sha1 of the flags) from /proc/cpuinfo; ("unknown", "") elsewhere."""
    name, flags = "unknown", ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name" and name == "unknown":
                name = value.strip()
            elif key in ("flags", "Features") and not flags:
                flags = " ".join(sorted(value.split()))
    except OSError:
        pass
    return name, hashlib.sha1(flags.encode()).hexdigest()[:12]


def cache_key() -> str:
    import llama_cpp

    name, flags = cpu_identity()
    raw = f"{name}|{flags}|{llama_cpp.__version__}|{PROBE_VERSION}"
    return hashlib.sha1(raw.encode()).hexdigest()[:16]


def cache_file() -> Path:
    return cache_dir() / "repack" / f"{cache_key()}.json"


def probe(*, child_argv: ChildArgv = _child_argv, timeout: float = PROBE_TIMEOUT_S,
          progress: Callable[[str], None] | None = None) -> Verdict:
    """Try the modes in order in children and take the first that decodes."""
    from specdash.engine.repack_model import probe_model

    bufts = tuple(extra_bufts())
    cpu = cpu_identity()[0]
    if not bufts:
        return Verdict("on", "auto", "probe", (), bufts, cpu)
    if progress:
        progress(f"checking llama.cpp's weight repacking on this CPU ({', '.join(bufts)}), once per machine")
    model = probe_model()
    tried: list[tuple[str, str]] = []
    for mode in MODES:
        if mode == "no-amx" and "AMX" not in bufts:
            continue
        outcome = run_probe(mode, model, child_argv=child_argv, timeout=timeout)
        tried.append((mode, outcome))
        if outcome == "ok" or mode == "off":
            break
    return Verdict(tried[-1][0], "auto", "probe", tuple(tried), bufts, cpu)


def _read_cache(path: Path) -> Verdict | None:
    try:
        d = json.loads(path.read_text())
        if d.get("probe_version") != PROBE_VERSION or d.get("mode") not in MODES:
            return None
        return Verdict(d["mode"], "auto", "cache", tuple((m, o) for m, o in d["tried"]),
                       tuple(d["extra_bufts"]), d.get("cpu", ""))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_cache(path: Path, v: Verdict) -> None:
    import llama_cpp

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({
        "probe_version": PROBE_VERSION, "mode": v.mode, "tried": v.tried, "extra_bufts": v.extra_bufts,
        "cpu": v.cpu, "llama_cpp_python": llama_cpp.__version__,
        "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }, indent=2) + "\n")
    os.replace(tmp, path)


# ------------------------------------------------------------------ the process's verdict

_lock = threading.Lock()
_resolved: dict[str, Verdict] = {}


@dataclass
class _Hooks:
    """Where a fresh verdict is told (the CLI prints it; the dashboard shows it), and the
    probe's child for tests."""

    announce: Callable[[str], None] | None = None
    progress: Callable[[str], None] | None = None
    child_argv: ChildArgv = field(default=_child_argv)
    timeout: float = PROBE_TIMEOUT_S


hooks = _Hooks()


def check_setting(value: Any, what: str) -> str:
    """`value` as a repack setting, or a one-line error naming `what` (a key, flag or variable)."""
    if isinstance(value, str) and value.strip().lower() in SETTINGS:
        return value.strip().lower()
    sep = "" if what.endswith("=") else " "
    shown = json.dumps(value) if isinstance(value, str) else repr(value)  # as config.py shows values
    raise SpecdashError(f"{what}{sep}{shown}: must be one of {', '.join(SETTINGS)}")


def resolve(setting: str = "auto") -> Verdict:
    """The mode this process loads models with. An explicit setting wins; under "auto"
    $SPECDASH_REPACK does, then the cached probe, then a probe now (seconds, once per
    machine). The same answer for the whole process."""
    with _lock:
        if setting in _resolved:
            return _resolved[setting]
        origin = "setting"
        if setting == "auto" and os.environ.get(ENV, "").strip():
            setting, origin = check_setting(os.environ[ENV], f"{ENV}="), "env"
        if setting != "auto":
            v = Verdict("on" if setting == "on" else setting, setting, origin)
        else:
            path = cache_file()
            cached = _read_cache(path)
            if cached is not None:
                v = cached
            else:
                v = probe(child_argv=hooks.child_argv, timeout=hooks.timeout, progress=hooks.progress)
                try:
                    _write_cache(path, v)
                except OSError:
                    pass  # an unwritable cache costs a probe per process, not a failure
                if hooks.announce:
                    hooks.announce(v.describe())
        _resolved["auto" if origin == "env" else setting] = v
        return v


def forget() -> None:
    """Drop this process's verdicts (tests)."""
    with _lock:
        _resolved.clear()


def tool_args(verdict: Verdict | None = None) -> list[str]:
    """Arguments for a llama.cpp tool specdash starts, so it loads weights as this
    process does. Tools cannot name CPU_REPACK in --override-tensor (only devices'
    default buffer types), so "no-amx" gives them --no-repack too."""
    v = verdict or resolve()
    return [] if v.mode == "on" else ["--no-repack"]
