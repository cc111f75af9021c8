"""Where the embedded stack's settings file is, under the environment every settings class reads.

``CELLPILOT_STACK_ENV`` names it; the default is ``.cellpilot/stack/stack.env``. Environment
variables take precedence over the file, and both over the defaults.
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_STACK_ENV = Path(".cellpilot/stack/stack.env")


def stack_env_file(env_file: Path | None = None) -> Path | None:
    """``env_file``, else the stack's file; None when it does not exist."""
    path = env_file or Path(os.environ.get("CELLPILOT_STACK_ENV", str(DEFAULT_STACK_ENV)))
    return path if path.exists() else None
