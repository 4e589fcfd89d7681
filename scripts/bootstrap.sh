# Sourced by scripts/fuzz and scripts/test: a local virtual environment with the
# project installed, made on first use and refreshed when pyproject.toml changes.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="$VENV/bin/python"
if [ ! -x "$PY" ]; then
    echo "bootstrap: creating $VENV" >&2
    python3 -m venv "$VENV"
fi
# A torch already present (a CUDA or NPU build the user brought) is kept; otherwise
# the CPU wheel, which is all CI and the fuzz campaign need.
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
    echo "bootstrap: installing torch==2.13.0 (CPU)" >&2
    "$PY" -m pip install --quiet "torch==2.13.0"
fi
STAMP="$VENV/.swa-lockstep-installed"
WANT="$(sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
    echo "bootstrap: installing swa-lockstep and its test tools" >&2
    "$PY" -m pip install --quiet -e "$ROOT[test]"
    echo "$WANT" > "$STAMP"
fi
cd "$ROOT"
