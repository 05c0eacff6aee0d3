"""The README's cluster path ("## 3. Install it on your cluster that has KubeRay"), as commands to run.

Issue 72: the path drifted from the chart once (a Secret in a namespace nobody made, a values file
that no longer existed), so tests run it as written instead of a copy of it: ``cluster_path_commands``
reads the commands out of the README, joining continued lines, and ``fill`` puts this machine's
values where the README has placeholders for the reader's (``PLACEHOLDERS``). Nothing else of a
command is changed; what the test bed needs besides (its images, MinIO standing in for the reader's
bucket) is added by the tests, each addition named there.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
SECTION = "## 3. "

# The README's placeholders for what only its reader knows.
REGISTRY = "REGISTRY"
ACCESS_KEY = "AWS_ACCESS_KEY_ID=..."
SECRET_KEY = "AWS_SECRET_ACCESS_KEY=..."  # noqa: S105 - the README's placeholder, not a key
S3_ENDPOINT = "https://s3.example.com"
BUCKET = "YOUR-BUCKET"
PLACEHOLDERS = (REGISTRY, ACCESS_KEY, SECRET_KEY, S3_ENDPOINT, BUCKET)


def cluster_path_commands(readme: str | None = None) -> list[str]:
    """The shell commands of the first ``bash`` block in the README's section 3, one per command."""
    text = README.read_text() if readme is None else readme
    start = text.index(SECTION)
    block = re.search(r"```bash\n(.*?)```", text[start:], re.DOTALL)
    if block is None:
        raise ValueError(f"no bash block in the README's section {SECTION!r}")
    joined = block.group(1).replace("\\\n", " ")
    return [line.strip() for line in joined.splitlines() if line.strip()]


def fill(command: str, values: Mapping[str, str]) -> str:
    """``command`` with each placeholder it holds replaced by ``values[placeholder]``; every placeholder
    in it must have a value."""
    for placeholder in PLACEHOLDERS:
        if placeholder in command:
            command = command.replace(placeholder, values[placeholder])
    return command
