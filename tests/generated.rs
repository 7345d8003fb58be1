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
///
/// The global options are described once, in `lockctl(1)`; each command's page lists its own. Every
/// page has EXIT STATUS and EXAMPLES (from the blocks of that name in the command's long help),
/// and ENVIRONMENT (from the options' variables).
fn man_pages() -> BTreeMap<String, Vec<u8>> {
    let mut cmd = lockctl::cli::command().disable_help_subcommand(true);
    // Propagates the global options and gives each command its display name (lockctl-acquire).
    cmd.build();
    let globals: Vec<String> = cmd
        .get_arguments()
        .filter(|a| a.is_global_set())
        .map(|a| a.get_id().to_string())
        .collect();
    let mut pages = BTreeMap::new();
    let (name, page) = man_page(cmd.clone(), None);
    pages.insert(name, page);
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let own = globals
            .iter()
            .fold(sub.clone(), |c, id| c.mut_arg(id, |a| a.hide(true)));
        let (name, page) = man_page(own, Some(&cmd));
        pages.insert(name, page);
    }
    pages
}

/// One page: clap_mangen's title, name, synopsis, description and options, then our sections.
fn man_page(cmd: clap::Command, root: Option<&clap::Command>) -> (String, Vec<u8>) {
    use clap_mangen::roff::{bold, italic, roman, Roff};
    let man = clap_mangen::Man::new(cmd.clone());
    let mut buf = Vec::new();
    man.render_title(&mut buf).unwrap();
    man.render_name_section(&mut buf).unwrap();
    man.render_synopsis_section(&mut buf).unwrap();
    man.render_description_section(&mut buf).unwrap();
    man.render_options_section(&mut buf).unwrap();
    let mut roff = Roff::new();
    match root {
        None => {
            man.render_subcommands_section(&mut buf).unwrap();
        }
        Some(_) => {
            roff.control("SH", ["GLOBAL OPTIONS"]).text([
                roman("The connection, timing and output options ("),
                bold("-r"),
                roman(", "),
                bold("--redis-file"),
                roman(", "),
                bold("--node-timeout"),
                roman(", "),
                bold("--quarantine"),
                roman(", "),
                bold("-q"),
                roman(", "),
                bold("-v"),
                roman(" and the others) apply to every command and are described in "),
                bold("lockctl"),
                roman("(1)."),
            ]);
        }
    }
    let long_help = cmd
        .get_after_long_help()
        .map(|h| h.to_string())
        .unwrap_or_default();
    let block = |title: &str| -> Vec<String> {
        let mut lines = long_help
            .lines()
            .skip_while(|l| *l != title)
            .skip(1)
            .take_while(|l| !l.is_empty())
            .map(|l| l.strip_prefix("  ").unwrap_or(l).to_string());
        let first = lines.next();
        assert!(
            first.is_some(),
            "{}: no {title:?} block in its long help",
            cmd.get_name()
        );
        first.into_iter().chain(lines).collect()
    };
    let verbatim = |roff: &mut Roff, title: &str, lines: Vec<String>| {
        roff.control("SH", [title]).control("nf", []);
        for line in lines {
            roff.text([roman(line)]);
        }
        roff.control("fi", []);
    };
    verbatim(&mut roff, "EXIT STATUS", block("Exit status:"));

    roff.control("SH", ["ENVIRONMENT"]);
    let variable = |roff: &mut Roff, var: &str, what: String| {
        roff.control("TP", []).text([bold(var)]).text([roman(what)]);
    };
    for arg in cmd.get_arguments().filter(|a| !a.is_hide_set()) {
        if let (Some(var), Some(long)) = (arg.get_env(), arg.get_long()) {
            let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
            variable(
                &mut roff,
                &var.to_string_lossy(),
                format!("--{long}: {help}"),
            );
        }
    }
    let name = cmd.get_name().to_string();
    if name.ends_with("release") || name.ends_with("renew") {
        variable(
            &mut roff,
            "LOCKCTL_TOKEN",
            "the token, when --token is not given and LOCKCTL_NAME is unset or names this lock"
                .into(),
        );
        variable(
            &mut roff,
            "LOCKCTL_NAME",
            "the lock that LOCKCTL_TOKEN belongs to (set by acquire --format env and by exec)"
                .into(),
        );
    }
    if name.ends_with("exec") {
        roff.text([roman(
            "The command runs with the environment of lockctl plus LOCKCTL_NAME, LOCKCTL_KEY, \
             LOCKCTL_TOKEN and LOCKCTL_FENCE.",
        )]);
    }
    roff.control("PP", []).text(match root {
        None => vec![roman(
            "An empty variable counts as unset. A flag on the command line wins over a variable; \
             given both on the command line, or both in the environment, --redis and \
             --redis-file, -w and -n, or -q and -v are a usage error.",
        )],
        Some(_) => vec![
            roman(
                "An empty variable counts as unset, and a flag on the command line wins. The \
                   variables of the global options are listed in ",
            ),
            bold("lockctl"),
            roman("(1)."),
        ],
    });

    verbatim(&mut roff, "EXAMPLES", block("Examples:"));
    roff.control("SH", ["SEE ALSO"]);
    let mut see: Vec<String> = match root {
        None => cmd
            .get_subcommands()
            .map(|s| format!("lockctl-{}", s.get_name()))
            .collect(),
        Some(_) => vec!["lockctl".into()],
    };
    see.push("flock".into());
    let mut refs = Vec::new();
    for (i, page) in see.iter().enumerate() {
        if i > 0 {
            refs.push(roman(", "));
        }
        refs.push(bold(page.as_str()));
        refs.push(roman("(1)"));
    }
    roff.text(refs);
    roff.control("PP", []).text([
        roman("The guarantees, the Redlock design and the JSON output are described in "),
        italic("/usr/share/doc/lockctl/docs/"),
        roman("."),
    ]);
    roff.to_writer(&mut buf).unwrap();
    man.render_version_section(&mut buf).unwrap();
    (man.get_filename(), buf)
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
    let main_page = String::from_utf8_lossy(&expected["lockctl.1"]).into_owned();
    // The global options are described once, in lockctl(1), with their variables.
    assert!(
        main_page.contains("\\-\\-node\\-timeout"),
        "lockctl.1 lacks --node-timeout"
    );
    assert!(
        main_page.contains("LOCKCTL_REDIS_FILE"),
        "lockctl.1 lacks LOCKCTL_REDIS_FILE"
    );
    for c in commands {
        let page = format!("lockctl-{c}.1");
        let text = String::from_utf8_lossy(expected.get(&page).unwrap_or_else(|| panic!("{page}")));
        assert!(
            text.contains(&format!("lockctl\\-{c}")),
            "{page} lacks its name"
        );
        for section in ["EXIT STATUS", "ENVIRONMENT", "EXAMPLES", "GLOBAL OPTIONS"] {
            assert!(
                text.contains(&format!(".SH \"{section}\""))
                    || text.contains(&format!(".SH {section}")),
                "{page} lacks {section}"
            );
        }
        assert!(
            !text.contains("LOCKCTL_NODE_TIMEOUT") && !text.contains("LOCKCTL_REDIS_FILE"),
            "{page} repeats a global option"
        );
    }
    for section in ["EXIT STATUS", "ENVIRONMENT", "EXAMPLES"] {
        assert!(
            main_page.contains(&format!(".SH \"{section}\""))
                || main_page.contains(&format!(".SH {section}")),
            "lockctl.1 lacks {section}"
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
