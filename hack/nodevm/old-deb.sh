#!/usr/bin/env bash
# old-deb.sh REV: the crisp .deb of an earlier commit, for the node VM's upgrade tests
# (make test-node, NODE_OLD_REV). Prints its path. Built once per commit with that
# tree's own `make deb`, in a `git worktree add --detach` under a temp dir (removed
# after), and cached in $NODEVM_CACHE/crisp-deb-<commit>/ (/var/cache/crisp).
#
# Its version is <release>-dev-<commit date>+<commit> (semver; Debian:
# 0.1.0~dev~20261125113128+298699c86fba): a '~' after "dev" sorts below the current
# tree's 0.1.0~dev+<commit>[.dirty] and 0.1.0. The version `make deb` gives by itself
# would not do: two development builds of one release differ only in the commit hash,
# and hex hashes sort in no useful order.
set -euo pipefail
rev=${1:?usage: old-deb.sh REV}
repo=$(cd "$(dirname "$0")/../.." && pwd)
cache=${NODEVM_CACHE:-/var/cache/crisp}

commit=$(git -C "$repo" rev-parse --verify "$rev^{commit}")
dir=$cache/crisp-deb-$commit
found() { compgen -G "$dir/crisp_*.deb" >/dev/null; }
if found; then ls "$dir"/crisp_*.deb; exit 0; fi

mkdir -p "$cache"
exec 9>"$cache/crisp-deb.lock"
flock 9
if found; then ls "$dir"/crisp_*.deb; exit 0; fi

tmp=$(mktemp -d /var/tmp/crisp-old-deb.XXXXXX)
cleanup() {
	if [ -d "$tmp/src" ]; then git -C "$repo" worktree remove --force "$tmp/src" || true; fi
	git -C "$repo" worktree prune || true
	rm -rf "$tmp"
}
trap cleanup EXIT

git -C "$repo" worktree add -q --detach "$tmp/src" "$commit"
if ! grep -q '^deb:' "$tmp/src/Makefile"; then
	echo "old-deb.sh: $rev ($commit) has no 'make deb' (added in 298699c)" >&2
	exit 1
fi
release=$(cat "$tmp/src/internal/version/VERSION" 2>/dev/null || cat "$tmp/src/version/VERSION")
date=$(TZ=UTC git -C "$repo" show -s --format=%cd --date=format-local:%Y%m%d%H%M%S "$commit")
version=$release-dev-$date+${commit:0:12}
echo "old-deb.sh: building crisp $version from $commit" >&2
t0=$(date +%s)
make -C "$tmp/src" --no-print-directory deb VERSION="$version" DEBDIR="$tmp/deb" >&2
echo "old-deb.sh: built in $(( $(date +%s) - t0 )) s" >&2
rm -rf "$dir.tmp"
mkdir -p "$dir.tmp"
cp "$tmp"/deb/crisp_*.deb "$dir.tmp/"
mv -T "$dir.tmp" "$dir"
ls "$dir"/crisp_*.deb
