"""`python -m app`: the kvcache command line."""

import sys

from app.cli import main

sys.exit(main())
