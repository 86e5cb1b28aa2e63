"""K=0 through the engine vs llama-cpp-python's own greedy generation, in one process.

Both decode the same prompt greedily for N tokens, alternating A/B for R rounds so drift
on a shared machine hits both alike. Reports the median tok/s of each and their ratio, and
the engine's per-step split (draft / verify / bookkeeping).

    python benchmarks/plain_overhead.py [--model qwen2.5-coder-1.5b] [--tokens 128] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import llama_cpp
from llama_cpp import Llama

from specdash.engine.drafters.base import NoDrafter
from specdash.engine.engine import Engine
from specdash.engine import repack
from specdash.engine.llm import LLM
from specdash.engine.settings import EngineSettings
from specdash.contract.events import StepEvent, Summary
from specdash.models.resolve import resolve_model
from specdash.tuning.prompts import by_name


def llama_cpp_python_tps(llm: Llama, prompt: list[int], n: int) -> float:
    llm.reset()
    t0 = None
    count = 0
    # Time from the first generated token, like the engine's decode-only figure.
    for tok in llm.generate(prompt, temp=0.0, top_k=1, reset=True):
        if t0 is None:
            t0 = time.perf_counter()
        else:
            count += 1
        if count >= n - 1 or tok == llm.token_eos():
            break
    return count / (time.perf_counter() - t0)


def engine_tps(engine: Engine, prompt: list[int], n: int) -> tuple[float, Summary]:
    summary = None
    for ev in engine.generate(prompt, n):
        if isinstance(ev, Summary):
            summary = ev
    return summary.tokens_per_s, summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    path = str(resolve_model(args.model))
    # Llama() always asks for llama.cpp's default repacking, which crashes on some AMX
    # machines (engine/repack.py): where this machine's verdict is not "on", both sides
    # load without repacking, like for like.
    mode = "on" if repack.resolve().mode == "on" else "off"
    default_params = llama_cpp.llama_model_default_params

    def params_with_verdict():
        p = default_params()
        p.use_extra_bufts = mode == "on"
        return p

    llama_cpp.llama_cpp.llama_model_default_params = params_with_verdict
    llama_cpp.llama_model_default_params = params_with_verdict
    print(f"weight repacking: {mode} on both sides ({repack.resolve().label()})")
    ref = Llama(path, n_ctx=2048, n_threads=args.threads, n_threads_batch=args.threads, verbose=False)
    target = LLM(path, n_ctx=2048, n_threads=args.threads, repack_setting=mode)
    engine = Engine(target, NoDrafter(), EngineSettings(k=0, adaptive=False))
    prompt = target.tokenize(target.chat_prompt(by_name("code-generation").text))

    engine_tps(engine, prompt, 16)  # warm-up both
    llama_cpp_python_tps(ref, prompt, 16)
    a, b, splits = [], [], []
    for r in range(args.rounds):
        order = (0, 1) if r % 2 == 0 else (1, 0)
        for which in order:
            if which == 0:
                tps, s = engine_tps(engine, prompt, args.tokens)
                a.append(tps)
                splits.append(s)
            else:
                b.append(llama_cpp_python_tps(ref, prompt, args.tokens))
        print(f"round {r + 1}: engine K=0 {a[-1]:.1f} tok/s, llama-cpp-python {b[-1]:.1f} tok/s", flush=True)
    ma, mb = statistics.median(a), statistics.median(b)
    draft = sum(s.draft_ms for s in splits)
    verify = sum(s.verify_ms for s in splits)
    other = sum(s.other_ms for s in splits)
    total = draft + verify + other
    print(f"\nmedian: engine K=0 {ma:.1f} tok/s, llama-cpp-python generate {mb:.1f} tok/s, ratio {ma / mb:.3f}")
    print(f"engine step time split: draft {draft / total:.1%}, verify {verify / total:.1%}, bookkeeping {other / total:.2%}")


if __name__ == "__main__":
    main()
