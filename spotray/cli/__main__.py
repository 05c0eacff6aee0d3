"""``python -m spotray.cli``: the ``spotray`` command."""

import sys

from spotray.cli.main import main

sys.exit(main())
