"""Command line: one module per command (see main.COMMANDS)."""
