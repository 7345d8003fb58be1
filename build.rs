//! Writes lockctl's Lua scripts into `$OUT_DIR/scripts.rs`, included by `src/lock/mod.rs`: each
//! script's text (`ACQUIRE_LUA`) and its `LuaScript` (`ACQUIRE`) with its SHA1 digest.
//!
//! Every call to Redis names its script by that digest (`EVALSHA`). Computed at run time
//! (`redis::Script::new`), the digests of all seven scripts, about 85 KB of Lua, took some 12 % of
//! the CPU of a `lockctl exec` waiter in the herd benchmark: a hundred waiters start at once on two
//! cores, and the first holder's job starts only once their start-ups have had their turn. Here they
//! are computed once, when lockctl is built. A unit test in `src/lock/mod.rs` checks each against
//! `redis::Script::new`.
//!
//! The scripts that read and change the queue share the functions of `front.lua`, put before their
//! own text (a script cannot call another).

use std::fmt::Write as _;
use std::path::Path;

/// Each script: its static's name, whether `front.lua` goes before it, its file, and whether it
/// grants or extends a lock (its writes must reach the master's replicas before they count).
const SCRIPTS: [(&str, bool, &str, bool); 7] = [
    ("ACQUIRE", true, "acquire", true),
    ("FENCE", false, "fence", true),
    ("RELEASE", true, "release", false),
    ("RENEW", false, "renew", true),
    ("STATUS", true, "status", false),
    ("BREAK", true, "break", false),
    ("LEAVE", true, "leave", false),
];

fn main() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lock/scripts");
    println!("cargo:rerun-if-changed={}", dir.display());
    // scripts/build links the functions this list names first (see there); cargo does not read
    // the linker's arguments, so a new list must make it link again.
    println!("cargo:rerun-if-changed=scripts/hot-symbols.txt");
    let path = |file: &str| dir.join(format!("{file}.lua"));
    let read = |file: &str| {
        std::fs::read_to_string(path(file))
            .unwrap_or_else(|e| panic!("{}: {e}", path(file).display()))
    };
    let front = read("front");
    let mut out = String::new();
    for (name, with_front, file, durable) in SCRIPTS {
        let own = read(file);
        let (source, parts) = if with_front {
            (format!("{front}{own}"), vec![path("front"), path(file)])
        } else {
            (own, vec![path(file)])
        };
        let includes: Vec<String> = parts
            .iter()
            .map(|p| format!("include_str!({:?})", p.display().to_string()))
            .collect();
        let digest = sha1_smol::Sha1::from(&source).digest().to_string();
        writeln!(
            out,
            "pub(crate) const {name}_LUA: &str = concat!({});\n\
             pub(crate) static {name}: LuaScript = LuaScript {{ source: {name}_LUA, sha1: \
             {digest:?}, durable: {durable} }};",
            includes.join(", ")
        )
        .unwrap();
    }
    let target = Path::new(&std::env::var("OUT_DIR").unwrap()).join("scripts.rs");
    std::fs::write(&target, out).unwrap_or_else(|e| panic!("{}: {e}", target.display()));
}
