//! The Debian package: `scripts/build` builds the binary as it ships (glibc linked in, see that
//! script), `cargo deb --no-build` packages it, and everything lands where Debian looks for it.
//!
//! The binary is built with the `deb-check` profile (dev without debug information, see
//! Cargo.toml) so that the test compiles in reasonable time; a release uses the release profile,
//! with the same link, metadata and assets. The test then reads the package with `dpkg-deb -I`
//! and `-c`, unpacks it, compares the man pages and completions with the committed ones, checks
//! that the binary needs no dynamic loader, and runs it against a real redis-server: named by host
//! name (`localhost`, which a static glibc resolves without loading a module) and through `exec`
//! (whose watcher is the same binary started again).

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
        Command::new(root.join("scripts/build"))
            .args(["--quiet", "--profile", "deb-check"])
            .current_dir(root),
        "scripts/build",
    );
    tool(
        Command::new("cargo")
            .args([
                "deb",
                "--no-build",
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
    assert!(
        !has_interpreter(&std::fs::read(&bin).unwrap()),
        "the packaged binary needs the dynamic loader: scripts/build did not link glibc in"
    );
    let s = Server::start_tcp();
    let url = s.url().replace("127.0.0.1", "localhost");
    // A server this test just started: the quarantine would refuse it.
    let o = run(Command::new(&bin)
        .env("LOCKCTL_REDIS", &url)
        .env("LOCKCTL_QUARANTINE", "0")
        .args(["acquire", "packaged", "-n"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(s.get("lockctl:packaged"), Some(stdout(&o)));
    let o = run(Command::new(&bin)
        .env("LOCKCTL_REDIS", &url)
        .env("LOCKCTL_QUARANTINE", "0")
        .args([
            "exec",
            "packaged-exec",
            "--",
            "sh",
            "-c",
            "echo $LOCKCTL_FENCE",
        ]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stdout(&o).trim().parse::<u64>().is_ok(), "{}", stdout(&o));
    assert_eq!(s.get("lockctl:packaged-exec"), None);
}

/// True if the ELF executable `elf` (64-bit, little-endian) names a program interpreter
/// (`PT_INTERP`): a dynamic loader that must map it and its libraries at every start.
fn has_interpreter(elf: &[u8]) -> bool {
    assert_eq!(
        &elf[..6],
        b"\x7fELF\x02\x01",
        "not a 64-bit little-endian ELF file"
    );
    let u16_at = |at: usize| u16::from_le_bytes(elf[at..at + 2].try_into().unwrap()) as usize;
    let phoff = u64::from_le_bytes(elf[0x20..0x28].try_into().unwrap()) as usize;
    let (size, count) = (u16_at(0x36), u16_at(0x38));
    (0..count).any(|i| {
        let at = phoff + i * size;
        u32::from_le_bytes(elf[at..at + 4].try_into().unwrap()) == 3
    })
}
