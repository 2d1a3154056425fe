"""``python -m task_executor serve ...`` runs the same entry point as ``task-executor``."""

import sys

from task_executor.cli import main

sys.exit(main())
