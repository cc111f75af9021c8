"""The ``cellpilot`` command line (typer + rich)."""
