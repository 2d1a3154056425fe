"""``python -m task_executor serve ...`` runs the same entry point as ``task-executor``."""

import sys

from .cli import main

sys.exit(main())
