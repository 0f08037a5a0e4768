"""The `serge` command: `main.py` reads the command line and runs a subcommand; each group of subcommands
(accounts, models, presets, tools, usage) has its module."""
