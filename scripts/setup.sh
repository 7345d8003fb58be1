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
