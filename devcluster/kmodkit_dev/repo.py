"""The repository checkout the dev harness runs from (it is installed editable by `make setup`).

The demo applies the samples in docs/ and the xe ConfigMap tool reads
dockerfiles/; both are files of the repository, not of any package.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
