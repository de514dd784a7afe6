"""`python -m kbert.cli`: the `kbert` command."""

import sys

from kbert.cli.main import main

sys.exit(main())
