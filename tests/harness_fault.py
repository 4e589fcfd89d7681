"""A test-only target that plants a bug in the harness, not in the allocator.

Importing this module (as a campaign worker does when it resolves the target)
replaces the reference model's size check with one that looks a key up in the model's
own peer check with no observation: a TypeError raised inside reference/, as a bug in the
model would raise it. The allocator it builds is the bundled one, unchanged. The harness
must report that as a harness error (exit 3, with the traceback), never as a crash of
the target saved into the corpus.
"""

from impl import make_allocator
from reference.model import Model


def _broken_check_sizes(self, sizes):
    return Model.check_peers(self, [0], None)


Model.check_sizes = _broken_check_sizes


def make(config):
    return make_allocator(config)
