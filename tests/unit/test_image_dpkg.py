"""image/slim.py keeps dpkg's record of the Debian packages whose files an image holds: what a
scanner reads to see the image's libc, OpenSSL and Python."""

from __future__ import annotations

from pathlib import Path

from image import slim

STATUS = """\
Package: libc6
Status: install ok installed
Architecture: amd64
Version: 2.36-9+deb12u13
Description: GNU C Library: Shared libraries
 Contains the standard libraries.

Package: libssl3
Status: install ok installed
Architecture: amd64
Version: 3.0.17-1~deb12u3

Package: gone
Status: deinstall ok config-files
Version: 1.0
"""


def stage(root: Path) -> None:
    """A merged-/usr build stage: /lib a link to usr/lib, packages listing /lib paths."""
    (root / "usr/lib/x86_64-linux-gnu").mkdir(parents=True)
    (root / "lib").symlink_to("usr/lib")
    (root / "usr/lib/x86_64-linux-gnu/libc.so.6").write_bytes(b"libc")
    (root / "usr/lib/x86_64-linux-gnu/libssl.so.3").write_bytes(b"ssl")
    info = root / "var/lib/dpkg/info"
    info.mkdir(parents=True)
    (info / "libc6:amd64.list").write_text("/.\n/lib\n/lib/x86_64-linux-gnu/libc.so.6\n")
    (info / "libssl3:amd64.list").write_text("/usr/lib/x86_64-linux-gnu/libssl.so.3\n")
    (root / "var/lib/dpkg/status").write_text(STATUS)


def test_the_status_lists_the_packages_whose_files_the_image_holds(tmp_path: Path) -> None:
    root, rootfs = tmp_path / "stage", tmp_path / "rootfs"
    stage(root)
    (rootfs / "usr/lib/x86_64-linux-gnu").mkdir(parents=True)
    (rootfs / "usr/lib/x86_64-linux-gnu/libc.so.6").write_bytes(b"libc")  # copied through /lib
    (rootfs / "opt").mkdir()
    (rootfs / "opt/ours.py").write_text("")  # no package's
    assert slim.keep_dpkg_status(rootfs, root) == ["libc6"]
    kept = (rootfs / "var/lib/dpkg/status").read_text()
    assert kept.startswith("Package: libc6\n") and " Contains the standard libraries.\n" in kept
    assert "libssl3" not in kept and "gone" not in kept


def test_a_package_not_installed_is_never_listed(tmp_path: Path) -> None:
    stanzas = slim.dpkg_stanzas(STATUS)
    assert sorted(stanzas) == ["libc6", "libssl3"]
    assert (
        stanzas["libssl3"]
        == "Package: libssl3\nStatus: install ok installed\nArchitecture: amd64\nVersion: 3.0.17-1~deb12u3\n"
    )


def test_a_link_belongs_to_its_own_package_not_to_the_one_of_its_target(tmp_path: Path) -> None:
    """python3-minimal ships /usr/bin/python3, a link to python3.11-minimal's python3.11."""
    root = tmp_path / "stage"
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/python3.11").write_bytes(b"ELF")
    (root / "usr/bin/python3").symlink_to("python3.11")
    info = root / "var/lib/dpkg/info"
    info.mkdir(parents=True)
    (info / "python3-minimal.list").write_text("/usr/bin/python3\n")
    (info / "python3.11-minimal.list").write_text("/usr/bin/python3.11\n")
    assert slim.dpkg_owners(root) == {str(root / "usr/bin/python3.11"): "python3.11-minimal"}
