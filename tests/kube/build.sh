#!/usr/bin/env bash
# Build (or reuse) kube-apiserver, kube-controller-manager and kube-scheduler from Debian
# bookworm's `kubernetes` source package (1.20, everything vendored, builds offline).
#
# Binaries are cached outside the repo, keyed by version:
#   ${GPUSHARE_KUBE_CACHE:-~/.cache/jupyter-gpushare/kube}/<version>/bin/
# When they exist this prints that directory and exits at once. Otherwise it installs the
# toolchain (golang-1.19-go rsync jq etcd-server; needs root or passwordless sudo), downloads
# the source, builds (~5 min on 2 cores) and deletes the ~2 GB go build cache and source tree.
# The last line of stdout is always the bin directory; progress goes to stderr.
set -euo pipefail

KUBE_VERSION=${GPUSHARE_KUBE_VERSION:-1.20.2}
ROOT=${GPUSHARE_KUBE_CACHE:-$HOME/.cache/jupyter-gpushare/kube}
CACHE=$ROOT/$KUBE_VERSION
BIN=$CACHE/bin
COMPONENTS=(kube-apiserver kube-controller-manager kube-scheduler)

have_binaries() {
    local c
    for c in "${COMPONENTS[@]}"; do [[ -x $BIN/$c ]] || return 1; done
}
log() { echo "kube build: $*" >&2; }

if have_binaries; then echo "$BIN"; exit 0; fi

mkdir -p "$CACHE"
# One build at a time: the pytest fixture and a person may both ask for it.
exec 9>"$CACHE/.lock"
flock 9
if have_binaries; then echo "$BIN"; exit 0; fi

SUDO=
if [[ $(id -u) -ne 0 ]]; then
    if sudo -n true 2>/dev/null; then SUDO="sudo -n"; else
        log "need root or passwordless sudo to apt-get install the toolchain"; exit 2
    fi
fi

# Source packages need a deb-src entry; add one for bookworm main if none exists.
if ! grep -rqsE '^(deb-src|Types:.*deb-src)' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    log "adding a deb-src entry for bookworm main"
    $SUDO tee /etc/apt/sources.list.d/jupyter-gpushare-src.sources >/dev/null <<'SRC'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
    $SUDO apt-get update -q >&2
fi

missing=()
for p in golang-1.19-go rsync jq etcd-server; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
    log "installing ${missing[*]}"
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >&2
fi

# Download once; keep the tarballs (34 MB) so a rebuild needs no network.
DL=$CACHE/download
mkdir -p "$DL"
if ! ls "$DL"/kubernetes_*.dsc >/dev/null 2>&1; then
    # Debian's version reads like 1.20.5+really1.20.2-1.1: the upstream one is after "really".
    available=$(apt-cache showsrc kubernetes | sed -n 's/^Version: //p' | head -n1)
    if [[ $available != *"$KUBE_VERSION"-* ]]; then
        log "the kubernetes source package here is ${available:-missing}, not $KUBE_VERSION;" \
            "set GPUSHARE_KUBE_VERSION to match it"
        exit 3
    fi
    log "downloading the kubernetes source package $available"
    (cd "$DL" && apt-get source --download-only "kubernetes=$available" >&2)
fi

SRC=$CACHE/src
rm -rf "$SRC"
mkdir -p "$SRC"
log "unpacking"
for t in "$DL"/kubernetes_*.orig.tar.* ; do tar -xf "$t" -C "$SRC"; done
top=$(find "$SRC" -mindepth 1 -maxdepth 1 -type d | head -n1)

log "building ${COMPONENTS[*]} (several minutes)"
start=$(date +%s)
(
    cd "$top"
    export PATH=/usr/lib/go-1.19/bin:$PATH GOFLAGS=-mod=vendor GOPROXY=off CGO_ENABLED=0
    export GOCACHE=$CACHE/gocache GOPATH=$CACHE/gopath
    make WHAT="cmd/kube-apiserver cmd/kube-controller-manager cmd/kube-scheduler" >&2
)
log "built in $(( $(date +%s) - start )) s"

mkdir -p "$BIN.tmp"
for c in "${COMPONENTS[@]}"; do
    cp "$(find "$top/_output" -type f -name "$c" -perm -u+x | head -n1)" "$BIN.tmp/$c"
done
rm -rf "$BIN"
mv "$BIN.tmp" "$BIN"
# The go build cache (~2 GB) and the tree are only needed to build; the binaries are enough.
chmod -R u+w "$CACHE/gopath" 2>/dev/null || true
rm -rf "$SRC" "$CACHE/gocache" "$CACHE/gopath"
echo "$BIN"
