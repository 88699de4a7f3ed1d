"""Prints one of the README's two set-up commands, as a newcomer copies it: `lab` (install and
start the lab) or `test` (install the test tools and run the tests), the first and second bash
blocks under its "Set up" heading.  .ci/run runs them, so the README cannot drift from CI."""
import re
import sys
from pathlib import Path

text = Path(__file__).resolve().parent.parent.joinpath("README.md").read_text()
section = re.search(r"^## Set up.*?(?=^## )", text, re.S | re.M)
if not section:
    sys.exit("README.md has no '## Set up' section")
blocks = re.findall(r"```bash\n(.*?)```", section.group(0), re.S)
which = {"lab": 0, "test": 1}[sys.argv[1]]
if len(blocks) <= which:
    sys.exit(f"README.md's set-up section has no command for {sys.argv[1]!r}")
command = " ".join(line.rstrip("\\").strip() for line in blocks[which].strip().splitlines())
print(command)
