"""`python -m leasebox` runs the `leasebox` command (as in the image and the tests)."""

import sys

from leasebox.cli.main import main

sys.exit(main())
