"""image/locks/: every distribution an image installs is pinned with its hashes, the pins
satisfy pyproject.toml, and the arm64 twin takes no wheel the lock does not name."""

from __future__ import annotations

import hashlib
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from image import arm64, locks

ROOT = Path(__file__).resolve().parents[2]
# Where the images run: Debian's Python 3.11 on Linux.
IMAGE_ENV = {"python_version": "3.11", "sys_platform": "linux", "platform_system": "Linux"}


def wanted(target: str) -> list[Requirement]:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    specs = {
        "agent": meta["project"]["dependencies"],
        "aggregator": [
            *meta["project"]["dependencies"],
            *meta["project"]["optional-dependencies"]["aggregator"],
        ],
        "build": meta["build-system"]["requires"],
    }[target]
    return [r for r in map(Requirement, specs) if r.marker is None or r.marker.evaluate(IMAGE_ENV)]


@pytest.mark.parametrize("target", ["agent", "aggregator", "build"])
def test_each_lock_pins_what_pyproject_asks_with_hashes(target: str) -> None:
    pins = locks.pins(locks.lock(target))
    for requirement in wanted(target):
        version, _ = pins.get(locks.normalize(requirement.name), ("", frozenset()))
        assert version, f"{requirement.name} is not in image/locks/{target}.txt: run make image-lock"
        assert requirement.specifier.contains(version), f"{requirement} but {target}.txt pins {version}"
    assert [name for name, (_, hashes) in pins.items() if not hashes] == []


def test_the_agent_lock_holds_nothing_of_the_aggregator() -> None:
    agent = locks.pins(locks.lock("agent"))
    assert not {"aiohttp", "kubernetes", "uvloop"} & agent.keys()
    assert agent.keys() < locks.pins(locks.lock("aggregator")).keys()


def test_an_arm64_wheel_the_lock_does_not_name_is_refused(tmp_path: Path) -> None:
    wheels = tmp_path / "arm64-wheels"
    wheels.mkdir()
    path = wheels / "frozenlist-1.8.0-cp311-cp311-manylinux_2_17_aarch64.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("frozenlist/__init__.py", "")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    compiled = {("frozenlist", "1.8.0"): ["frozenlist/_frozenlist.cpython-311-x86_64-linux-gnu.so"]}
    site = tmp_path / "site"
    with pytest.raises(arm64.Arm64Error, match=f"sha256 {digest} is not in the lock for frozenlist==1.8.0"):
        arm64._wheels(compiled, site, tmp_path, {"frozenlist": ("1.8.0", frozenset({"0" * 64}))})
    with pytest.raises(arm64.Arm64Error, match="is not in the lock"):  # the right file, another pin
        arm64._wheels(compiled, site, tmp_path, {"frozenlist": ("1.7.0", frozenset({digest}))})
    # The lock's own file passes the check (and then lacks the module the amd64 image had).
    with pytest.raises(arm64.Arm64Error, match="its aarch64 wheel has no"):
        arm64._wheels(compiled, site, tmp_path, {"frozenlist": ("1.8.0", frozenset({digest}))})
