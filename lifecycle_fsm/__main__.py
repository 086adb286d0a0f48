"""`python -m lifecycle_fsm` runs the CLI (as the `lifecycle` script does)."""

from lifecycle_fsm.cli import run

run()
