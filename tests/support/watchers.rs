//! Helpers of the tests of `exec`'s watcher (`lockctl-guard`): finding the watchers of a lockctl.

use std::time::Duration;

use super::{alive, eventually};

/// The watchers of the lockctl `pid`, found by their command line.
pub fn watchers_of(pid: u32) -> Vec<i32> {
    let prefix = format!("lockctl-guard\0--lockctl-guard\0{pid}:");
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|p| {
            std::fs::read(format!("/proc/{p}/cmdline"))
                .is_ok_and(|c| c.starts_with(prefix.as_bytes()))
        })
        .filter(|&p| alive(p))
        .collect()
}

/// The one watcher of the lockctl `pid`, once it runs as `lockctl-guard`.
pub fn watcher_of(pid: u32) -> i32 {
    let mut found = Vec::new();
    eventually(Duration::from_secs(30), || {
        found = watchers_of(pid);
        found.len() == 1
            && std::fs::read_to_string(format!("/proc/{}/comm", found[0]))
                .is_ok_and(|c| c.trim() == "lockctl-guard")
    });
    assert_eq!(found.len(), 1, "lockctl {pid} has one watcher: {found:?}");
    found[0]
}
