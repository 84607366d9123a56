"""One release, said once (VERSION, image/version.py): the installed package, --version of both
programs, and every image reference in the manifests and the install guide say it; the
revision --version names is the commit."""

from __future__ import annotations

import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from core import cli
from image import version

ROOT = Path(__file__).resolve().parents[2]


def test_every_image_reference_names_the_release() -> None:
    assert version.drifted() == [], "run `python -m image.version set $(cat VERSION)`"


def test_the_installed_package_is_the_release() -> None:
    """pyproject.toml reads VERSION (hatch): the installed metadata says the same (make
    install re-installs when VERSION changes)."""
    assert metadata.version("dwd-lease") == version.current()


@pytest.mark.parametrize("program", ["agent", "aggregator"])
def test_version_names_the_release_and_the_commit(program: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", program, "--version"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"dwd-lease-{program} {version.current()} (revision {head.stdout.strip()})"


def test_a_drifted_reference_is_named_and_set_rewrites_every_one(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "manifests", tmp_path / "manifests")
    (tmp_path / "docs").mkdir()
    shutil.copy(ROOT / "docs" / "install.md", tmp_path / "docs" / "install.md")
    seed = tmp_path / "manifests" / "seed" / "deployment.yaml"
    release = version.current()
    seed.write_text(seed.read_text().replace(f"dwd-lease-aggregator:{release}", "dwd-lease-aggregator:0.0.9"))
    assert [d.split(": ")[1] for d in version.drifted(tmp_path, release)] == ["0.0.9"]
    assert version.drifted(tmp_path, release)[0].startswith("manifests/seed/deployment.yaml:")
    changed = version.set_release("1.0.0rc1", tmp_path)
    assert (tmp_path / "VERSION").read_text() == "1.0.0rc1\n" and seed in changed
    assert version.drifted(tmp_path, "1.0.0rc1") == []
    with pytest.raises(ValueError, match="not a release"):
        version.set_release("latest", tmp_path)


def test_revision_follows_a_worktree_and_a_stamp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An image has core/REVISION (the build writes it); a checkout, its HEAD; a worktree (as
    the upgrade tests build a release in), the commit it is at."""
    head = subprocess.run(
        ["git", "rev-parse", "HEAD~1"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    tree = tmp_path / "tree"
    subprocess.run(["git", "worktree", "add", "-q", "--detach", str(tree), "HEAD~1"], cwd=ROOT, check=True)
    try:
        monkeypatch.setattr(cli, "__file__", str(tree / "core" / "cli.py"))
        assert cli.revision() == head.stdout.strip()
        (tree / "core" / "REVISION").write_text("0123abc\n")
        assert cli.revision() == "0123abc"
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=True)
