"""``python -m tnrec ...`` runs the ``tnrec`` command line (see :mod:`tnrec.cli`)."""

import sys

from tnrec.cli import main

if __name__ == "__main__":
    sys.exit(main())
