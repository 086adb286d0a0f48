"""`python -m lifecycle_fsm` runs the CLI."""

from lifecycle_fsm.cli import main

main(prog_name="lifecycle")
