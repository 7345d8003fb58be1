//! A loopback listener that stands in for a stopped server: it accepts connections (a stopped
//! server's kernel does) and keeps what lockctl sends on each, answering nothing. Once lockctl has
//! exited, a test plays the kept commands to a real server in the order it chooses, as the server
//! would at its resume.

use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{eventually, Server};

/// One RESP command: its arguments, the name first.
pub type Command = Vec<Vec<u8>>;

/// One connection's bytes so far, and whether the client closed it.
pub type Kept = Arc<Mutex<(Vec<u8>, bool)>>;

/// A listener that accepts and keeps what each connection sends, and never answers.
pub struct Stopped {
    pub port: u16,
    /// Per connection, in the order accepted.
    pub conns: Arc<Mutex<Vec<Kept>>>,
}

impl Stopped {
    pub fn start() -> Stopped {
        let (port, conns) = accept(|client, kept, _| keep(client, kept));
        Stopped { port, conns }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Every connection's complete commands, once the client closed them all.
    pub fn closed(&self) -> Vec<Vec<Command>> {
        all_closed(&self.conns)
    }

    /// How many connections were accepted so far: one a client made just before it exited may
    /// still wait in the listener's backlog when the client's exit is seen.
    pub fn accepted(&self) -> usize {
        self.conns.lock().unwrap().len()
    }

    /// As [`Stopped::closed`], and every connection's bytes must be whole commands: a client that
    /// exited on its own has cut none.
    pub fn closed_whole(&self) -> Vec<Vec<Command>> {
        let conns = all_closed(&self.conns);
        for c in self.conns.lock().unwrap().iter() {
            let bytes = &c.lock().unwrap().0;
            assert_eq!(parse(bytes).1, bytes.len(), "a cut command in {bytes:?}");
        }
        conns
    }
}

/// Accepts connections on a new loopback port and hands each to `each` with its [`Kept`] (already
/// listed, in the order accepted) and its index there. Returns the port and the list.
pub fn accept(
    each: impl Fn(TcpStream, Kept, usize) + Send + 'static,
) -> (u16, Arc<Mutex<Vec<Kept>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let conns: Arc<Mutex<Vec<Kept>>> = Arc::default();
    let all = Arc::clone(&conns);
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { return };
            let kept: Kept = Arc::new(Mutex::new((Vec::new(), false)));
            let i = {
                let mut all = all.lock().unwrap();
                all.push(Arc::clone(&kept));
                all.len() - 1
            };
            each(client, kept, i);
        }
    });
    (port, conns)
}

/// Keeps what `client` sends in `kept` on a thread of its own, answering nothing.
pub fn keep(mut client: TcpStream, kept: Kept) {
    std::thread::spawn(move || {
        let mut buf = [0u8; 16384];
        while let Ok(n @ 1..) = client.read(&mut buf) {
            kept.lock().unwrap().0.extend_from_slice(&buf[..n]);
        }
        kept.lock().unwrap().1 = true;
    });
}

/// The complete commands of every connection in `conns`, once the client closed them all.
pub fn all_closed(conns: &Arc<Mutex<Vec<Kept>>>) -> Vec<Vec<Command>> {
    assert!(
        eventually(Duration::from_secs(30), || conns
            .lock()
            .unwrap()
            .iter()
            .all(|c| c.lock().unwrap().1)),
        "lockctl left a connection open after it exited"
    );
    conns
        .lock()
        .unwrap()
        .iter()
        .map(|c| parse(&c.lock().unwrap().0).0)
        .collect()
}

/// The complete commands at the start of `buf` (arrays of bulk strings) and the bytes they take.
pub fn parse(buf: &[u8]) -> (Vec<Command>, usize) {
    fn line(buf: &[u8], at: usize) -> Option<(usize, usize)> {
        let end = buf[at..].windows(2).position(|w| w == b"\r\n")? + at;
        let n = std::str::from_utf8(&buf[at + 1..end])
            .unwrap()
            .parse()
            .unwrap();
        Some((n, end + 2))
    }
    let mut out = Vec::new();
    let mut at = 0;
    'commands: while at < buf.len() {
        assert_eq!(buf[at], b'*', "a RESP array");
        let Some((n, mut next)) = line(buf, at) else {
            break;
        };
        let mut cmd = Vec::with_capacity(n);
        for _ in 0..n {
            let Some((len, from)) = line(buf, next) else {
                break 'commands;
            };
            if buf.len() < from + len + 2 {
                break 'commands;
            }
            cmd.push(buf[from..from + len].to_vec());
            next = from + len + 2;
        }
        out.push(cmd);
        at = next;
    }
    (out, at)
}

/// The command's name, upper-cased.
pub fn name(cmd: &Command) -> String {
    String::from_utf8_lossy(&cmd[0]).to_uppercase()
}

/// Runs one command on `s` as it was sent.
pub fn play(s: &Server, cmd: &Command) -> redis::RedisResult<redis::Value> {
    let mut c = redis::cmd(&name(cmd));
    for a in &cmd[1..] {
        c.arg(&a[..]);
    }
    c.query(&mut s.conn())
}
