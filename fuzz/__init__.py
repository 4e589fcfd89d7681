"""Fuzzing campaigns, trace files and the regression corpus (SPEC 5).

`python -m fuzz run | replay | list`; see `fuzz.cli` for the commands and exit codes,
`fuzz.trace` for the trace format, `fuzz.campaign` for workers and crash isolation.
"""

import warnings

# torch warns once that NumPy is absent; the project does not use NumPy.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
