"""The images, as an operator gets them: what is in them, and the outage and recovery with the
agents and the aggregator running from them.

Root, podman and runc are needed (CI has them: scripts/deps.sh); the images are
built by ``make image`` before the tests, or here, from the cache when warm.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import tarfile
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from image import arm64, build, locks, ocm
from testenv.base import containers
from testenv.base.wait import wait_for
from testenv.kube.controllers import CONTROLLERS
from testenv.kube.controlplane import ControlPlane
from testenv.worlds.agents import agents_for
from testenv.worlds.chain import LEASE_DURATION_S, Chain, chain, example_daemonset

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900), pytest.mark.builds("images")]

AGENT_MAX_BYTES = 60_000_000
AGGREGATOR_MAX_BYTES = 150_000_000
# What the agent imports, and what it must not carry (the aggregator's dependencies).
AGENT_NEEDS = ("h2", "structlog", "yaml", "core", "agent")
# httpx and what it brings are the test world's client, not the agent's (agent/wire.py);
# uvloop is the aggregator's loop, not the agent's (agent/__main__.py).
AGENT_MUST_NOT = (
    "kubernetes",
    "aiohttp",
    "aggregator",
    "pip",
    "httpx",
    "httpcore",
    "anyio",
    "certifi",
    "uvloop",
)
SCRIPT = """
import importlib.metadata as m, importlib.util as u, json, sys
mods = sys.argv[1].split(",")
print(json.dumps({"modules": {x: u.find_spec(x) is not None for x in mods},
                  "dists": sorted(d.metadata["Name"] for d in m.distributions())}))
"""

# Imports, inside an image, every module its build found importable; says which failed and
# which had no compiled file at the level the interpreter runs at.
PROBE = (
    "import importlib, json, os, platform, sys\n"
    "names = open('/opt/dwd-lease/modules.txt').read().split()\n"
    "bad, uncompiled = {}, []\n"
    "for name in names:\n"
    "    try:\n"
    "        m = importlib.import_module(name)\n"
    "    except Exception as e:\n"
    "        bad[name] = repr(e)\n"
    "        continue\n"
    "    cached = getattr(m, '__cached__', None)\n"
    "    if cached and not os.path.exists(cached):\n"
    "        uncompiled.append(name)\n"
    "print(json.dumps({'count': len(names), 'bad': bad, 'uncompiled': uncompiled,\n"
    "                  'optimize': sys.flags.optimize, 'machine': platform.machine()}))\n"
)


@pytest.fixture(scope="module")
def images() -> dict[str, str]:
    missing = build.missing_tools()
    assert not missing, f"the image tests need {missing}: scripts/deps.sh installs them"
    return containers.images()


def podman(*argv: str) -> str:
    return build.run(["podman", *argv])


def inspect(ref: str) -> dict[str, Any]:
    out: list[dict[str, Any]] = json.loads(podman("image", "inspect", ref))
    return out[0]


def test_the_agent_image_holds_the_agent_and_nothing_of_the_aggregator(images: dict[str, str]) -> None:
    ref = images["agent"]
    out = podman(
        "run", "--rm", "--read-only", "--network=none", "--entrypoint", "python3", ref,
        "-c", SCRIPT, ",".join(AGENT_NEEDS + AGENT_MUST_NOT),
    )  # fmt: skip
    found = json.loads(out)
    assert [m for m in AGENT_NEEDS if not found["modules"][m]] == []
    assert [m for m in AGENT_MUST_NOT if found["modules"][m]] == [], found["dists"]
    assert not {"kubernetes", "aiohttp"} & {d.lower() for d in found["dists"]}

    config = inspect(ref)
    assert config["Config"]["User"] == "65532:65532"  # never root
    assert config["Config"]["Entrypoint"] == ["dwd-lease-agent"]
    assert config["Size"] < AGENT_MAX_BYTES, f"agent image is {config['Size'] / 1e6:.1f} MB"
    labels = config["Config"]["Labels"]
    assert labels["org.opencontainers.image.version"] == build.project_version()
    assert labels["org.opencontainers.image.title"] == "dwd-lease-agent"


@pytest.mark.parametrize("target", build.TARGETS)
def test_every_module_its_code_can_import_is_in_the_image(images: dict[str, str], target: str) -> None:
    """Each image holds only the standard-library modules its code can reach and the packages
    of its virtualenv that code reaches (image/slim.py): every module the build found
    importable, lazy ones included, must import inside the image too, and the image has
    nothing to run but its interpreter."""
    ref = images[target]
    found = json.loads(
        podman("run", "--rm", "--read-only", "--network=none", "--entrypoint", "python3", ref, "-c", PROBE)
    )
    assert found["bad"] == {}
    assert found["count"] > 300  # the agent, its dependencies, and what they import
    # Compiled at the level the image runs at (the agent without docstrings): a module
    # compiled at every start would cost each node CPU and memory.
    assert found["optimize"] == (2 if target == "agent" else 0)
    assert found["uncompiled"] == []
    shell = subprocess.run(
        ["podman", "run", "--rm", "--network=none", "--entrypoint", "/bin/sh", ref, "-c", "true"],
        env=build.tool_env(), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert shell.returncode != 0, f"the {target} image has a shell"


@pytest.mark.parametrize("target", build.TARGETS)
def test_the_arm64_twin_is_aarch64_through_and_imports_everything_under_emulation(
    images: dict[str, str], target: str, tmp_path: Path
) -> None:
    """The index holds both architectures; the arm64 image (assembled without running arm64
    code, image/arm64.py) has nothing but aarch64 machine code, its compiled packages are the
    aarch64 wheels', and its interpreter imports every module of the build (under qemu's
    user-mode emulation, chrooted into the image: root, as CI is)."""
    both = f"oci-archive:{build.index_archive(target)}"
    index = json.loads(build.run(["skopeo", "inspect", "--raw", both]))
    assert index["mediaType"] == "application/vnd.oci.image.index.v1+json"
    assert sorted(m["platform"]["architecture"] for m in index["manifests"]) == ["amd64", "arm64"]
    rootfs = tmp_path / "rootfs"
    env = arm64_image(target, rootfs)
    elves = {
        str(p.relative_to(rootfs)): arm64.elf_machine(p)
        for p in rootfs.rglob("*")
        if p.is_file() and not p.is_symlink() and arm64.elf_machine(p) is not None
    }
    assert len(elves) > 20 and set(elves.values()) == {arm64.EM_AARCH64}, elves
    wheels = [f for f in elves if f.startswith("opt/dwd-lease/") and f.endswith(".so")]
    # The agent's packages are all Python (no uvloop, PyYAML without libyaml's parser).
    assert bool(wheels) == (target == "aggregator"), wheels
    assert all(f"-{arm64.TRIPLET}.so" in f for f in wheels), wheels
    paths = [str(p.relative_to(rootfs)) for p in rootfs.rglob("*")]
    assert [p for p in paths if arm64.HOST_TRIPLET in p] == []
    size = sum(p.stat().st_size for p in rootfs.rglob("*") if p.is_file() and not p.is_symlink())
    assert size < (AGENT_MAX_BYTES if target == "agent" else AGGREGATOR_MAX_BYTES), size
    proc = subprocess.run(
        [*emulated(rootfs), "/opt/dwd-lease/bin/python3", "-c", PROBE],
        env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = json.loads(proc.stdout)
    assert found["machine"] == "aarch64" and found["bad"] == {} and found["count"] > 300
    assert found["optimize"] == build.OPTIMIZE[target] and found["uncompiled"] == []


def test_the_arm64_agent_renews_its_lease_under_emulation(
    images: dict[str, str], control_plane: ControlPlane, tmp_path: Path
) -> None:
    """The arm64 agent (its OpenSSL and interpreter, under qemu's user-mode emulation,
    chrooted into its image) renews its node's lease through the real API server over TLS and
    HTTP/2, and releases it on SIGTERM as the DaemonSet's pod would."""
    rootfs = tmp_path / "rootfs"
    image_env = arm64_image("agent", rootfs)
    (tmp_path / "agents").mkdir()
    with agents_for(control_plane, tmp_path / "agents") as agents:
        agents.create_lease("arm64-node")
        env = agents.env("arm64-node", DWD_APISERVER_URL=control_plane.url.replace("localhost", "127.0.0.1"))
        for key in ("DWD_TOKEN_FILE", "DWD_CA_FILE"):  # the pod's mounts, at the same paths
            inside = rootfs / env[key].lstrip("/")
            inside.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(env[key], inside)
        env = {**image_env, **env, "PATH": "/opt/dwd-lease/bin"}
        log = tmp_path / "arm64-agent.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [*emulated(rootfs), "/opt/dwd-lease/bin/python3", "-m", "agent"],
                env=env, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        try:
            renewed = wait_for(
                lambda: ((agents.lease("arm64-node") or {}).get("spec") or {}).get("renewTime"),
                60,
                "the arm64 agent's first renewal",
            )
            wait_for(
                lambda: ((agents.lease("arm64-node") or {}).get("spec") or {}).get("renewTime") != renewed,
                30,
                "a second renewal",
            )
            assert (agents.lease("arm64-node") or {})["spec"]["holderIdentity"] == "arm64-node"
            proc.terminate()
            assert proc.wait(30) == 0, log.read_text()[-2000:]
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert "renew" in log.read_text()


def arm64_image(target: str, rootfs: Path) -> dict[str, str]:
    """The arm64 image of ``target`` unpacked at ``rootfs``; the environment it sets."""
    both = f"oci-archive:{build.index_archive(target)}"
    build.rootfs(build.index_archive(target), rootfs, arm64.ARCH)
    config = json.loads(build.run(["skopeo", "--override-arch", arm64.ARCH, "inspect", "--config", both]))
    assert config["architecture"] == arm64.ARCH
    return dict(e.split("=", 1) for e in config["config"]["Env"])


def emulated(rootfs: Path) -> list[str]:
    """The command that runs an arm64 program of ``rootfs`` here: qemu's user-mode emulator,
    copied into it, chrooted (root, as CI is)."""
    qemu = shutil.which("qemu-aarch64-static")
    assert qemu, "qemu-aarch64-static (qemu-user-static) runs the arm64 image here: scripts/deps.sh"
    shutil.copy(qemu, rootfs / "qemu")
    return [shutil.which("chroot") or "/usr/sbin/chroot", str(rootfs), "/qemu"]


def test_the_archives_are_oci_images_skopeo_can_read(images: dict[str, str]) -> None:
    for target in build.TARGETS:
        info = json.loads(build.run(["skopeo", "inspect", f"oci-archive:{build.archive(target)}"]))
        assert info["Labels"]["org.opencontainers.image.title"] == f"dwd-lease-{target}"
        assert info["Labels"]["org.opencontainers.image.version"] == build.project_version()
        # The commit it was built from (an image cached from an earlier commit with the same
        # inputs names that one): a scanner's finding leads back to the sources.
        assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?", info["Labels"]["org.opencontainers.image.revision"])


def test_the_release_and_its_component_descriptor_are_what_was_built(images: dict[str, str]) -> None:
    """--version in each image names the release and the commit its revision label names; the
    OCM descriptor names each image by the release and the digest of the index in its archive,
    that index's bytes hash to it, and its source is that commit."""
    descriptor = yaml.safe_load((build.BUILD_DIR / ocm.DESCRIPTOR).read_text())
    revision = ""
    for resource in descriptor["component"]["resources"]:
        target = resource["name"].removeprefix("dwd-lease-")
        with tarfile.open(build.index_archive(target)) as tar:
            listed = tar.extractfile("index.json")
            assert listed is not None
            (index,) = json.load(listed)["manifests"]
            algorithm, value = index["digest"].split(":")
            blob = tar.extractfile(f"blobs/{algorithm}/{value}")
            assert blob is not None and hashlib.sha256(blob.read()).hexdigest() == value
        release = build.project_version()
        assert resource["access"]["imageReference"] == f"dwd-lease-{target}:{release}@sha256:{value}"
        assert resource["digest"]["value"] == value and resource["version"] == release
        labels = inspect(images[target])["Config"]["Labels"]
        revision = labels["org.opencontainers.image.revision"]
        said = podman("run", "--rm", "--read-only", "--network=none", images[target], "--version").strip()
        assert said == f"dwd-lease-{target} {release} (revision {revision})", said
    assert descriptor["component"]["sources"][0]["access"]["commit"] == revision


def test_each_image_carries_an_sbom_and_dpkg_status_of_what_it_holds(images: dict[str, str]) -> None:
    """A scanner sees each image's Debian packages (dpkg's status, kept for the packages whose
    files the image holds) and the SPDX document beside it names those and exactly the
    distributions its lock pins, for both architectures."""
    for target in build.TARGETS:
        pinned = {name: version for name, (version, _) in locks.pins(locks.lock(target)).items()}
        for arch in ("amd64", arm64.ARCH):
            doc = json.loads(build.sbom_path(target, arch).read_text())
            purls = [ref["referenceLocator"] for p in doc["packages"] for ref in p.get("externalRefs", [])]
            debs = {u.split("/")[2].split("@")[0]: u for u in purls if u.startswith("pkg:deb/")}
            pypi = dict(u.removeprefix("pkg:pypi/").split("@") for u in purls if u.startswith("pkg:pypi/"))
            assert {"libc6", "libssl3", "python3.11-minimal", "libpython3.11-stdlib"} <= debs.keys()
            # Each of its architecture, or of every one (python3-distutils: Architecture all).
            assert [u for u in debs.values() if f"arch={arch}&" not in u and "arch=all&" not in u] == []
            assert pypi == {**pinned, "dwd-lease": build.project_version()}
            counts = f"{len(doc['packages'])} packages, {len(debs)} Debian, {len(pypi)} Python"
            print(f"\n{target} {arch}: SBOM of {counts}")
    status = podman(
        "run", "--rm", "--read-only", "--network=none", "--entrypoint", "python3", images["agent"],
        "-c", "print(open('/var/lib/dpkg/status').read())",
    )  # fmt: skip
    assert "Package: libssl3\nStatus: install ok installed\n" in status


def test_the_agent_image_built_again_is_the_same_image(
    images: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reproducible: built again from the same inputs, at the time and revision it says it was
    built at (the cache may hold one of an earlier commit with the same inputs), the agent
    image has the same digest, byte for byte."""
    cached = build.archive("agent")
    config = json.loads(build.run(["skopeo", "inspect", "--config", f"oci-archive:{cached}"]))
    created = datetime.fromisoformat(config["created"].replace("Z", "+00:00"))
    monkeypatch.setenv("SOURCE_DATE_EPOCH", str(int(created.timestamp())))
    revision = config["config"]["Labels"]["org.opencontainers.image.revision"]
    monkeypatch.setenv("DWDDEV_IMAGE_REVISION", revision)
    started = time.monotonic()
    build._build_one("agent", {"build": build.debian_base("build")}, tmp_path)
    again = build.archive("agent", tmp_path)
    took = time.monotonic() - started
    first, second = manifest_digest(cached), manifest_digest(again)
    print(f"\nagent image {first[:16]}, built again in {took:.0f}s: {second[:16]}")
    assert second == first


def manifest_digest(archive: Path) -> str:
    raw = build.run(["skopeo", "inspect", "--raw", f"oci-archive:{archive}"])
    return hashlib.sha256(raw.encode()).hexdigest()


def test_the_aggregator_image_runs_the_aggregator(images: dict[str, str]) -> None:
    """Bad settings are named, from the image too: the aggregator starts, reads them, and says."""
    proc = subprocess.run(
        ["podman", "run", "--rm", "--read-only", "--network=none", "--env", "DWD_LEASE_DURATION=soon",
         images["aggregator"]],
        env=build.tool_env(), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "DWD_LEASE_DURATION" in proc.stdout + proc.stderr
    config = inspect(images["aggregator"])
    assert config["Config"]["User"] == "65532:65532"
    assert config["Size"] < AGGREGATOR_MAX_BYTES, f"aggregator image is {config['Size'] / 1e6:.1f} MB"


def test_the_daemonset_runs_the_agent_image_read_only_and_without_a_capability() -> None:
    """uid 0 only to read kubelet's 0600 kubeconfig (docs/install.md): not one capability, no
    escalation, a read-only root, and of the host nothing but that one file."""
    ds = example_daemonset()
    spec = ds["spec"]["template"]["spec"]
    agent = spec["containers"][0]
    assert agent["image"].rsplit("/", 1)[-1].split(":")[0] == "dwd-lease-agent"
    assert spec["securityContext"]["runAsUser"] == 0
    assert agent["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert agent["securityContext"]["readOnlyRootFilesystem"] is True
    assert agent["securityContext"]["allowPrivilegeEscalation"] is False
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    host = [v["hostPath"] for v in spec["volumes"] if "hostPath" in v]
    assert host == [{"path": "/var/lib/kubelet/kubeconfig-real", "type": "File"}]


@pytest.fixture
def from_images(seed_plane: ControlPlane, tmp_path: Path, images: dict[str, str]) -> Iterator[Chain]:
    with chain(seed_plane, tmp_path, "images", nodes=5, images=images) as c:
        yield c
    # Nothing of it left running: a killed `podman run` does not stop its container.
    left = podman("ps", "--all", "--format", "{{.Names}}").split()
    assert [n for n in left if n.startswith(("dwd-agent-", "dwd-aggregator-images-"))] == []


def test_outage_and_recovery_with_everything_running_from_the_images(from_images: Chain) -> None:
    """Five nodes, each agent from its image in its node's namespace; the aggregator from its
    image. Four paths dropped: the controllers go down; healed: they come back, all of them."""
    c = from_images
    c.wait_judging(timeout_s=120)
    cut = c.nodes[:4]
    for node in cut:
        node.iptables("-I", "-j", "DROP")
    t_cut = time.time()
    wait_for(lambda: all(r == 0 for r in c.shoot.replicas().values()), 60, "the controllers scaled down")
    took = time.time() - t_cut
    # A lease duration after the last renewal, plus confirmation and a tick: generous.
    assert LEASE_DURATION_S < took < 30
    for node in cut:
        node.iptables("-D", "-j", "DROP")
    wait_for(lambda: c.shoot.replicas() == CONTROLLERS, 90, "the controllers restored")
    renewed = [e for n in c.nodes for e in n.events() if e["event"] == "lease_renewing"]
    assert renewed, "the agents in the containers logged no renewal"
    names = c.aggregator.names()
    assert "target_scale_down" in names and "target_scale_up" in names
