"""Sources: anything that yields contract events (specdash.contract.events) and takes commands.

embedded  the engine in a thread (sources/embedded.py)
replay    a recording played back (sources/replay.py)
remote    a llama-server, vLLM or another specdash, polled (sources/remote.py)
"""
