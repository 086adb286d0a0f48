"""`python -m lifecycle_fsm.cli` runs the CLI too (as `python -m lifecycle_fsm` does)."""

from lifecycle_fsm.cli.entry import run

run(prog_name="lifecycle")
