#!/usr/bin/env bash
# TEST DOUBLE. Builds, offline, two apt repositories that stand in for the real ones in tests:
#
#   <out>/nvidia/          stands in for NVIDIA's CUDA repository: a flat repo (`Suites: /`), signed by a
#                          throw-away GPG key generated here, its public key published as 3bf863cc.pub like
#                          NVIDIA's. Offers the 580 branch, a newer 590 branch that wins without a pin, the
#                          proprietary flavour (cuda-drivers, nvidia-kernel-dkms) and cuda-toolkit-13-0.
#   <out>/distro-archive/  stands in for the distribution archive: `bookworm` with `main` (kernel headers
#                          for the given kernel release and the headers meta) and an empty `contrib`.
#   <out>/fingerprint.txt  the fingerprint of the throw-away key (the role must be told to expect it).
#
# Every package is an empty dummy built with dpkg-deb: nothing here is NVIDIA software.
# Usage: build.sh OUT_DIR KERNEL_RELEASE
set -euo pipefail
OUT=${1:?usage: build.sh OUT_DIR KERNEL_RELEASE}
KREL=${2:?usage: build.sh OUT_DIR KERNEL_RELEASE}
V580=580.95.05
V590=590.48.01

rm -rf "$OUT"
mkdir -p "$OUT/nvidia" "$OUT/distro-archive" "$OUT/build"
BUILD=$OUT/build

# make_deb REPO_DIR NAME VERSION [CONTROL_FIELDS] [FILE=CONTENT ...]
make_deb() {
  local repo=$1 name=$2 version=$3 fields=${4:-} dir
  shift 4 || shift $#
  dir=$BUILD/${name}_${version}
  mkdir -p "$dir/DEBIAN"
  {
    printf 'Package: %s\nVersion: %s\nArchitecture: all\nMaintainer: Test Double <double@invalid>\n' "$name" "$version"
    printf 'Section: misc\nPriority: optional\n'
    [ -n "$fields" ] && printf '%b\n' "$fields"
    printf 'Description: test double of %s (empty)\n' "$name"
  } > "$dir/DEBIAN/control"
  local spec path
  for spec in "$@"; do
    path=${spec%%=*}
    mkdir -p "$dir/$(dirname "$path")"
    printf '%b' "${spec#*=}" > "$dir/$path"
    case $path in */bin/*) chmod 0755 "$dir/$path" ;; esac
  done
  dpkg-deb --root-owner-group -Zgzip --build "$dir" "$repo/${name}_${version}_all.deb" >/dev/null
}

persistenced_unit='[Unit]\nDescription=NVIDIA Persistence Daemon (test double)\nWants=syslog.target\nStopWhenUnneeded=true\n\n[Service]\nType=forking\nExecStart=/usr/bin/nvidia-persistenced --user nvidia-persistenced --no-persistence-mode --verbose\nExecStopPost=/bin/rm -rf /var/run/nvidia-persistenced\n'

N=$OUT/nvidia
for branch_version in "580:$V580" "590:$V590"; do
  b=${branch_version%%:*}; v=${branch_version#*:}
  make_deb "$N" "nvidia-driver-pinning-$b" "$b-1" \
    "Provides: nvidia-driver-pinning\nConflicts: nvidia-driver-pinning\nReplaces: nvidia-driver-pinning" \
    "etc/apt/preferences.d/nvidia-driver-pin=Package: nvidia-* libnvidia-*\nPin: version $b.*\nPin-Priority: 1000\n"
  make_deb "$N" nvidia-kernel-open-dkms "$v-1" "Conflicts: nvidia-kernel-dkms" \
    "usr/src/nvidia-$v/dkms.conf=PACKAGE_NAME=nvidia\nPACKAGE_VERSION=$v\n"
  make_deb "$N" nvidia-persistenced "$v-1" "" \
    "usr/lib/systemd/system/nvidia-persistenced.service=$persistenced_unit"
  make_deb "$N" libnvidia-compute "$v-1" ""
  make_deb "$N" nvidia-driver-cuda "$v-1" "Depends: libnvidia-compute (>= $v), nvidia-persistenced (>= $v)"
  make_deb "$N" nvidia-open "$v-1" "Depends: nvidia-kernel-open-dkms (>= $v), nvidia-driver-cuda (>= $v)"
  # The proprietary flavour: must never be installed on Blackwell.
  make_deb "$N" nvidia-kernel-dkms "$v-1" "Conflicts: nvidia-kernel-open-dkms"
  make_deb "$N" cuda-drivers "$v-1" "Depends: nvidia-kernel-dkms (>= $v), nvidia-driver-cuda (>= $v)"
done
make_deb "$N" nvidia-open-580 "$V580-1" "Depends: nvidia-open (= $V580-1)"
make_deb "$N" cuda-toolkit-13-0 13.0.2-1 "" \
  "usr/local/cuda-13.0/bin/nvcc=#!/bin/sh\necho 'nvcc: NVIDIA (R) Cuda compiler driver (test double)'\necho 'Cuda compilation tools, release 13.0, V13.0.88'\n"
make_deb "$N" cuda-toolkit-12-8 12.8.1-1 "" \
  "usr/local/cuda-12.8/bin/nvcc=#!/bin/sh\necho 'Cuda compilation tools, release 12.8, V12.8.93'\n"
# The full `cuda-13-0` meta drags the proprietary driver, as the real one can.
make_deb "$N" cuda-13-0 13.0.2-1 "Depends: cuda-toolkit-13-0 (= 13.0.2-1), cuda-drivers (>= $V580)"

# Flat repository index, Release, and signatures with a throw-away key.
(cd "$N" && dpkg-scanpackages --multiversion . /dev/null 2>/dev/null > Packages && gzip -9kn Packages)
release_file() {  # release_file DIR FILES... (paths relative to DIR)
  local dir=$1 f; shift
  printf 'Origin: NVIDIA test double\nLabel: NVIDIA CUDA test double\nArchitectures: amd64 all\n'
  printf 'Date: %s\n' "$(LC_ALL=C date -u '+%a, %d %b %Y %H:%M:%S UTC')"
  [ -n "${SUITE:-}" ] && printf 'Suite: %s\nCodename: %s\nComponents: main contrib\n' "$SUITE" "$SUITE"
  printf 'SHA256:\n'
  for f in "$@"; do
    printf ' %s %s %s\n' "$(sha256sum "$dir/$f" | cut -d' ' -f1)" "$(stat -c %s "$dir/$f")" "$f"
  done
}
release_file "$N" Packages Packages.gz > "$N/Release"

# gpg-agent puts its sockets in GNUPGHOME when there is no /run/user/<uid>, and a Unix socket path holds at most 107
# bytes: under a deep build directory (Molecule's, below a HOME longer than /root) the agent could not start. A short
# directory of its own, removed on exit.
GNUPGHOME=$(mktemp -d /tmp/bws-gnupg.XXXXXX)
export GNUPGHOME
trap 'gpgconf --kill all 2>/dev/null || true; rm -rf "$GNUPGHOME"' EXIT
gpg --batch --quiet --passphrase '' --quick-gen-key 'NVIDIA apt repository test double <double@invalid>' ed25519 sign never
FPR=$(gpg --batch --with-colons --list-keys | awk -F: '/^fpr:/ {print $10; exit}')
gpg --batch --quiet --yes --armor --export "$FPR" > "$N/3bf863cc.pub"
gpg --batch --quiet --yes --local-user "$FPR" --clearsign -o "$N/InRelease" "$N/Release"
gpg --batch --quiet --yes --local-user "$FPR" --detach-sign --armor -o "$N/Release.gpg" "$N/Release"
printf '%s\n' "$FPR" > "$OUT/fingerprint.txt"

# Distribution archive double: kernel headers in main, an empty contrib.
D=$OUT/distro-archive
mkdir -p "$D/pool" "$D/dists/bookworm/main/binary-amd64" "$D/dists/bookworm/contrib/binary-amd64"
make_deb "$D/pool" "linux-headers-$KREL" 1.0-1 "" "usr/src/linux-headers-$KREL/Makefile=# test double\n"
make_deb "$D/pool" linux-headers-amd64 1.0-1 "Depends: linux-headers-$KREL"
(cd "$D" && dpkg-scanpackages --multiversion pool /dev/null 2>/dev/null > dists/bookworm/main/binary-amd64/Packages)
: > "$D/dists/bookworm/contrib/binary-amd64/Packages"
SUITE=bookworm release_file "$D/dists/bookworm" main/binary-amd64/Packages contrib/binary-amd64/Packages \
  > "$D/dists/bookworm/Release"

rm -rf "$BUILD"
echo "built $(ls "$N"/*.deb | wc -l) NVIDIA-double packages, key $FPR, in $OUT"
