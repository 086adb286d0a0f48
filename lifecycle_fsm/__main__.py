"""`python -m lifecycle_fsm` runs the CLI (as the `lifecycle` script does)."""

from lifecycle_fsm.cli.entry import run

run(prog_name="lifecycle")
