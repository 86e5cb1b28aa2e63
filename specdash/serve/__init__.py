"""`specdash serve`: the embedded engine as an OpenAI-compatible HTTP server.

    protocol.py  OpenAI's request and response shapes (and llama-server's `timings`)
    stops.py     stop strings over streamed text, held back until they resolve
    request.py   one served request: its settings, its text, its way to the client
    queue.py     the requests, first in first out, kept across engine restarts
    link.py      what the HTTP side knows of the engine (tokenizer, readiness, metrics)
    http.py      the routes, on aiohttp, in a thread of their own
    log.py       `--headless`: the events as log lines

The engine thread is the embedded source's (sources/embedded.py): it runs a request as
it runs a typed prompt, so the dashboard shows and steers what is served.
"""
