//! The Debian package: `cargo deb` builds it, and everything lands where Debian looks for it.
//!
//! The package is built with the `deb-check` profile (dev without debug information, see
//! Cargo.toml) so that the test compiles in reasonable time; `cargo deb` for a release uses the
//! release profile, with the same metadata and assets. The test then reads the package with
//! `dpkg-deb -I` and `-c`, unpacks it, compares the man pages and completions with the committed
//! ones, and runs the packaged binary against a real redis-server.

mod support;

use std::path::Path;
use std::process::Command;

use support::*;

fn tool(cmd: &mut Command, what: &str) -> String {
    let o = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: {e}; run ./scripts/test, which installs it"));
    assert!(
        o.status.success(),
        "{what} failed:\n{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn deb_package_has_the_binary_man_pages_completions_and_docs() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = tempfile::tempdir().unwrap();
    tool(
        Command::new("cargo")
            .args([
                "deb",
                "--profile",
                "deb-check",
                "--fast",
                "--quiet",
                "--output",
            ])
            .arg(out.path())
            .current_dir(root),
        "cargo deb (cargo install --locked cargo-deb)",
    );
    let debs: Vec<_> = std::fs::read_dir(out.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "deb"))
        .collect();
    assert_eq!(debs.len(), 1, "{debs:?}");
    let deb = &debs[0];

    let info = tool(Command::new("dpkg-deb").arg("-I").arg(deb), "dpkg-deb -I");
    for field in [
        "Package: lockctl",
        &format!("Version: {}-1", env!("CARGO_PKG_VERSION")),
        "Section: utils",
        "Depends: libc6",
        "Architecture: ",
        "Description: Distributed locks on Redis",
    ] {
        assert!(info.contains(field), "dpkg-deb -I lacks {field:?}:\n{info}");
    }

    let listing = tool(Command::new("dpkg-deb").arg("-c").arg(deb), "dpkg-deb -c");
    let has = |path: &str, mode: &str| {
        assert!(
            listing
                .lines()
                .any(|l| l.starts_with(mode) && l.ends_with(&format!(" ./{path}"))),
            "the package lacks {path} ({mode}):\n{listing}"
        );
    };
    has("usr/bin/lockctl", "-rwxr-xr-x");
    let mut pages = 0;
    for page in std::fs::read_dir(root.join("man")).unwrap() {
        let name = page.unwrap().file_name().to_string_lossy().into_owned();
        has(&format!("usr/share/man/man1/{name}.gz"), "-rw-r--r--");
        pages += 1;
    }
    assert_eq!(pages, 10);
    has(
        "usr/share/bash-completion/completions/lockctl",
        "-rw-r--r--",
    );
    has("usr/share/zsh/vendor-completions/_lockctl", "-rw-r--r--");
    has(
        "usr/share/fish/vendor_completions.d/lockctl.fish",
        "-rw-r--r--",
    );
    has("usr/share/doc/lockctl/README.md", "-rw-r--r--");
    has("usr/share/doc/lockctl/copyright", "-rw-r--r--");
    for doc in std::fs::read_dir(root.join("docs")).unwrap() {
        let name = doc.unwrap().file_name().to_string_lossy().into_owned();
        has(&format!("usr/share/doc/lockctl/docs/{name}"), "-rw-r--r--");
    }
    has(
        "usr/share/doc/lockctl/examples/systemd/nightly-report.service",
        "-rw-r--r--",
    );

    // Unpacked: the same man pages and completions as committed, and a binary that works.
    let tree = tempfile::tempdir().unwrap();
    tool(
        Command::new("dpkg-deb").arg("-x").arg(deb).arg(tree.path()),
        "dpkg-deb -x",
    );
    let page = tool(
        Command::new("gzip")
            .arg("-dc")
            .arg(tree.path().join("usr/share/man/man1/lockctl.1.gz")),
        "gzip -dc",
    );
    assert_eq!(
        page,
        std::fs::read_to_string(root.join("man/lockctl.1")).unwrap()
    );
    assert_eq!(
        std::fs::read(
            tree.path()
                .join("usr/share/bash-completion/completions/lockctl")
        )
        .unwrap(),
        std::fs::read(root.join("completions/lockctl.bash")).unwrap()
    );
    let bin = tree.path().join("usr/bin/lockctl");
    let version = tool(Command::new(&bin).arg("--version"), "lockctl --version");
    assert_eq!(
        version.trim(),
        format!("lockctl {}", env!("CARGO_PKG_VERSION"))
    );
    let s = Server::start();
    // A server this test just started: the quarantine would refuse it.
    let o = run(Command::new(&bin)
        .env("LOCKCTL_REDIS", s.url())
        .env("LOCKCTL_QUARANTINE", "0")
        .args(["acquire", "packaged", "-n"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(s.get("lockctl:packaged"), Some(stdout(&o)));
}
