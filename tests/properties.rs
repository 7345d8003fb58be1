//! Property tests for every parser of user input, in the library and through the real binary.
//!
//! Whatever a user types (a flag value, a lock name, a URL) must end in a value or in a usage error
//! that names the option: never a panic, never a key written to Redis. URLs carry the one secret the
//! tool ever sees, so redaction is tested on every URL shape the generators can make, including
//! passwords with unescaped `@ : / ? # &` that shift the URL's structure around them.

mod support;

use std::process::Command;
use std::time::Duration;

use lockctl::config::{
    check_name, check_prefix, check_token, check_url, parse_drift_factor, parse_duration_or_zero,
    parse_positive_duration, redact, MAX_NAME_BYTES,
};
use lockctl::LockError;
use proptest::prelude::*;
use support::*;

const YEAR: Duration = Duration::from_secs(366 * 24 * 3600);

fn usage_text(e: LockError) -> String {
    match e {
        LockError::Usage(m) => m,
        other => panic!("expected a usage error, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Durations

/// Strings that look like durations, numbers or neither.
fn duration_like() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[0-9. ]{0,24}",
        "-?[0-9]{0,12}(\\.[0-9]{0,12})?(ns|us|ms|s|m|h|d|w|y|M|min|sec|x)?",
        "([0-9]{1,20}(ns|ms|s|m|h|d) ?){1,4}",
        "(nan|inf|NaN|-inf|1e400|1e-400|0x10|\\+5|5_000|٣|１)",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn durations_never_panic_and_stay_in_range(s in duration_like()) {
        match parse_duration_or_zero(&s) {
            Ok(d) => prop_assert!(d <= YEAR, "{s:?} gave {d:?}"),
            Err(m) => prop_assert!(!m.is_empty()),
        }
        match parse_positive_duration(&s) {
            Ok(d) => {
                prop_assert!(d >= Duration::from_millis(1), "{s:?} gave {d:?}");
                prop_assert!(d <= YEAR);
            }
            Err(m) => prop_assert!(!m.is_empty()),
        }
        match lockctl::config::parse_ttl(&s) {
            Ok(d) => prop_assert!(d >= lockctl::config::MIN_TTL && d <= YEAR, "{s:?} gave {d:?}"),
            Err(m) => prop_assert!(!m.is_empty()),
        }
        // They agree where they overlap.
        if let Ok(d) = parse_positive_duration(&s) {
            prop_assert_eq!(parse_duration_or_zero(&s), Ok(d));
        }
    }

    #[test]
    fn milliseconds_round_trip(ms in 0u64..=YEAR.as_millis() as u64) {
        prop_assert_eq!(parse_duration_or_zero(&format!("{ms}ms")), Ok(Duration::from_millis(ms)));
        let d = Duration::from_millis(ms);
        let human = humantime::format_duration(d).to_string();
        prop_assert_eq!(parse_duration_or_zero(&human), Ok(d), "{}", human);
        prop_assert_eq!(lockctl::config::parse_ttl(&format!("{ms}ms")).is_ok(), ms >= 10);
        if ms > 0 {
            prop_assert_eq!(parse_positive_duration(&format!("{ms}ms")), Ok(d));
        } else {
            prop_assert!(parse_positive_duration("0ms").is_err());
        }
    }

    #[test]
    fn bare_seconds_like_flock(secs in 0u64..=YEAR.as_secs(), frac in 0u32..1000) {
        let text = format!("{secs}.{frac:03}");
        let want = Duration::from_secs(secs) + Duration::from_millis(u64::from(frac));
        let got = parse_duration_or_zero(&text).unwrap();
        // f64 has 52 bits: a year in seconds with millisecond fractions is exact to well under 1 µs.
        let diff = got.abs_diff(want);
        prop_assert!(diff < Duration::from_micros(1), "{text}: {got:?} vs {want:?}");
        prop_assert_eq!(parse_duration_or_zero(&secs.to_string()), Ok(Duration::from_secs(secs)));
    }

    #[test]
    fn negative_and_absurd_durations_are_refused(n in 1u64..u64::MAX, unit in "(ms|s|m|h)?") {
        let negative = format!("-{n}{unit}");
        prop_assert!(parse_duration_or_zero(&negative).is_err());
        prop_assert!(parse_positive_duration(&negative).is_err());
        let absurd = format!("{}{unit}", u128::from(n) + u128::from(u64::MAX));
        prop_assert!(parse_duration_or_zero(&absurd).is_err(), "{absurd}");
    }

    /// Exactly the numbers in [0, 0.5) are accepted, as themselves; everything else is refused with
    /// a message that shows a usable value.
    #[test]
    fn drift_factor_is_a_small_fraction(s in prop_oneof![
        any::<String>(),
        "-?[0-9]{0,3}(\\.[0-9]{0,6})?",
        " ?-?0\\.(0[0-9]{0,3}|4[0-9]{0,5}|5[0-9]{0,3}|9) ?",
        "(nan|NaN|inf|-inf|-0|0|0\\.5|0\\.49999|1e-3|5e-1|4\\.9e-1|0x1)",
    ]) {
        let number = s.trim().parse::<f64>().ok();
        let in_range = number.filter(|f| (0.0..0.5).contains(f));
        match parse_drift_factor(&s) {
            Ok(f) => prop_assert_eq!(Some(f), in_range, "{:?} was accepted as {}", s, f),
            Err(m) => {
                prop_assert!(in_range.is_none(), "{:?} was refused: {}", s, m);
                prop_assert!(m.contains("0.01"), "{:?}: {}", s, m);
            }
        }
    }
}

/// The edges of the drift factor's range, as a user types them.
#[test]
fn drift_factor_edges() {
    for (text, want) in [
        ("0", Some(0.0)),
        ("0.01", Some(0.01)),
        (" 0.2 ", Some(0.2)),
        ("0.4999", Some(0.4999)),
        ("0.5", None),
        ("0.6", None),
        ("1", None),
        ("-0.01", None),
        ("nan", None),
        ("inf", None),
        ("", None),
        ("0.01s", None),
    ] {
        assert_eq!(parse_drift_factor(text).ok(), want, "{text:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// Names, prefixes, tokens

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn names_follow_the_contract(name in prop_oneof![
        any::<String>(),
        "\\PC{0,600}",
        "[a-z\u{1f}\u{7f}\u{85}\n\t\r\0]{0,8}",
        proptest::collection::vec(any::<char>(), 500..530).prop_map(|v| v.into_iter().collect()),
    ]) {
        let valid = !name.is_empty()
            && name.len() <= MAX_NAME_BYTES
            && !name.chars().any(char::is_control);
        match check_name(&name) {
            Ok(()) => prop_assert!(valid, "{name:?} was accepted"),
            Err(e) => {
                prop_assert!(!valid, "{name:?} was refused");
                let m = usage_text(e);
                prop_assert!(m.starts_with("invalid lock NAME"), "{m}");
            }
        }
    }

    #[test]
    fn prefixes_never_contain_the_aux_separator(p in any::<String>()) {
        if check_prefix(&p).is_ok() {
            prop_assert!(!p.contains('\u{1f}'), "{p:?}");
        } else {
            prop_assert!(usage_text(check_prefix(&p).unwrap_err()).contains("--prefix"));
        }
    }

    #[test]
    fn tokens_given_back_are_checked(t in proptest::option::of(any::<String>())) {
        match check_token(t.clone()) {
            Ok(tok) => {
                let t = t.unwrap();
                prop_assert_eq!(&tok, &t);
                prop_assert!(!t.is_empty() && t.len() <= 1024 && !t.chars().any(char::is_control));
            }
            Err(e) => {
                let m = usage_text(e);
                prop_assert!(m.contains("token"), "{m}");
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// URLs and redaction

/// A password that cannot be mistaken for anything else in a URL: it always has upper-case letters
/// (hosts, users and schemes here are lower case) and may hold every character that changes a URL's
/// structure.
fn secret() -> impl Strategy<Value = String> {
    (
        "[A-Z]{3}",
        proptest::collection::vec(
            prop_oneof![
                3 => "[A-Z0-9]",
                2 => "[@:/?#%&=+ ;!$'(),~\\[\\]\\\\^`{}|\"<>.]",
                1 => "[é€\u{1f600}\u{202e}]",
            ],
            5..20,
        ),
    )
        .prop_map(|(head, rest)| {
            let mut s = head;
            s.extend(rest);
            s
        })
}

fn scheme() -> impl Strategy<Value = &'static str> {
    prop_oneof![
        Just("redis"),
        Just("rediss"),
        Just("unix"),
        Just("redis+unix"),
        Just("REDIS")
    ]
}

fn host() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("127.0.0.1".to_string()),
        Just("localhost".to_string()),
        Just("[::1]".to_string()),
        "[a-z]{1,8}(\\.[a-z]{1,5}){0,2}",
        Just(String::new()),
    ]
}

fn port() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        (0u32..70000).prop_map(|p| format!(":{p}")),
        Just(":".into())
    ]
}

fn tail() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("/".to_string()),
        (0u32..20).prop_map(|d| format!("/{d}")),
        Just("/tmp/redis.sock".to_string()),
        "/[a-z]{1,6}",
    ]
}

fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The URL shapes, each with the secret somewhere a password goes (or ends up when mistyped).
fn url_with_secret() -> impl Strategy<Value = (String, String)> {
    let userinfo = (
        scheme(),
        "[a-z]{0,6}",
        secret(),
        any::<bool>(),
        host(),
        port(),
        tail(),
    )
        .prop_map(|(scheme, user, secret, encoded, host, port, tail)| {
            let pw = if encoded {
                encode(&secret)
            } else {
                secret.clone()
            };
            (format!("{scheme}://{user}:{pw}@{host}{port}{tail}"), secret)
        });
    // A ':' would make it a user name and a password, and user names are shown.
    let lone_user = (
        scheme(),
        secret().prop_map(|s| s.replace(':', "")),
        any::<bool>(),
        host(),
        port(),
        tail(),
    )
        .prop_map(|(scheme, secret, encoded, host, port, tail)| {
            let pw = if encoded {
                encode(&secret)
            } else {
                secret.clone()
            };
            (format!("{scheme}://{pw}@{host}{port}{tail}"), secret)
        });
    let query = (
        scheme(),
        host(),
        port(),
        tail(),
        prop_oneof![
            Just("pass"),
            Just("password"),
            Just("PASSWORD"),
            Just("Pass"),
            Just("pa%73s")
        ],
        secret(),
        any::<bool>(),
        prop_oneof![
            Just(""),
            Just("db=2&"),
            Just("user=bob&"),
            Just("protocol=3&")
        ],
        prop_oneof![Just(""), Just("&db=1"), Just("&user=alice"), Just("&x=y")],
    )
        .prop_map(
            |(scheme, host, port, tail, key, secret, encoded, before, after)| {
                let pw = if encoded {
                    encode(&secret)
                } else {
                    secret.clone()
                };
                (
                    format!("{scheme}://{host}{port}{tail}?{before}{key}={pw}{after}"),
                    secret,
                )
            },
        );
    // Anything around a `:SECRET@`, the one place a password goes whatever surrounds it.
    let garbage = (
        "[a-z+:/@\\[\\]#?]{0,12}",
        secret(),
        "[a-z0-9:/@#?&=.]{0,12}",
    )
        .prop_map(|(before, secret, after)| (format!("{before}:{secret}@{after}"), secret));
    prop_oneof![userinfo, lone_user, query, garbage]
}

/// Fails when any stretch of six characters of the secret that holds an upper-case letter shows up
/// in `shown`, as it is or percent-decoded.
fn assert_hidden(shown: &str, secret: &str, url: &str) -> Result<(), TestCaseError> {
    let decoded = decode(shown);
    let chars: Vec<char> = secret.chars().collect();
    for w in chars.windows(6) {
        if !w.iter().any(char::is_ascii_uppercase) {
            continue;
        }
        let piece: String = w.iter().collect();
        prop_assert!(
            !shown.contains(&piece) && !decoded.contains(&piece),
            "{url:?} shown as {shown:?} leaks {piece:?}"
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]

    #[test]
    fn redaction_never_shows_a_password((url, secret) in url_with_secret()) {
        assert_hidden(&redact(&url), &secret, &url)?;
        match check_url(&url) {
            Ok(spec) => {
                assert_hidden(&spec.display, &secret, &url)?;
                assert_hidden(&format!("{spec:?}"), &secret, &url)?;
                prop_assert_eq!(&spec.url, &url);
            }
            Err(e) => {
                let m = usage_text(e);
                prop_assert!(m.starts_with("invalid --redis"), "{}", m);
                assert_hidden(&m, &secret, &url)?;
            }
        }
    }

    #[test]
    fn any_string_as_a_url_is_checked_without_panic(url in any::<String>()) {
        let shown = redact(&url);
        prop_assert!(!shown.is_empty());
        if let Err(e) = check_url(&url) {
            prop_assert!(usage_text(e).starts_with("invalid --redis"));
        }
    }

    #[test]
    fn harmless_urls_are_shown_whole(
        host in "[a-z]{1,8}(\\.[a-z]{1,5}){0,2}",
        port in 1u16..,
        db in 0u8..16,
        tls in any::<bool>(),
        user in "[a-z]{1,8}",
    ) {
        let scheme = if tls { "rediss" } else { "redis" };
        let url = format!("{scheme}://{host}:{port}/{db}");
        prop_assert_eq!(redact(&url), url.clone());
        let spec = check_url(&url).unwrap();
        prop_assert_eq!(spec.tls, tls);
        // A user name that comes with a password is shown; the password is not.
        let with_pw = format!("{scheme}://{user}:SECRETPW@{host}:{port}/{db}");
        prop_assert_eq!(redact(&with_pw), format!("{scheme}://{user}:***@{host}:{port}/{db}"));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn command_lines_keep_no_password(
        // A URL is found by its `://`, and ends at a blank, quote or comma.
        (url, secret) in url_with_secret().prop_filter("not a URL on a command line", |(u, s)| {
            !s.chars().any(|c| c.is_whitespace() || matches!(c, '\'' | '"' | '`' | ','))
                && u.split(s.as_str()).next().is_some_and(|head| head.contains("://"))
                && !u.split(s.as_str()).next().is_some_and(|head| head.contains(|c: char| c.is_whitespace() || matches!(c, '\'' | '"' | '`' | ',')))
        }),
        before in "[a-zA-Z0-9 =/_.-]{0,20}",
        quote in prop_oneof![Just(""), Just("'"), Just("\""), Just("LOCKCTL_REDIS="), Just("x,")],
        after in "[a-zA-Z0-9 =/_.-]{0,20}",
    ) {
        let line = format!("{before} -r {quote}{url}{quote} {after}");
        assert_hidden(&lockctl::config::redact_urls(&line), &secret, &line)?;
    }

    #[test]
    fn command_lines_without_urls_are_unchanged(line in "[^:]*|.*:[^/].*") {
        prop_assume!(!line.contains("://"));
        prop_assert_eq!(lockctl::config::redact_urls(&line), line);
    }
}

#[test]
fn redaction_examples() {
    let cases = [
        (
            "redis://user:s3cret@localhost:6379/2",
            "redis://user:***@localhost:6379/2",
        ),
        ("redis://:s3cret@127.0.0.1", "redis://:***@127.0.0.1"),
        ("redis://s3cret@127.0.0.1", "redis://***@127.0.0.1"),
        ("redis://u:p@ss:w@rd@h:1/0", "redis://u:***@h:1/0"),
        ("redis://u:12/S3CRET@h:1/0", "redis://…"),
        ("redis://h:1/S3CRET", "redis://h:1/***"),
        (
            "redis://h/0?password=S3CRET&db=1",
            "redis://h/0?password=***&db=1",
        ),
        (
            "redis://h/0?password=AB&CDEFGH",
            "redis://h/0?password=***&***",
        ),
        (
            "unix:///tmp/r.sock?pass=S3CRET&user=bob&db=3",
            "unix:///tmp/r.sock?pass=***&user=bob&db=3",
        ),
        ("redis:u:S3CRET@h", "'…' (not a URL)"),
        ("redis://u:S3CRET@[bad", "redis://…"),
        ("redis://h:1/#S3CRET", "redis://h:1/#***"),
    ];
    for (url, want) in cases {
        assert_eq!(redact(url), want, "{url}");
    }
}

#[test]
fn insecure_tls_and_odd_unix_urls_are_refused() {
    let m = usage_text(check_url("rediss://127.0.0.1:6380#insecure").unwrap_err());
    assert!(m.contains("--tls-ca"), "{m}");
    let m = usage_text(check_url("unix://u:S3CRET@host/tmp/x.sock").unwrap_err());
    assert!(!m.contains("S3CRET"), "{m}");
    assert!(check_url("unix:///tmp/x.sock?pass=S3CRET").is_ok());
    assert!(check_url("redis+unix:///tmp/x.sock").is_ok());
}

// ---------------------------------------------------------------------------------------------
// Tokens

#[test]
fn ten_thousand_tokens_are_unique_lowercase_hex() {
    let mut seen = std::collections::HashSet::new();
    for _ in 0..10_000 {
        let t = lockctl::lock::new_token();
        assert_eq!(t.len(), 32, "{t}");
        assert!(
            t.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')),
            "{t}"
        );
        assert!(seen.insert(t.clone()), "duplicate token {t}");
    }
    // 128 random bits: every hex digit shows up in every position across 10k tokens.
    for pos in 0..32 {
        let digits: std::collections::HashSet<u8> =
            seen.iter().map(|t| t.as_bytes()[pos]).collect();
        assert_eq!(digits.len(), 16, "position {pos} is not uniformly random");
    }
}

// ---------------------------------------------------------------------------------------------
// Through the real binary: every bad value is exit 2, names the option, and writes nothing.

/// One bad invocation: exit 2, no panic, the message mentions `needle`, nothing in Redis.
fn refused(server: &Server, args: &[&str], needle: &str) -> Result<(), TestCaseError> {
    refused_cmd(server, lockctl_on(server).args(args), needle)
}

fn refused_cmd(server: &Server, cmd: &mut Command, needle: &str) -> Result<(), TestCaseError> {
    let o = run(cmd);
    let args: Vec<_> = cmd.get_args().collect();
    let err = stderr(&o);
    prop_assert_eq!(code(&o), 2, "{:?}: {}", args, err);
    prop_assert!(!err.contains("panicked"), "{:?}: {}", args, err);
    prop_assert!(
        err.contains(needle),
        "{:?} does not mention {:?}: {}",
        args,
        needle,
        err
    );
    prop_assert!(stdout(&o).is_empty(), "{:?} printed {:?}", args, stdout(&o));
    let keys = server.keys();
    prop_assert!(keys.is_empty(), "{:?} left keys {:?}", args, keys);
    Ok(())
}

/// A value clap would not take for a flag (leading `-` is fine after `=`).
fn junk() -> impl Strategy<Value = String> {
    prop_oneof![
        "[^\u{0}]{1,12}",
        "-?[0-9]{1,30}(\\.[0-9]+)?[a-z]{0,3}",
        "(abc|nan|inf|-1|0|1e9|300|256|-0|0x1|  |\u{1f600}|1 2)",
    ]
}

fn bad_duration(positive: bool) -> impl Strategy<Value = String> {
    junk().prop_filter("a valid duration", move |s| {
        if positive {
            parse_positive_duration(s).is_err()
        } else {
            parse_duration_or_zero(s).is_err()
        }
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn bad_flag_values_are_usage_errors(
        format in junk().prop_filter("valid", |s| !matches!(s.as_str(), "plain" | "env" | "json")),
        // clap reads -E as an integer in 0..=255, so "+5" and "-0" are valid.
        exit_code in junk().prop_filter("valid", |s| s.parse::<i64>().map_or(true, |n| !(0..=255).contains(&n))),
        ttl in bad_duration(true),
        wait in bad_duration(false),
        node_timeout in bad_duration(true),
        drift in junk().prop_filter("valid", |s| parse_drift_factor(s).is_err()),
        ctrl in "[a-z]{0,3}[\u{1}-\u{1f}\u{7f}\u{85}][a-z]{0,3}",
    ) {
        let server = Server::start();
        refused(&server, &["acquire", "p", &format!("--format={format}")], "--format")?;
        refused(&server, &["acquire", "p", &format!("-E{exit_code}"), "-n"], "--conflict-exit-code")?;
        refused(&server, &["acquire", "p", &format!("--ttl={ttl}")], "--ttl")?;
        refused(&server, &["exec", "p", &format!("--ttl={ttl}"), "--", "true"], "--ttl")?;
        refused(&server, &["renew", "p", "--token", "x", &format!("--ttl={ttl}")], "--ttl")?;
        refused(&server, &["acquire", "p", &format!("-w{wait}")], "--wait")?;
        refused(&server, &["exec", "p", &format!("--kill-after={wait}"), "-c", "true"], "--kill-after")?;
        refused(&server, &[&format!("--node-timeout={node_timeout}"), "acquire", "p"], "--node-timeout")?;
        refused(&server, &[&format!("--drift-factor={drift}"), "acquire", "p"], "--drift-factor")?;
        refused(&server, &[&format!("--quarantine={wait}"), "acquire", "p"], "--quarantine")?;
        refused(&server, &["status", "p", &format!("--format={format}")], "--format")?;
        refused(&server, &["completions", &format], "<SHELL>")?;
        // The same values from the environment are named by their option too.
        refused_cmd(&server, lockctl_on(&server).env("LOCKCTL_NODE_TIMEOUT", &node_timeout).args(["acquire", "p"]), "--node-timeout")?;
        refused_cmd(&server, lockctl_on(&server).env("LOCKCTL_QUARANTINE", &wait).args(["acquire", "p"]), "--quarantine")?;
        // Control characters: reserved for auxiliary keys, never in a prefix, name or token.
        refused(&server, &[&format!("--prefix={ctrl}"), "acquire", "p"], "--prefix")?;
        refused_cmd(&server, lockctl_on(&server).env("LOCKCTL_PREFIX", &ctrl).args(["acquire", "p"]), "--prefix")?;
        refused(&server, &["release", "p", &format!("--token={ctrl}")], "--token")?;
        refused_cmd(&server, lockctl_on(&server).env("LOCKCTL_TOKEN", &ctrl).args(["renew", "p"]), "--token")?;
    }

    #[test]
    fn bad_names_are_usage_errors(name in prop_oneof![
        Just(String::new()),
        "[a-z]{0,4}[\u{1}-\u{1f}\u{7f}\u{80}-\u{9f}][a-z]{0,4}",
        "[a-z]{513,600}",
        "[é]{257,300}",
    ]) {
        let server = Server::start();
        for cmd in ["acquire", "status"] {
            refused(&server, &[cmd, "--", &name], "NAME")?;
        }
        refused(&server, &["release", "--token", "abc", "--", &name], "NAME")?;
        refused(&server, &["renew", "--token", "abc", "--", &name], "NAME")?;
        refused(&server, &["exec", "-n", "-c", "true", "--", &name], "NAME")?;
        refused(&server, &["break", "--yes", "--", &name], "NAME")?;
    }

    #[test]
    fn bad_urls_are_usage_errors_without_the_password(pw in secret()) {
        let server = Server::start();
        let enc = encode(&pw);
        for url in [
            format!("redis:u:{enc}@127.0.0.1"),
            format!("ftp://u:{enc}@127.0.0.1"),
            format!("redis://u:{enc}@"),
            format!("rediss://u:{enc}@127.0.0.1#insecure"),
            format!("unix://u:{enc}@localhost/tmp/x.sock"),
            format!("redis://u:{enc}@127.0.0.1/notadb"),
            format!("redis://u:{enc}@127.0.0.1/0?protocol=9"),
        ] {
            let o = run(lockctl().env("LOCKCTL_REDIS", &url).args(["-v", "acquire", "p", "-n"]));
            let all = format!("{}{}", stdout(&o), stderr(&o));
            prop_assert_eq!(code(&o), 2, "{}: {}", url, all);
            prop_assert!(all.contains("--redis"), "{}: {}", url, all);
            assert_hidden(&all, &pw, &url)?;
        }
        prop_assert!(server.keys().is_empty());
    }
}

#[test]
fn invalid_utf8_names_are_usage_errors() {
    use std::os::unix::ffi::OsStrExt;
    let server = Server::start();
    let name = std::ffi::OsStr::from_bytes(b"caf\xe9");
    let o = run(lockctl_on(&server).arg("acquire").arg(name));
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("UTF-8") || stderr(&o).contains("utf-8"),
        "{}",
        stderr(&o)
    );
    assert!(server.keys().is_empty());
}

#[test]
fn valid_extremes_are_accepted() {
    let server = Server::start();
    let long = "x".repeat(MAX_NAME_BYTES);
    let o = run(lockctl_on(&server).args(["acquire", &long, "-n", "--ttl", "60s", "-E", "255"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = run(lockctl_on(&server).args(["acquire", "z", "-w", "0", "--ttl", "1.5"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = run(lockctl_on(&server).args(["acquire", "y", "-w", "0", "--ttl", "60", "-E", "0"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = run(lockctl_on(&server).args(["acquire", "y", "-w", "0", "-E", "0"]));
    assert_eq!(code(&o), 0, "-E 0 replaces the busy code: {}", stderr(&o));
    let o = run(lockctl_on(&server).args(["acquire", "y", "-w", "0", "-E", "255"]));
    assert_eq!(code(&o), 255, "{}", stderr(&o));
}

#[test]
fn list_patterns_never_reach_outside_the_prefix() {
    use proptest::test_runner::{Config, TestRunner};
    let server = Server::start();
    let ours = ["job", "{app}:job", "a-b", "x*y"];
    for name in ours {
        acquire_json(&mut lockctl_on(&server), name, &["-n", "--ttl", "10m"]);
    }
    acquire_json(
        lockctl_on(&server).args(["--prefix", "other:"]),
        "job",
        &["-n"],
    );
    for k in [
        "lockctlx",
        "lockctl",
        "{lockctl:job}",
        "LOCKCTL:job",
        "lockctl\\:job",
    ] {
        let () = server.cmd(&["SET", k, "0123456789abcdef0123456789abcdef"]);
    }
    let () = server.cmd(&["HSET", "lockctl:a-hash", "f", "v"]);
    let before = server.keys();
    let mut runner = TestRunner::new(Config {
        cases: 64,
        failure_persistence: None,
        ..Config::default()
    });
    let pattern = prop_oneof![
        "[a-z*?\\[\\]\\\\^{}:\\-!]{1,8}",
        any::<String>().prop_filter("no NUL", |s| !s.contains('\0')),
    ];
    let tried = std::cell::Cell::new(0);
    runner
        .run(&pattern, |pattern| {
            tried.set(tried.get() + 1);
            let o = run(lockctl_on(&server).args(["list", "--format", "json", "--", &pattern]));
            let err = stderr(&o);
            prop_assert!(!err.contains("panicked"), "{pattern:?}: {err}");
            match code(&o) {
                0 => {
                    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
                    for lock in v["locks"].as_array().unwrap() {
                        let name = lock["name"].as_str().unwrap();
                        prop_assert!(ours.contains(&name), "{pattern:?} listed {name:?}");
                    }
                }
                2 => prop_assert!(err.contains("PATTERN"), "{pattern:?}: {err}"),
                other => prop_assert!(false, "{pattern:?}: exit {other}: {err}"),
            }
            prop_assert_eq!(server.keys(), before.clone());
            Ok(())
        })
        .unwrap();
    assert_eq!(tried.get(), 64);
    // And the plain cases, exactly.
    let o = run(lockctl_on(&server).args(["list", "*", "--format", "json"]));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let mut names: Vec<&str> = v["locks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["name"].as_str().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["a-b", "job", "x*y", "{app}:job"]);
}

#[test]
fn the_same_server_twice_is_not_redlock() {
    let s = Server::start_tcp();
    let port = s.port.unwrap();
    let sock = s.socket().display().to_string();
    for pair in [
        [
            format!("redis://127.0.0.1:{port}"),
            format!("redis://127.0.0.1:{port}/3"),
        ],
        [
            format!("redis://127.0.0.1:{port}"),
            format!("redis://u:S3CRETPW@127.0.0.1:{port}"),
        ],
        [
            format!("unix://{sock}"),
            format!("redis+unix://{sock}?db=1"),
        ],
    ] {
        let third = Server::start();
        let o = run(lockctl()
            .args(["-r", &pair[0], "-r", &pair[1], "-r", &third.url()])
            .args(["acquire", "x", "-n"]));
        assert_eq!(code(&o), 2, "{pair:?}: {}", stderr(&o));
        assert!(stderr(&o).contains("same server"), "{}", stderr(&o));
        assert!(!stderr(&o).contains("S3CRETPW"), "{}", stderr(&o));
        assert!(s.keys().is_empty() && third.keys().is_empty());
    }
}

/// Random command lines from lockctl's own vocabulary: whatever the combination, no panic, no hang,
/// and a usage error (exit 2) leaves Redis as it was.
#[test]
fn random_command_lines_never_panic() {
    use proptest::test_runner::{Config, TestRunner};
    let server = Server::start();
    let url = server.url();
    let words: Vec<String> = [
        "acquire",
        "release",
        "renew",
        "exec",
        "status",
        "list",
        "break",
        "doctor",
        "completions",
        "-n",
        "-w",
        "0",
        "1s",
        "--ttl",
        "30s",
        "5ms",
        "-E",
        "7",
        "300",
        "--format",
        "json",
        "env",
        "plain",
        "-q",
        "-v",
        "--token",
        "abc",
        "-c",
        "true",
        "--",
        "--prefix",
        "x:",
        "-r",
        "--node-timeout",
        "100ms",
        "--drift-factor",
        "0.01",
        "--quarantine",
        "--kill-after",
        "--yes",
        "-y",
        "p",
        "*",
        "",
        "\u{1f}",
        "bash",
        "-x",
        "--version",
        "nan",
        "-1",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([url.clone()])
    .collect();
    let mut runner = TestRunner::new(Config {
        cases: 300,
        failure_persistence: None,
        ..Config::default()
    });
    let subcommands = [
        "acquire", "release", "renew", "exec", "status", "list", "break", "doctor",
    ];
    // Options with their values, valid and not.
    let options: Vec<Vec<&str>> = [
        &["-w", "0"][..],
        &["-w", "1s"],
        &["-n"],
        &["--ttl", "30s"],
        &["--ttl", "5ms"],
        &["-E", "7"],
        &["-E", "300"],
        &["--format", "json"],
        &["--format", "env"],
        &["--format", "yaml"],
        &["--token", "abc"],
        &["-c", "true"],
        &["-c", "exit 3"],
        &["--", "true"],
        &["-q"],
        &["-v"],
        &["--yes"],
        &["--prefix", "x:"],
        &["--prefix", "\u{1f}"],
        &["--kill-after", "1s"],
        &["--node-timeout", "100ms"],
        &["--drift-factor", "0.6"],
        &["--quarantine", "0"],
        &["*"],
        &["p"],
    ]
    .iter()
    .map(|o| o.to_vec())
    .collect();
    // Mostly well-formed (a subcommand and a name first), sometimes anything at all.
    let line = prop_oneof![
        3 => (
            proptest::sample::select(subcommands.to_vec()),
            proptest::collection::vec(proptest::sample::select(options.clone()), 0..5),
        )
            .prop_map(|(sub, rest)| {
                let mut v = vec![sub.to_string(), "p".to_string()];
                v.extend(rest.into_iter().flatten().map(str::to_string));
                v
            }),
        1 => proptest::collection::vec(proptest::sample::select(words), 0..9),
    ];
    runner
        .run(&line, |args| {
            let () = server.cmd(&["FLUSHALL"]);
            let o = run(lockctl_on(&server).args(&args));
            let err = stderr(&o);
            let status = code(&o);
            prop_assert!(
                status != 101 && !err.contains("panicked"),
                "{args:?}: {err}"
            );
            if status == 2 {
                prop_assert!(
                    server.keys().is_empty(),
                    "{args:?} left {:?}",
                    server.keys()
                );
            }
            Ok(())
        })
        .unwrap();
}
