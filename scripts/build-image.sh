#!/usr/bin/env bash
# Builds the systemd test-host image offline: mmdebstrap streams a Debian 12 root file system
# straight into `podman import`. No registry is involved. Skips when the image already exists
# with the same package list.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

SUITE=${BWS_IMAGE_SUITE:-bookworm}
PACKAGES=systemd,systemd-sysv,dbus,python3,python3-apt,python3-debian,sudo,iproute2,procps,psmisc,ca-certificates,gnupg,rsync,libnuma1
LABEL="bws.packages=$(printf '%s' "$PACKAGES" | sha256sum | cut -c1-16)"

# The Debian mirror this machine already uses, unless BWS_DEBIAN_MIRROR names another.
debian_mirror() {
  if [ -n "${BWS_DEBIAN_MIRROR:-}" ]; then echo "$BWS_DEBIAN_MIRROR"; return; fi
  local uri
  uri=$(grep -rhoE '^(URIs:[[:space:]]*|deb[[:space:]]+)[^[:space:]]+/debian/?([[:space:]]|$)' \
          /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null \
        | sed -E 's/^(URIs:[[:space:]]*|deb[[:space:]]+)//; s/[[:space:]]+$//' | head -n1)
  [ -n "$uri" ] || die "cannot find a Debian mirror in /etc/apt; set BWS_DEBIAN_MIRROR"
  echo "$uri"
}

if podman image exists "$SANDBOX_IMAGE" &&
   [ "$(podman image inspect -f '{{ index .Labels "bws.packages" }}' "$SANDBOX_IMAGE" 2>/dev/null)" = "${LABEL#*=}" ]; then
  exit 0
fi
stage "build $SANDBOX_IMAGE ($SUITE) with mmdebstrap"
mmdebstrap --quiet --variant=apt --include="$PACKAGES" \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --customize-hook='chroot "$1" systemctl mask systemd-logind.service getty.target console-getty.service' \
    "$SUITE" - "$(debian_mirror)" \
  | podman import --change 'CMD ["/sbin/init"]' --change 'STOPSIGNAL SIGRTMIN+3' \
      --change "LABEL $LABEL" - "$SANDBOX_IMAGE" >/dev/null
