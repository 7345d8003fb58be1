//! A throwaway PKI made with `openssl` and a redis-server speaking TLS with it, for the tests that
//! check verification for real (rustls against the CA and the subjectAltName). They fail, never
//! skip, when `openssl` is missing.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::{free_port, Server};

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "openssl is required by the TLS tests and could not be run ({e}); \
                 install it (apt-get install openssl) or run ./scripts/test, which does"
            )
        });
    assert!(
        out.status.success(),
        "openssl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA, a server certificate and a client certificate, in PEM files.
pub struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    /// A CA named `ca`, a server certificate with `server_san`, a client certificate, and a second,
    /// unrelated CA (`other-ca`).
    pub fn new(server_san: &str) -> Pki {
        let dir = tempfile::Builder::new()
            .prefix("lockctl-pki-")
            .tempdir()
            .unwrap();
        let d = dir.path();
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        for ca in ["ca", "other-ca"] {
            let (key, crt, subj) = (
                format!("{ca}.key"),
                format!("{ca}.crt"),
                format!("/CN=lockctl test {ca}"),
            );
            let mut args = vec![
                "req", "-x509", "-days", "2", "-subj", &subj, "-keyout", &key, "-out", &crt,
            ];
            args.extend(ec);
            args.extend([
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
            ]);
            openssl(d, &args);
        }
        let server_ext = format!(
            "subjectAltName={server_san}\nbasicConstraints=CA:FALSE\n\
             keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
        );
        std::fs::write(d.join("server.ext"), server_ext).unwrap();
        std::fs::write(
            d.join("client.ext"),
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n",
        )
        .unwrap();
        // The server's common name is 127.0.0.1 on purpose: only the SAN may count.
        for (who, cn) in [
            ("server", "/CN=127.0.0.1"),
            ("client", "/CN=lockctl client"),
        ] {
            let (key, csr, crt, ext) = (
                format!("{who}.key"),
                format!("{who}.csr"),
                format!("{who}.crt"),
                format!("{who}.ext"),
            );
            let mut args = vec!["req", "-new", "-subj", cn, "-keyout", &key, "-out", &csr];
            args.extend(ec);
            openssl(d, &args);
            openssl(
                d,
                &[
                    "x509",
                    "-req",
                    "-in",
                    &csr,
                    "-CA",
                    "ca.crt",
                    "-CAkey",
                    "ca.key",
                    "-CAcreateserial",
                    "-days",
                    "2",
                    "-out",
                    &crt,
                    "-extfile",
                    &ext,
                ],
            );
        }
        Pki { dir }
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    pub fn arg(&self, file: &str) -> String {
        self.path(file).display().to_string()
    }
}

/// A redis-server speaking TLS only on a loopback port (its unix socket, which the harness uses to
/// inspect keys, stays plain).
pub struct TlsServer {
    pub server: Server,
    pub port: u16,
}

impl TlsServer {
    pub fn start(pki: &Pki, client_certs: bool) -> TlsServer {
        let port = free_port();
        let server = Server::with_args(&[
            "--tls-port",
            &port.to_string(),
            "--tls-cert-file",
            &pki.arg("server.crt"),
            "--tls-key-file",
            &pki.arg("server.key"),
            "--tls-ca-cert-file",
            &pki.arg("ca.crt"),
            "--tls-auth-clients",
            if client_certs { "yes" } else { "no" },
        ]);
        TlsServer { server, port }
    }

    pub fn url(&self, host: &str) -> String {
        format!("rediss://{host}:{}", self.port)
    }
}

/// A server speaking TLS on a loopback port with a throwaway CA (its unix socket, for the test's own
/// reads, stays plain), and the CA, which must outlive it.
pub fn tls_server() -> (TlsServer, Pki) {
    let pki = Pki::new("IP:127.0.0.1");
    // Never restarted: the quarantine is off for this server the test started itself.
    (TlsServer::start(&pki, false), pki)
}

/// A lockctl for `tls` with the CA in `pki`.
pub fn lockctl_tls(tls: &TlsServer, pki: &Pki) -> Command {
    let mut c = super::lockctl();
    c.env("LOCKCTL_REDIS", tls.url("127.0.0.1"))
        .env("LOCKCTL_TLS_CA", pki.path("ca.crt"));
    c
}
