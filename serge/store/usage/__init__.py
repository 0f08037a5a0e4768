"""Usage in the database: the ledger of tokens and the caps (ledger.py), and the budgets held by requests still
running (reservations.py)."""
