//! A loopback TCP proxy in front of a real server that records the round trips lockctl makes.
//!
//! A round trip is what the client sends between two answers of the server: one write of several
//! commands (a pipeline) is one round trip, a command sent only after the reply to another is a
//! second. The server cannot tell them apart (`INFO commandstats` counts commands), so "one round
//! trip per node per operation" is checked here, on the wire. Each connection's client bytes are
//! parsed as RESP (clients send arrays of bulk strings) and grouped into turns: a new turn starts
//! with the first client byte after the server last spoke.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// One connection's turns, each the commands of one round trip, as `NAME arg1` (first argument
/// only, upper-cased name).
pub type Turns = Vec<Vec<String>>;

pub struct Proxy {
    pub port: u16,
    conns: Arc<Mutex<Vec<Arc<Mutex<Turns>>>>>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards every connection to `127.0.0.1:upstream`.
    pub fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let conns: Arc<Mutex<Vec<Arc<Mutex<Turns>>>>> = Arc::default();
        let all = Arc::clone(&conns);
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    continue;
                };
                let turns = Arc::new(Mutex::new(Turns::new()));
                all.lock().unwrap().push(Arc::clone(&turns));
                relay(client, server, turns);
            }
        });
        Proxy { port, conns }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Every connection's turns so far.
    pub fn turns(&self) -> Vec<Turns> {
        self.conns
            .lock()
            .unwrap()
            .iter()
            .map(|t| t.lock().unwrap().clone())
            .collect()
    }
}

fn relay(client: TcpStream, server: TcpStream, turns: Arc<Mutex<Turns>>) {
    let spoke = Arc::new(AtomicBool::new(true));
    let (mut c_in, mut s_out) = (client.try_clone().unwrap(), server.try_clone().unwrap());
    let spoke_up = Arc::clone(&spoke);
    std::thread::spawn(move || {
        let mut buf = [0u8; 16384];
        let mut pending = Vec::new();
        loop {
            let n = match c_in.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            {
                let mut t = turns.lock().unwrap();
                if spoke_up.swap(false, Ordering::SeqCst) {
                    t.push(Vec::new());
                }
                pending.extend_from_slice(&buf[..n]);
                while let Some((cmd, used)) = parse_command(&pending) {
                    t.last_mut().unwrap().push(cmd);
                    pending.drain(..used);
                }
            }
            if s_out.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = s_out.shutdown(Shutdown::Write);
    });
    let (mut s_in, mut c_out) = (server, client);
    std::thread::spawn(move || {
        let mut buf = [0u8; 16384];
        loop {
            let n = match s_in.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            // Set before the bytes go on, so that the client's answer to them opens a new turn.
            spoke.store(true, Ordering::SeqCst);
            if c_out.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = c_out.shutdown(Shutdown::Write);
    });
}

/// One complete RESP command at the start of `b`: `NAME arg1` and the bytes it took.
fn parse_command(b: &[u8]) -> Option<(String, usize)> {
    fn line(b: &[u8], at: usize) -> Option<(&[u8], usize)> {
        let end = b[at..].windows(2).position(|w| w == b"\r\n")? + at;
        Some((&b[at..end], end + 2))
    }
    let (head, mut at) = line(b, 0)?;
    assert_eq!(head.first(), Some(&b'*'), "not a RESP array: {head:?}");
    let n: usize = std::str::from_utf8(&head[1..]).unwrap().parse().unwrap();
    let mut words: Vec<String> = Vec::new();
    for _ in 0..n {
        let (len, next) = line(b, at)?;
        let len: usize = std::str::from_utf8(&len[1..]).unwrap().parse().unwrap();
        if b.len() < next + len + 2 {
            return None;
        }
        if words.len() < 2 {
            // A script's source (EVAL) is long: its first line names it well enough.
            let word = String::from_utf8_lossy(&b[next..next + len]);
            words.push(word.lines().next().unwrap_or("").chars().take(60).collect());
        }
        at = next + len + 2;
    }
    words[0].make_ascii_uppercase();
    Some((words.join(" "), at))
}

/// Copies `from` to `to` on a thread of its own until `from` ends, then passes the end on to `to`.
pub fn one_way(mut from: TcpStream, mut to: TcpStream) {
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut from, &mut to);
        let _ = to.shutdown(Shutdown::Write);
    });
}

/// Relays `client` and `server` both ways, a thread each way, passing each side's end of stream on
/// to the other: a connection without faults.
pub fn pass_through(client: TcpStream, server: TcpStream) {
    one_way(client.try_clone().unwrap(), server.try_clone().unwrap());
    one_way(server, client);
}

/// Whether `seen`, a client's bytes so far, hold a script command (`EVAL`, `EVALSHA`).
pub fn holds_a_script(seen: &[u8]) -> bool {
    seen.windows(10).any(|w| w == b"$4\r\nEVAL\r\n")
        || seen.windows(13).any(|w| w == b"$7\r\nEVALSHA\r\n")
}

/// Relays `client` to `server` and, once a script (`EVAL`, `EVALSHA`) has gone by, cuts both at
/// the server's next bytes: the script runs, its reply is lost with the connection. `before` runs
/// once, when the script has come and before it goes on to the server; `cut` when the cut is made.
pub fn cut_the_scripts_reply(
    client: TcpStream,
    server: TcpStream,
    before: impl FnOnce() + Send + 'static,
    cut: impl FnOnce() + Send + 'static,
) {
    let armed = Arc::new(AtomicBool::new(false));
    let (mut c_in, mut s_out) = (client.try_clone().unwrap(), server.try_clone().unwrap());
    let arm = Arc::clone(&armed);
    std::thread::spawn(move || {
        let mut before = Some(before);
        let mut seen = Vec::new();
        let mut buf = [0u8; 16384];
        while let Ok(n @ 1..) = c_in.read(&mut buf) {
            seen.extend_from_slice(&buf[..n]);
            if holds_a_script(&seen) {
                // Set before the script reaches the server, hence before its reply can come.
                arm.store(true, Ordering::SeqCst);
                if let Some(before) = before.take() {
                    before();
                }
            }
            if s_out.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = s_out.shutdown(Shutdown::Write);
    });
    std::thread::spawn(move || {
        let (mut s_in, mut c_out) = (server, client);
        let mut buf = [0u8; 16384];
        while let Ok(n @ 1..) = s_in.read(&mut buf) {
            if armed.load(Ordering::SeqCst) {
                cut();
                let _ = c_out.shutdown(Shutdown::Both);
                let _ = s_in.shutdown(Shutdown::Both);
                return;
            }
            if c_out.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = c_out.shutdown(Shutdown::Write);
    });
}

/// A loopback address that can be moved from one server to another, as a virtual IP or a DNS name
/// is: new connections go to the server it points at now (none: they are closed at once), and a
/// move cuts every connection made before it.
pub struct Switch {
    pub port: u16,
    to: Arc<Mutex<Option<u16>>>,
    open: Arc<Mutex<Vec<TcpStream>>>,
}

impl Switch {
    pub fn start(upstream: u16) -> Switch {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let to = Arc::new(Mutex::new(Some(upstream)));
        let open: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (target, conns) = (Arc::clone(&to), Arc::clone(&open));
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                // Held while connecting, so that a move waits for a connection under way.
                let target = target.lock().unwrap();
                let Some(server) = target.and_then(|p| TcpStream::connect(("127.0.0.1", p)).ok())
                else {
                    continue;
                };
                let mut conns = conns.lock().unwrap();
                conns.push(client.try_clone().unwrap());
                conns.push(server.try_clone().unwrap());
                pass_through(client, server);
            }
        });
        Switch { port, to, open }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Points the address at `upstream` (`None`: at nothing) and cuts every connection made so far.
    pub fn point_at(&self, upstream: Option<u16>) {
        let mut to = self.to.lock().unwrap();
        *to = upstream;
        for c in self.open.lock().unwrap().drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
    }
}

/// One connection through a [`Holding`] proxy: both of its sockets and the client bytes held back
/// from the server so far.
pub struct Held {
    pub server: TcpStream,
    pub client: TcpStream,
    pub held: Vec<u8>,
}

/// What a [`Holding`] proxy does with the bytes a client just sent.
pub enum Verdict {
    /// On to the server.
    Pass,
    /// Kept back (appended to the connection's `held`), the connection left open.
    Hold,
    /// Kept back, and the client's connection cut: the client sees it dropped before any reply.
    HoldAndCut,
}

/// A loopback address in front of one server port whose client-to-server bytes can be kept back, as
/// a network path that delays a client's segments does, and delivered later to the server on their
/// own connection: the request then runs on the server long after the client gave up on it. Each
/// read of a client's bytes goes to `decide`, with the connection's state; the server's bytes
/// always go on to the client (and are read on when the client is gone, so that the server never
/// blocks). [`Holding::refuse`] closes new connections and cuts the open ones.
pub struct Holding {
    pub port: u16,
    refusing: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<Arc<Mutex<Held>>>>>,
}

impl Holding {
    pub fn start(upstream: u16, decide: impl Fn(&Held) -> Verdict + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let refusing = Arc::new(AtomicBool::new(false));
        let conns: Arc<Mutex<Vec<Arc<Mutex<Held>>>>> = Arc::default();
        let (refused, all, decide) = (Arc::clone(&refusing), Arc::clone(&conns), Arc::new(decide));
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                if refused.load(Ordering::SeqCst) {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                };
                let conn = Arc::new(Mutex::new(Held {
                    server: server.try_clone().unwrap(),
                    client: client.try_clone().unwrap(),
                    held: Vec::new(),
                }));
                all.lock().unwrap().push(Arc::clone(&conn));
                let (mut c_in, decide) = (client.try_clone().unwrap(), Arc::clone(&decide));
                std::thread::spawn(move || {
                    let mut buf = [0u8; 65536];
                    while let Ok(n @ 1..) = c_in.read(&mut buf) {
                        let mut c = conn.lock().unwrap();
                        match decide(&c) {
                            Verdict::Pass => {
                                if c.server.write_all(&buf[..n]).is_err() {
                                    break;
                                }
                            }
                            Verdict::Hold => c.held.extend_from_slice(&buf[..n]),
                            Verdict::HoldAndCut => {
                                c.held.extend_from_slice(&buf[..n]);
                                let _ = c_in.shutdown(Shutdown::Both);
                                break;
                            }
                        }
                    }
                    // The client's end is not passed on: held bytes still go out on a delivery.
                });
                let (mut s_in, mut c_out) = (server, client);
                std::thread::spawn(move || {
                    let mut buf = [0u8; 65536];
                    while let Ok(n @ 1..) = s_in.read(&mut buf) {
                        // The client may be gone: keep reading so the server is never blocked.
                        let _ = c_out.write_all(&buf[..n]);
                    }
                    let _ = c_out.shutdown(Shutdown::Write);
                });
            }
        });
        Holding {
            port,
            refusing,
            conns,
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// New connections are closed at once from now on, open ones cut.
    pub fn refuse(&self) {
        self.refusing.store(true, Ordering::SeqCst);
        for c in self.conns.lock().unwrap().drain(..) {
            let c = c.lock().unwrap();
            let _ = c.client.shutdown(Shutdown::Both);
            let _ = c.server.shutdown(Shutdown::Both);
        }
    }

    /// New connections are let through again.
    pub fn admit(&self) {
        self.refusing.store(false, Ordering::SeqCst);
    }

    /// The connections so far (but those cut by [`Holding::refuse`]), oldest first.
    pub fn conns(&self) -> std::sync::MutexGuard<'_, Vec<Arc<Mutex<Held>>>> {
        self.conns.lock().unwrap()
    }
}
