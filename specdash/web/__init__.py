"""`specdash web`: attach or the fleet in a browser, through textual-serve.

    guard.py   who may open the page and its websocket: the Origin and Host rules, the key
    server.py  textual-serve's server with the guard in front, bound where the CLI says
    child.py   one browser tab's process: `specdash attach` with the page on a stdout of its own

It never owns an engine: every tab runs `specdash attach` in a process of its own, which
watches (and may steer) a server; closing the tab ends that process and nothing else.
"""
