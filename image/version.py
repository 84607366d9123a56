"""The release, said once: VERSION at the root. pyproject.toml reads it (hatch), the image build
tags and labels the images by it, and every manifest and page that names an image names it by
it. ``python -m image.version`` prints it; ``python -m image.version set X`` writes it and every
image reference at once; tests/unit/test_version.py fails on one that drifted."""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VERSION_FILE = ROOT / "VERSION"
# A release as PEP 440 writes it (0.3.0, 0.3.0.dev0, 0.3.0rc1): a valid image tag too.
RELEASE = re.compile(r"[0-9]+(\.[0-9]+){2}((a|b|rc)[0-9]+)?(\.post[0-9]+)?(\.dev[0-9]+)?")
# Where an image or a chart's artifact is named: ``dwd-lease-agent:TAG`` and a
# kustomization's ``newTag: "TAG"``.
REFERENCE = re.compile(r"\b(dwd-lease-(?:agent|aggregator|extension|admission)):([0-9][\w.+-]*)")
NEW_TAG = re.compile(r'(newTag:\s*")([^"]*)(")')


def current() -> str:
    text = VERSION_FILE.read_text().strip()
    if not RELEASE.fullmatch(text):
        raise ValueError(f"{VERSION_FILE}: {text!r} is not a release (like 0.3.0 or 0.3.0.dev0)")
    return text


def naming_files(root: Path = ROOT) -> list[Path]:
    """Every file that names an image by its tag: the manifests and the install guide."""
    return sorted([*root.glob("manifests/**/*.yaml"), root / "docs" / "install.md"])


def drifted(root: Path = ROOT, release: str | None = None) -> list[str]:
    """``file:line: tag`` for each image named by another tag than the release."""
    release = release or current()
    found = []
    for path in naming_files(root):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            tags = [m.group(2) for m in REFERENCE.finditer(line)] + [
                m.group(2) for m in NEW_TAG.finditer(line)
            ]
            found += [f"{path.relative_to(root)}:{number}: {tag}" for tag in tags if tag != release]
    return found


def set_release(release: str, root: Path = ROOT) -> list[Path]:
    """Writes ``release`` to VERSION and to every image reference; returns the files changed."""
    if not RELEASE.fullmatch(release):
        raise ValueError(f"{release!r} is not a release (like 0.3.0 or 0.3.0.dev0)")
    (root / "VERSION").write_text(release + "\n")
    changed = []
    for path in naming_files(root):
        text = path.read_text()
        new = REFERENCE.sub(lambda m: f"{m.group(1)}:{release}", text)
        new = NEW_TAG.sub(lambda m: f"{m.group(1)}{release}{m.group(3)}", new)
        if new != text:
            path.write_text(new)
            changed.append(path)
    return changed


def main(argv: list[str]) -> int:
    if not argv:
        print(current())
        return 0
    if len(argv) == 2 and argv[0] == "set":
        try:
            changed = set_release(argv[1])
        except ValueError as e:
            print(f"image.version: {e}", file=sys.stderr)
            return 2
        print(f"VERSION {argv[1]}; image references in {len(changed)} files")
        return 0
    print("usage: python -m image.version [set RELEASE]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
