"""`specdash web`: attach or the fleet in a browser, through textual-serve.

    guard.py   who may open the page and its websocket: the Origin and Host rules, the key
    server.py  textual-serve's server with the guard in front, bound where the CLI says

It never owns an engine: every tab runs `specdash attach` in a process of its own, which
watches (and may steer) a server; closing the tab ends that process and nothing else.
That process's entry point is `specdash/web_tab.py`, beside the CLI it runs.
"""

# The parent passes attach's arguments to each tab in this variable (a JSON list): headers
# may carry a server's key, and an environment is not on the process list.
ARGV_ENV = "SPECDASH_WEB_ARGV"
