#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs the toolchain perfbuf builds with, when something is missing.
# Idempotent: when everything is present it only checks and exits (well under a second).
#
#   libbpf-dev (>= 1.4) and bpftool   from bookworm-backports
#   clang-19, llvm-19 (llvm-strip)    BPF objects
#   libelf-dev, zlib1g-dev, pkg-config  libbpf's link dependencies
#
# Arguments name more bookworm packages to install when missing, for the targets that
# need them: `make test-bigendian` and `make test-arm64` pass qemu-user, `make vmtest`
# its QEMU. The Docker image takes only the above.
set -euo pipefail

need=()
have_cmd() { command -v "$1" >/dev/null 2>&1; }
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }

for p in clang-19 llvm-19 libelf-dev zlib1g-dev pkg-config make gcc "$@"; do
	have_pkg "$p" || need+=("$p")
done
backports=()
if ! pkg-config --atleast-version=1.4 libbpf 2>/dev/null; then backports+=(libbpf-dev); fi
# bpftool lives in /usr/sbin, off a normal user's PATH.
have_cmd bpftool || [ -x /usr/sbin/bpftool ] || backports+=(bpftool)

if [ ${#need[@]} -eq 0 ] && [ ${#backports[@]} -eq 0 ]; then
	exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
	echo "deps: missing $(echo ${need[*]} ${backports[*]}); run 'make deps' as root" >&2
	exit 1
fi

export DEBIAN_FRONTEND=noninteractive
# An entry apt uses: a one-line "deb ... bookworm-backports" or a deb822
# "Suites:" line, not commented out, in a file apt reads (*.list, *.sources).
has_backports() {
	grep -qsE '^[[:space:]]*(deb[[:space:]].*[[:space:]]bookworm-backports([[:space:]]|$)|Suites:.*[[:space:]]bookworm-backports([[:space:]]|$))' \
		/etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources
}
if [ ${#backports[@]} -gt 0 ] && ! has_backports; then
	# Same mirror as the bookworm source already configured.
	mirror=$(grep -rhs '^URIs:' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n1 | awk '{print $2}' || true)
	: "${mirror:=http://deb.debian.org/debian}"
	echo "deps: adding bookworm-backports from $mirror"
	cat >/etc/apt/sources.list.d/bookworm-backports.sources <<SRC
Types: deb
URIs: $mirror
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
fi
echo "deps: installing $(echo ${need[*]} ${backports[*]})"
apt-get update -qq
if [ ${#need[@]} -gt 0 ]; then
	apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
if [ ${#backports[@]} -gt 0 ]; then
	apt-get install -y -qq --no-install-recommends -t bookworm-backports "${backports[@]}" >/dev/null
fi
pkg-config --atleast-version=1.4 libbpf || { echo "deps: libbpf >= 1.4 not found after install" >&2; exit 1; }
echo "deps: libbpf $(pkg-config --modversion libbpf), $(bpftool version | head -n1), $(clang-19 --version | head -n1)"
