"""`python -m worker.cli ...`: the `conveyor` command."""

from worker.cli.main import main

main()
