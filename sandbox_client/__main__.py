"""``python -m sandbox_client ...`` runs the ``dockyard`` command."""

import sys

from .cli import main

sys.exit(main())
