"""Issue 56: an answer the operator's steering cut short says so, and text from outside
(a client, a server) reaches the dashboard's screen as text, never as markup.

The server here is `specdash serve`'s own wiring (commands/serve.py `_headless`: the
EngineLink, the aiohttp ServerThread on 127.0.0.1 and the embedded source over a real
SmolLM2-135M session) run in this process, so the test can send the source a Stop as the
operator's schedule or dashboard does: the HTTP route itself no longer takes `stop`
(tests/test_serve.py test_steering_takes_only_what_props_lists_each_in_range).
"""

from __future__ import annotations

import functools
import json
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

openai = pytest.importorskip("openai")

from specdash.contract import events as E  # noqa: E402
from specdash.engine.settings import EngineSettings  # noqa: E402
from specdash.monitor.metrics_exporter import MetricsExporter  # noqa: E402
from specdash.serve.http import ServerThread, make_app  # noqa: E402
from specdash.serve.link import EngineLink  # noqa: E402
from specdash.serve.queue import ServeQueue  # noqa: E402
from specdash.sources.embedded import EmbeddedSource  # noqa: E402
from specdash.sources.session import Session  # noqa: E402

CTX = 1024
COUNT = [{"role": "user", "content": "Count from 1 to 500, one number per line."}]


class Served:
    """A served engine: its URL, its source (what the operator's commands go to)."""

    def __init__(self, url: str, source: EmbeddedSource, link: EngineLink):
        self.url, self.source, self.link = url, source, link

    def running(self) -> bool:
        return any(slot["is_processing"] for slot in httpx.get(self.url + "/slots", timeout=10).json())


@pytest.fixture(scope="module", params=[1, 2], ids=["one-at-a-time", "batched"])
def served(request, smol_path) -> Iterator[Served]:
    parallel = request.param
    settings = EngineSettings(target=str(smol_path), draft="lookup", k=3, threads=2, ctx=CTX, adaptive=False)
    queue = ServeQueue()
    sources: list[EmbeddedSource] = []
    link = EngineLink(queue, MetricsExporter(None), CTX, send=lambda cmd: sources[-1].send(cmd),
                      aliases=("smollm2-135m",), parallel=parallel)
    server = ServerThread(make_app(link, None), "127.0.0.1", 0)
    server.start()
    source = EmbeddedSource(functools.partial(Session, n_seq=parallel), settings, queue, on_session=link.on_session)
    sources.append(source)
    source.start(link.feed)
    try:
        deadline = time.monotonic() + 120
        while not link.ready:
            assert source.error is None and time.monotonic() < deadline, source.error
            time.sleep(0.1)
        yield Served(server.url, source, link)
    finally:
        queue.cancel_all()
        source.close()
        server.stop()
        link.close()


def stop_once_running(served: Served) -> threading.Thread:
    """Send the engine a Stop (the operator's `stop`) once a request runs."""

    def stop() -> None:
        deadline = time.monotonic() + 60
        while not served.running():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.2)  # a few steps in
        served.source.send(E.Stop())

    thread = threading.Thread(target=stop)
    thread.start()
    return thread


def test_an_answer_the_operator_stopped_is_an_abort_with_an_error_never_a_stop(served):
    body = {"messages": COUNT, "max_tokens": 800, "temperature": 0, "stream": True}
    stopper = stop_once_running(served)
    chunks: list[dict] = []
    with httpx.stream("POST", served.url + "/v1/chat/completions", json=body, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunks.append(json.loads(line[6:]))
    stopper.join()
    last = chunks[-1]
    assert last["choices"][0]["finish_reason"] == "abort", last
    assert last["error"]["code"] == "aborted" and "cut short" in last["error"]["message"], last
    assert not any(c["choices"][0]["finish_reason"] == "stop" for c in chunks)

    # The openai SDK raises the error of a stream cut short: no client takes it for whole.
    client = openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    stopper = stop_once_running(served)
    with pytest.raises(openai.APIError, match="cut short"):
        for _ in client.chat.completions.create(model="smollm2-135m", messages=COUNT, max_tokens=800,
                                                temperature=0, stream=True):
            pass
    stopper.join()

    # Whole: the text it had, finish_reason abort and the error beside it.
    stopper = stop_once_running(served)
    whole = client.chat.completions.create(model="smollm2-135m", messages=COUNT, max_tokens=800, temperature=0)
    stopper.join()
    assert whole.choices[0].finish_reason == "abort"
    assert whole.usage.completion_tokens < 800
    assert "cut short" in whole.model_extra["error"]["message"]

    # The next request is not stopped: it runs to its length.
    after = client.chat.completions.create(model="smollm2-135m", messages=COUNT, max_tokens=5, temperature=0)
    assert after.choices[0].finish_reason == "length" and "error" not in (after.model_extra or {})
