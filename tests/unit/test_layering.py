"""The lower layers never import torch (a table can be used and saved without it)."""

import subprocess
import sys


def test_table_feature_column_and_data_do_not_import_torch():
    code = (
        "import sys, tnrec.table, tnrec.feature_column, tnrec.data, tnrec.data.synthetic, "
        "tnrec.metrics; print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr
