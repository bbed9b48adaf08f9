# debian_mirror: the Debian mirror this system's apt already uses (its main
# archive, not security), or GPUCKPT_DEBIAN_MIRROR when set, so that what
# the tools fetch from Debian outside the system's sources (install-criu's
# CRIU source, setup's checkpointctl) comes through the same mirror or
# proxy as apt itself. Sourced by tools/install-criu and tools/setup.
debian_mirror() {
  if [[ -n "${GPUCKPT_DEBIAN_MIRROR:-}" ]]; then
    echo "${GPUCKPT_DEBIAN_MIRROR%/}"
    return
  fi
  local uri
  # shellcheck disable=SC2016  # $(...) are apt's field names, not shell
  uri="$(apt-get indextargets --format '$(LABEL) $(REPO_URI)' 2>/dev/null |
    awk '$1 == "Debian" { print $2; exit }')"
  uri="${uri:-http://deb.debian.org/debian}"
  echo "${uri%/}"
}
