//! The committed shell completions (`completions/`) and man pages (`man/`) match the command line.
//!
//! They are generated from `lockctl::cli::command()`, so a flag added or reworded in `src/cli.rs`
//! makes them stale. These tests render everything in memory and compare it with the committed files,
//! so a stale file fails the build instead of shipping. To bring them up to date, run
//! `LOCKCTL_REGENERATE=1 cargo test --test generated` and commit the result.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use clap_complete::{Generator, Shell};
use support::{code, lockctl, run};

const SHELLS: [Shell; 5] = [
    Shell::Bash,
    Shell::Zsh,
    Shell::Fish,
    Shell::Elvish,
    Shell::PowerShell,
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every completion script, by file name.
fn completions() -> BTreeMap<String, Vec<u8>> {
    SHELLS
        .iter()
        .map(|&shell| {
            let mut buf = Vec::new();
            clap_complete::generate(shell, &mut lockctl::cli::command(), "lockctl", &mut buf);
            (shell.file_name("lockctl"), buf)
        })
        .collect()
}

/// `lockctl.1` and one page per command (`lockctl-acquire.1`, ...), by file name.
fn man_pages() -> BTreeMap<String, Vec<u8>> {
    fn render(cmd: clap::Command, pages: &mut BTreeMap<String, Vec<u8>>) {
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()).cloned() {
            render(sub, pages);
        }
        let man = clap_mangen::Man::new(cmd);
        let mut buf = Vec::new();
        man.render(&mut buf).expect("render a man page");
        pages.insert(man.get_filename(), buf);
    }
    let mut cmd = lockctl::cli::command().disable_help_subcommand(true);
    // Propagates the global options and gives each command its display name (lockctl-acquire).
    cmd.build();
    let mut pages = BTreeMap::new();
    render(cmd, &mut pages);
    pages
}

/// Compares `expected` with the files in `dir`, or rewrites them with `LOCKCTL_REGENERATE=1`.
fn check(dir: &Path, expected: BTreeMap<String, Vec<u8>>) {
    if std::env::var_os("LOCKCTL_REGENERATE").is_some_and(|v| v == "1") {
        std::fs::create_dir_all(dir).unwrap();
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if !expected.contains_key(&name) {
                std::fs::remove_file(&path).unwrap();
            }
        }
        for (name, content) in &expected {
            std::fs::write(dir.join(name), content).unwrap();
        }
        return;
    }
    let mut stale = Vec::new();
    for (name, content) in &expected {
        match std::fs::read(dir.join(name)) {
            Ok(found) if &found == content => {}
            Ok(_) => stale.push(format!("{name} differs")),
            Err(_) => stale.push(format!("{name} is missing")),
        }
    }
    let present: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    for name in present {
        if !expected.contains_key(&name) {
            stale.push(format!("{name} is no longer generated"));
        }
    }
    assert!(
        stale.is_empty(),
        "{} is stale: {}.\nRegenerate with: LOCKCTL_REGENERATE=1 cargo test --test generated",
        dir.display(),
        stale.join(", ")
    );
}

#[test]
fn completions_are_up_to_date() {
    let expected = completions();
    assert_eq!(expected.len(), 5);
    for (name, content) in &expected {
        let text = String::from_utf8_lossy(content);
        for word in ["acquire", "release", "renew", "exec", "conflict-exit-code"] {
            assert!(text.contains(word), "{name} does not mention {word}");
        }
    }
    check(&root().join("completions"), expected);
}

#[test]
fn man_pages_are_up_to_date() {
    let expected = man_pages();
    let commands = [
        "acquire",
        "release",
        "renew",
        "exec",
        "status",
        "list",
        "break",
        "doctor",
        "completions",
    ];
    assert!(expected.contains_key("lockctl.1"));
    for c in commands {
        let page = format!("lockctl-{c}.1");
        let text = String::from_utf8_lossy(expected.get(&page).unwrap_or_else(|| panic!("{page}")));
        // The global options are on every command's page.
        assert!(
            text.contains("node\\-timeout"),
            "{page} lacks --node-timeout"
        );
        assert!(
            text.contains(&format!("lockctl\\-{c}")),
            "{page} lacks its name"
        );
    }
    assert_eq!(expected.len(), commands.len() + 1);
    check(&root().join("man"), expected);
}

#[test]
fn completions_command_prints_the_committed_script() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let o = run(lockctl().args(["completions", shell]));
        assert_eq!(code(&o), 0, "completions {shell}");
        let parsed: Shell = shell.parse().unwrap();
        assert_eq!(
            o.stdout,
            completions()[&parsed.file_name("lockctl")],
            "lockctl completions {shell} differs from the generated script"
        );
    }
    let o = run(lockctl().args(["completions", "tcsh"]));
    assert_eq!(code(&o), 2);
    assert!(String::from_utf8_lossy(&o.stderr).contains("SHELL"));
}
