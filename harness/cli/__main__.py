"""``python -m flashcheck.harness.cli``: the ``flashcheck`` command."""

import sys

from . import main

sys.exit(main())
