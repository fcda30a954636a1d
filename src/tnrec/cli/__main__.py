"""``python -m tnrec.cli`` (what ``torchrun ... -m tnrec.cli train`` runs)."""

import sys

from tnrec.cli.entry import main

sys.exit(main())
