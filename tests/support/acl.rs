//! Helpers of the channel-rights tests (`tests/acl_channels.rs` and its reviews): an ACL user
//! `locker` with every key and command and only the channel rules a test gives it, lockctl run as
//! that user, and a server's whole state to compare before and after a refused command.

use std::process::Command;

use super::{lockctl, Server};

/// The password of user `locker`.
pub const PW: &str = "L0ckerChannelPw";

/// The recipe's channel rules (docs/security.md, `ACL_RULES`).
pub const CHANNELS: &[&str] = &[
    "&lockctl:*",
    "&{lockctl:*",
    "&{*}?lockctl:*",
    "&__keyspace@*__:lockctl:*",
];

/// `ACL SETUSER` of user `locker`: reset, every key and command, no channel, then `rules`. An
/// explicit `resetchannels`, so that Redis 6.2 (which gives a new user `allchannels`) sees the
/// same user as Redis 7 and Valkey do.
pub fn setuser(rules: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "ACL",
        "SETUSER",
        "locker",
        "reset",
        "on",
        &format!(">{PW}"),
        "~*",
        "+@all",
        "resetchannels",
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    args.extend(rules.iter().map(|r| r.to_string()));
    args
}

/// Makes (or remakes) user `locker` on `s` with the channel rules `rules`.
pub fn locker(s: &Server, rules: &[&str]) {
    let args = setuser(rules);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let ok: String = s.cmd(&args);
    assert_eq!(ok, "OK");
}

/// `s`'s URL as user `locker`.
pub fn locker_url(s: &Server) -> String {
    format!("unix://{}?user=locker&pass={PW}", s.socket().display())
}

/// A lockctl command as `locker` on `servers` (one URL each: Redlock for several).
pub fn as_locker(servers: &[&Server]) -> Command {
    let mut c = lockctl();
    let urls: Vec<String> = servers.iter().map(|s| locker_url(s)).collect();
    c.env("LOCKCTL_REDIS", urls.join(","));
    c
}

/// Every key with its type and value (a hash's fields sorted, a sorted set with its scores), the
/// short-lived release records included: a refused command may change nothing at all.
pub fn state(s: &Server) -> Vec<String> {
    let mut keys: Vec<String> = s.cmd(&["KEYS", "*"]);
    keys.sort();
    keys.into_iter()
        .map(|k| {
            let kind: String = s.cmd(&["TYPE", &k]);
            let v = match kind.as_str() {
                "string" => s.get(&k).unwrap_or_default(),
                "hash" => {
                    let mut f: Vec<String> = s.cmd(&["HGETALL", &k]);
                    f.sort();
                    f.join(",")
                }
                "zset" => {
                    let m: Vec<String> = s.cmd(&["ZRANGE", &k, "0", "-1", "WITHSCORES"]);
                    m.join(",")
                }
                other => other.to_string(),
            };
            format!("{k:?} {kind} {v}")
        })
        .collect()
}
