"""`python -m asteria ...` (and `torchrun -m asteria train ...`): the `asteria` command."""

import sys

from asteria.cli import main

sys.exit(main())
