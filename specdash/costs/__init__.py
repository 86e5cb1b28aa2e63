"""Cost profiles kept per machine and model (issue 40): the key that says which costs a
run may reuse (key.py) and the folder that keeps them (store.py). The format is whatif's
(whatif/profile.py), so a profile a run saved is a whatif profile as it stands."""
