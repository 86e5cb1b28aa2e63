"""Watching running inference servers (llama-server, vLLM, another specdash) through
their HTTP endpoints. No Textual here: the dashboard consumes this through
specdash.sources.remote.RemoteSource and its events.

    metrics   Prometheus text -> samples, backend detection by metric prefix
    backends  per backend, a typed snapshot of the counters and gauges that matter
    window    counter deltas over a sliding window; resets never become negative rates
    client    httpx with timeouts, optional headers, one-line redacted errors
    poller    one timer thread per server; polls never overlap
"""
