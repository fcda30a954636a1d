"""Every ``tn.`` / ``tnrec.`` name the README and the docs use resolves in a fresh process."""

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PACKAGE = ROOT / "src" / "tnrec"


def _names() -> list[str]:
    names = set()
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        names |= set(re.findall(r"\btn\.[a-z_]+(?:\.[A-Za-z_]+)*", text))
        for dotted in re.findall(r"\btnrec\.([a-z][a-z_]*)\b", text):  # public modules
            # `tnrec.<module>` where such a module exists (not format names like tnrec.export.delta)
            if (PACKAGE / f"{dotted}.py").is_file() or (PACKAGE / dotted).is_dir():
                names.add(f"tn.{dotted}")
    return sorted(names)


def test_the_docs_name_some_public_names():
    assert {"tn.serving.Predictor", "tn.checkpoint", "tn.export"} <= set(_names())


def test_every_documented_name_resolves_from_a_fresh_import():
    code = (
        "import operator, sys, tnrec as tn\n"
        "bad = []\n"
        "for name in sys.argv[1:]:\n"
        "    try:\n"
        "        operator.attrgetter(name[3:])(tn)\n"
        "    except AttributeError as e:\n"
        "        bad.append(f'{name}: {e}')\n"
        "print('\\n'.join(bad))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, *_names()], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "", out.stdout
