//! `watch`: a connection that asks for it becomes memcached's live log of
//! fetches, mutations and evictions, in memcached's line format, until it
//! closes; it must be the last request buffered.

mod common;

use common::Server;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::Duration;

/// A watching connection of `what` (after its `OK`).
fn watcher(s: &Server, what: &str) -> BufReader<TcpStream> {
    let mut w = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    w.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(w, "watch {what}\r\n").unwrap();
    let mut r = BufReader::new(w);
    let mut ok = String::new();
    r.read_line(&mut ok).unwrap();
    assert_eq!(ok, "OK\r\n");
    r
}

/// The next log line without `ts=... gid=... ` (checked: a time with
/// microseconds and a rising id) and `cfd=N` (checked: a number).
fn next(r: &mut BufReader<TcpStream>, last_gid: &mut u64) -> String {
    let mut l = String::new();
    r.read_line(&mut l).expect("a log line");
    let l = l.strip_suffix('\n').expect("newline-terminated");
    let mut words = l.split(' ');
    let ts = words
        .next()
        .and_then(|w| w.strip_prefix("ts="))
        .expect("ts");
    let (secs, micros) = ts.split_once('.').expect("ts with micros");
    assert!(secs.parse::<u64>().unwrap() > 1_600_000_000 && micros.len() == 6);
    let gid: u64 = words
        .next()
        .and_then(|w| w.strip_prefix("gid="))
        .and_then(|g| g.parse().ok())
        .expect("gid");
    assert!(gid > *last_gid, "gid {gid} after {last_gid}");
    *last_gid = gid;
    words
        .map(|w| match w.strip_prefix("cfd=") {
            Some(n) => {
                assert!(n.parse::<i32>().unwrap() > 0, "{l}");
                "cfd=#"
            }
            None => w,
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn run(mode: &str) {
    let s = Server::start(&["--mode", mode, "-m", "1", "-I", "1k"]);
    let mut both = watcher(&s, "fetchers mutations");
    let mut fetches = watcher(&s, "fetchers");
    let mut c = s.client();
    assert_eq!(c.store("set w:k 5 100 3", b"abc"), "STORED");
    assert_eq!(c.get("w:k").as_deref(), Some(&b"abc"[..]));
    assert_eq!(c.get("nokey"), None);
    assert_eq!(c.store("add w:k 0 0 1", b"x"), "NOT_STORED");
    assert_eq!(c.cmd("mg w:k s"), "HD s3");
    assert_eq!(c.store("ms w:m 2 T0 MA", b"hi"), "NS");
    let g = &mut 0;
    for want in [
        "type=item_store key=w%3Ak status=stored cmd=set ttl=100 clsid=1 cfd=# size=3",
        "type=item_get key=w%3Ak status=found clsid=1 cfd=# size=3",
        "type=item_get key=nokey status=not_found clsid=0 cfd=# size=0",
        "type=item_store key=w%3Ak status=not_stored cmd=add ttl=0 clsid=1 cfd=# size=1",
        "type=item_get key=w%3Ak status=found clsid=1 cfd=# size=3",
        "type=item_store key=w%3Am status=not_stored cmd=append ttl=0 clsid=1 cfd=# size=2",
    ] {
        assert_eq!(next(&mut both, g), want, "{mode}");
    }
    let g = &mut 0;
    for want in [
        "type=item_get key=w%3Ak status=found clsid=1 cfd=# size=3",
        "type=item_get key=nokey status=not_found clsid=0 cfd=# size=0",
        "type=item_get key=w%3Ak status=found clsid=1 cfd=# size=3",
    ] {
        assert_eq!(next(&mut fetches, g), want, "{mode}");
    }

    // Evictions: 1 MB of 900-byte values holds about a thousand.
    let mut ev = watcher(&s, "evictions");
    for i in 0..3000 {
        c.send(format!("set e{i} 0 0 900 noreply\r\n").as_bytes());
        c.send(&[b'v'; 900]);
        c.send(b"\r\n");
    }
    assert!(c.cmd("version").starts_with("VERSION"));
    let first = next(&mut ev, &mut 0);
    assert!(
        first.starts_with("type=eviction key=")
            && first.ends_with(" fetch=no ttl=-1 la=0 clsid=12"),
        "{first}"
    );

    // watch must be the last request buffered; unknown classes are refused.
    let mut p = s.client();
    p.send(b"watch\r\nversion\r\n");
    assert_eq!(
        p.line(),
        "ERROR cannot pipeline other commands before watch"
    );
    assert!(p.line().starts_with("VERSION "));
    assert_eq!(p.cmd("watch rawcmds"), "ERROR");
}

#[test]
fn watch_conn_mode() {
    run("conn");
}

#[test]
fn watch_dispatch_mode() {
    run("dispatch");
}
