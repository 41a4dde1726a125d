"""``python -m services.cli`` is the same as ``gavel``."""

import sys

from services.cli import main

sys.exit(main())
