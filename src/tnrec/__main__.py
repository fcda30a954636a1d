"""``python -m tnrec ...`` runs the ``tnrec`` command line (see :mod:`tnrec.cli`)."""

import sys

from tnrec.cli import main

sys.exit(main())
