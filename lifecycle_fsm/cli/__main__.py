"""`python -m lifecycle_fsm.cli` runs the CLI (as `python -m lifecycle_fsm` does)."""

from lifecycle_fsm.cli import run

run()
