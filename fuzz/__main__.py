"""`python -m fuzz`: see fuzz.cli for the commands and exit codes."""

import sys

from fuzz.cli import main

if __name__ == "__main__":
    sys.exit(main())
