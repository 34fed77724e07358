#!/usr/bin/env bash
# Installs everything the sandbox and the tests need, idempotently:
#   - host packages (rootful podman with runc, netavark, mmdebstrap) when missing;
#   - our own containers.conf (pointed at by CONTAINERS_CONF; /etc/containers is left alone);
#   - the locked controller toolchain in a venv under the cache directory;
#   - the pinned collections of requirements.yml, taken from the `ansible` wheel on PyPI
#     because Ansible Galaxy is not reachable from every network.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
export DEBIAN_FRONTEND=noninteractive

ANSIBLE_BUNDLE_VERSION=14.5.0   # the bundle that ships the collection versions pinned in requirements.yml
APT_PACKAGES=(podman runc netavark aardvark-dns iptables mmdebstrap curl rsync systemd)
# The contract venvs run on the distribution's python3.11 where there is one (scripts/lib.sh, contract_python):
# its venv module is a package of its own.
[ ! -x /usr/bin/python3.11 ] || APT_PACKAGES+=(python3.11-venv)

install_host_packages() {
  local missing=() pkg installed
  # one dpkg-query for all of them (one per package cost a third of a second on every warm call)
  installed=$(dpkg-query -W -f='${Package} ${Status}\n' "${APT_PACKAGES[@]}" 2>/dev/null | grep ' install ok installed$' || true)
  for pkg in "${APT_PACKAGES[@]}"; do
    grep -q "^$pkg install ok installed$" <<<"$installed" || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  [ "$(id -u)" -eq 0 ] || die "missing packages ${missing[*]}: run as root or install them with apt-get"
  stage "apt-get install ${missing[*]}"
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

write_containers_conf() {
  mkdir -p "$CACHE_DIR"
  # nofile/nproc: podman's defaults exceed hard limits that even root cannot raise on some VMs;
  # runc: crun rejects cgroup v1/v2 hybrid hosts; netavark: podman 4.3 silently falls back to CNI.
  cat > "$CONTAINERS_CONF_FILE.tmp" <<'CONF'
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
[network]
network_backend = "netavark"
[engine]
runtime = "runc"
CONF
  mv "$CONTAINERS_CONF_FILE.tmp" "$CONTAINERS_CONF_FILE"
}

venv_is_current() {
  local stamp="$VENV_DIR/.requirements.sha256"
  [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$(sha256sum "$REPO_ROOT/requirements/controller.txt" | cut -d' ' -f1)" ]
}

# Before anything is installed: without a usable Python >= 3.12 nothing else is worth doing.
require_python() {
  venv_is_current && return 0
  PYTHON=$(find_python) || die "$(python_missing_message "$(python_found_summary)")"
}

install_venv() {
  venv_is_current && return 0
  stage "venv $VENV_DIR ($("$PYTHON" --version))"
  rm -rf "$VENV_DIR"
  "$PYTHON" -m venv "$VENV_DIR"
  "$VENV_DIR/bin/pip" install -q --no-deps -r "$REPO_ROOT/requirements/controller.txt" 2>&1 | grep -v "is ignored" || true
  "$VENV_DIR/bin/python" -c 'import ansible, ansible_runner, molecule, testinfra, yaml' \
    || die "controller venv is incomplete"
  sha256sum "$REPO_ROOT/requirements/controller.txt" | cut -d' ' -f1 > "$VENV_DIR/.requirements.sha256"
}

install_collections() {
  local stamp="$COLLECTIONS_DIR/.requirements.sha256" want wheel_dir
  want=$(sha256sum "$REPO_ROOT/requirements.yml" | cut -d' ' -f1)
  [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && return 0
  stage "collections from requirements.yml"
  rm -rf "$COLLECTIONS_DIR"; mkdir -p "$COLLECTIONS_DIR"
  if ! timeout 60 ansible-galaxy collection install -r "$REPO_ROOT/requirements.yml" \
        -p "$COLLECTIONS_DIR" >/dev/null 2>&1; then
    echo "Ansible Galaxy not reachable: taking the pinned collections from the ansible $ANSIBLE_BUNDLE_VERSION wheel"
    wheel_dir=$(mktemp -d)
    # The venv's pip: the wheel requires the controller's Python (>= 3.12), which the `pip` first on PATH may not be.
    if ! "$VENV_DIR/bin/python" -m pip download -q --no-deps -d "$wheel_dir" "ansible==$ANSIBLE_BUNDLE_VERSION"; then
      echo "error: cannot download the ansible $ANSIBLE_BUNDLE_VERSION wheel from the package index (see above)" >&2
      rm -rf "$wheel_dir"
      return 1
    fi
    "$VENV_DIR/bin/python" "$REPO_ROOT/scripts/extract_collections.py" \
      "$wheel_dir"/ansible-"$ANSIBLE_BUNDLE_VERSION"-*.whl "$REPO_ROOT/requirements.yml" "$COLLECTIONS_DIR"
    rm -rf "$wheel_dir"
  fi
  echo "$want" > "$stamp"
}

require_python
install_host_packages
write_containers_conf
install_venv
install_collections
