#!/bin/sh
# Backs up a directory into a compressed tarball, on one host at a time, with the lock taken and
# given back by hand: acquire, renew between the long steps, release on every exit.
#
# Usage: backup.sh SOURCE_DIR ARCHIVE.tar.gz
# The nodes come from LOCKCTL_REDIS_FILE or LOCKCTL_REDIS; BACKUP_WAIT (default 5m) bounds the wait.
set -eu
src=$1
archive=$2

# Keep the output in a variable first: a shell ignores the status of a command substitution inside
# eval, so `eval "$(lockctl acquire ...)"` would go on without the lock. 75: still busy.
lock=$(lockctl acquire backup --ttl 10m -w "${BACKUP_WAIT:-5m}" --format env) || exit
eval "$lock"   # LOCKCTL_NAME, LOCKCTL_KEY, LOCKCTL_TOKEN, LOCKCTL_FENCE, LOCKCTL_VALIDITY_MS
trap 'lockctl release backup' EXIT

tar -C "$src" -cf "$archive.tmp" .
# Another 10 minutes (the TTL of the grant). If the lease was lost meanwhile, this exits 76 and
# set -e stops the script before it writes anything more.
lockctl renew backup >/dev/null
gzip -c "$archive.tmp" >"$archive.part"
rm -f "$archive.tmp"
lockctl renew backup >/dev/null
mv "$archive.part" "$archive"
echo "backup of $src written to $archive (fence $LOCKCTL_FENCE)"
