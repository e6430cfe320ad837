//! `conn` mode (the default) takes connections up to `-c`, each on its own
//! user thread blocked in `read`: far more than a core's 56 dispatch slots.
//! Over `-c`, both modes refuse with memcached's line, not a reset.

mod common;

use common::Server;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::Duration;

/// Opens `n` connections at once, then does a set and a get on each one.
fn all_served(c_flag: usize, n: usize) {
    let s = Server::start(&["-c", &c_flag.to_string(), "-t", "2"]);
    let mut conns: Vec<TcpStream> = (0..n)
        .map(|_| {
            let c = TcpStream::connect(("127.0.0.1", s.port)).expect("connect");
            c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            c
        })
        .collect();
    // Every connection is open (and its thread blocked) before any request.
    for (i, c) in conns.iter_mut().enumerate() {
        write!(
            c,
            "set k{i} 0 0 {}\r\n{i}\r\nget k{i}\r\n",
            i.to_string().len()
        )
        .unwrap();
    }
    for (i, c) in conns.iter_mut().enumerate() {
        let mut r = BufReader::new(&*c);
        let mut lines = Vec::new();
        for _ in 0..4 {
            let mut l = String::new();
            r.read_line(&mut l)
                .unwrap_or_else(|e| panic!("connection {i}: {e}"));
            lines.push(l);
        }
        assert_eq!(
            lines,
            [
                "STORED\r\n".to_string(),
                format!("VALUE k{i} 0 {}\r\n", i.to_string().len()),
                format!("{i}\r\n"),
                "END\r\n".to_string()
            ],
            "connection {i}"
        );
    }
}

#[test]
fn conn_mode_serves_a_thousand_connections_at_once() {
    all_served(1024, 1_000);
}

#[test]
fn conn_mode_serves_ten_thousand_connections_with_c_10240() {
    all_served(10_240, 10_000);
}

/// Connections over `-c` that send a request before reading are told why
/// they are refused (the line arrives; the close is not a reset that would
/// destroy it), in both modes.
fn refused_clients_get_the_line(mode: &str) {
    let s = Server::start(&["--mode", mode, "-c", "10", "-t", "2"]);
    let mut conns: Vec<TcpStream> = (0..60)
        .map(|_| {
            let mut c = TcpStream::connect(("127.0.0.1", s.port)).expect("connect");
            c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            let _ = c.write_all(b"version\r\n");
            c
        })
        .collect();
    let (mut served, mut refused) = (0, 0);
    for (i, c) in conns.iter_mut().enumerate() {
        let mut l = String::new();
        BufReader::new(&*c)
            .read_line(&mut l)
            .unwrap_or_else(|e| panic!("connection {i}: {e}"));
        if l.starts_with("VERSION ") {
            served += 1;
        } else {
            assert_eq!(l, "ERROR Too many open connections\r\n", "connection {i}");
            refused += 1;
        }
    }
    assert!((1..=10).contains(&served), "{served} served");
    assert_eq!(served + refused, 60);
}

#[test]
fn conn_mode_refused_clients_get_the_line() {
    refused_clients_get_the_line("conn");
}

#[test]
fn dispatch_mode_refused_clients_get_the_line() {
    refused_clients_get_the_line("dispatch");
}
