"""A fair share of each model between the parties asking: who a request is (party.py), and turns between them
(turns.py)."""
