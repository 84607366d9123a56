#!/usr/bin/env bash
# Installs the Debian packages the tests need, only those missing (a warm machine does nothing).
set -euo pipefail
need=()
command -v make >/dev/null || need+=(make)
command -v ip >/dev/null || need+=(iproute2)
command -v iptables >/dev/null || need+=(iptables)
command -v pgrep >/dev/null || need+=(procps)
command -v curl >/dev/null || need+=(curl)
command -v unzip >/dev/null || need+=(unzip)
command -v chromium >/dev/null || need+=(chromium)   # the status page test renders in it
command -v promtool >/dev/null || need+=(prometheus)  # tests/unit/test_alerts.py runs the alerting rules
# The images (make image) and the end-to-end test that runs them.
for tool in podman buildah runc skopeo mmdebstrap; do command -v $tool >/dev/null || need+=($tool); done
command -v newuidmap >/dev/null || need+=(uidmap)
# The images' arm64 twins (image/arm64.py): ELF headers read and stripped without running
# arm64 code; the image test runs them under user-mode emulation.
command -v readelf >/dev/null || need+=(binutils)
command -v aarch64-linux-gnu-strip >/dev/null || need+=(binutils-aarch64-linux-gnu)
command -v qemu-aarch64-static >/dev/null || need+=(qemu-user-static)
python3 -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)
((${#need[@]})) || exit 0
if [ "$(id -u)" != 0 ]; then
  echo "deps: missing Debian packages: ${need[*]} (run as root, or: sudo apt-get install ${need[*]})" >&2
  exit 1
fi
echo "deps: installing Debian packages: ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${need[@]}"
