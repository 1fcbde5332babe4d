//! A TCP forwarder on 127.0.0.1 between the relay and PostgreSQL, with a switch that
//! stops traffic both ways without closing anything (a network partition, as far as
//! the applications can tell: bytes wait in kernel buffers and flow again after the
//! heal, FINs included), and one that closes every connection.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

pub struct Proxy {
    port: u16,
    state: Arc<State>,
}

#[derive(Default)]
struct State {
    blackholed: AtomicBool,
    stopped: AtomicBool,
    /// Where new connections go (existing ones stay where they are).
    upstream: AtomicU16,
    /// Both ends of every connection, for `close_all`.
    sockets: Mutex<Vec<TcpStream>>,
}

impl Proxy {
    /// Forwards a new local port to `upstream_port` on 127.0.0.1.
    pub fn start(upstream_port: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("proxy listener");
        let port = listener.local_addr().expect("proxy addr").port();
        let state = Arc::new(State::default());
        state.upstream.store(upstream_port, Ordering::Relaxed);
        let accept_state = Arc::clone(&state);
        thread::spawn(move || {
            for client in listener.incoming() {
                if accept_state.stopped.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(client) = client else { continue };
                let upstream = accept_state.upstream.load(Ordering::Relaxed);
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                };
                connect_pumps(&accept_state, client, server);
            }
        });
        Proxy { port, state }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `true`: nothing is read or written on any connection, new ones included, until
    /// `false` again. Nothing is closed.
    pub fn set_blackholed(&self, on: bool) {
        self.state.blackholed.store(on, Ordering::Relaxed);
    }

    /// Sends new connections to `port` from now on, like a virtual IP moved to another
    /// host; connections already made stay (use [`Proxy::close_all`]).
    pub fn set_upstream(&self, port: u16) {
        self.state.upstream.store(port, Ordering::Relaxed);
    }

    /// Closes both ends of every connection made so far.
    pub fn close_all(&self) {
        for s in self.state.sockets.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.state.stopped.store(true, Ordering::Relaxed);
        self.close_all();
        // Wake the accept loop so it sees `stopped`.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

fn connect_pumps(state: &Arc<State>, client: TcpStream, server: TcpStream) {
    let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    {
        let mut sockets = state.sockets.lock().unwrap();
        for s in [&client, &server] {
            if let Ok(s) = s.try_clone() {
                sockets.push(s);
            }
        }
    }
    for (from, to) in [(client, s2), (server, c2)] {
        let state = Arc::clone(state);
        thread::spawn(move || pump(&state, from, to));
    }
}

/// Copies `from` to `to` until EOF or an error, then closes both; while blackholed it
/// does not read, so data and FINs wait in the kernel.
fn pump(state: &State, mut from: TcpStream, mut to: TcpStream) {
    let _ = from.set_read_timeout(Some(Duration::from_millis(100)));
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if state.stopped.load(Ordering::Relaxed) {
            break;
        }
        if state.blackholed.load(Ordering::Relaxed) {
            thread::sleep(Duration::from_millis(20));
            continue;
        }
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}
