"""``python -m txjoin`` = the ``txjoin`` command."""

from txjoin.cli import main

main()
