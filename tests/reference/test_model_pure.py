"""SPEC 3: the reference model is pure Python; importing it must not pull in torch."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_import_reference_does_not_import_torch():
    code = (
        "import sys\n"
        "import reference, reference.model, reference.layout, reference.names\n"
        "heavy = sorted(m for m in sys.modules if m == 'torch' or m.startswith(('torch.', 'numpy')))\n"
        "print(','.join(heavy))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "", f"importing reference imported {proc.stdout.strip()}"
