"""``python -m tnrec.cli`` (what ``torchrun ... -m tnrec.cli train`` runs)."""

import sys

from tnrec.cli.entry import main

if __name__ == "__main__":
    sys.exit(main())
