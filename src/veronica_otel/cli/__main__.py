"""``python -m veronica_otel.cli``: the ``veronica-otel`` command without the script."""

import sys

from . import main

sys.exit(main())
