"""``ORG/NAME[@REVISION]``: a Hugging Face model repo named on ``--model`` or to ``LLM(...)``."""

from __future__ import annotations

import re
from dataclasses import dataclass

_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9_.-]+")
_REVISION = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_./-]*")
COMMIT = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class HubRef:
    repo_id: str
    revision: str | None  # a branch, tag or commit; None: the default branch

    def __str__(self) -> str:
        return self.repo_id + (f"@{self.revision}" if self.revision else "")

    @property
    def folder(self) -> str:
        """The repo's directory in huggingface_hub's cache (``models--ORG--NAME``)."""
        return "models--" + self.repo_id.replace("/", "--")


def parse_ref(spec: str) -> HubRef | None:
    """The repo ``spec`` names, or None when it is not shaped like one (a path such as ``./x`` or ``/a/b/c``)."""
    name, at, revision = spec.partition("@")
    if not _REPO_ID.fullmatch(name) or ".." in name or name.endswith("."):
        return None
    if at and not _REVISION.fullmatch(revision):
        return None
    return HubRef(name, revision or None)
