//! `conn` mode (the default) takes connections up to `-c`, each on its own
//! user thread blocked in `read`: far more than a core's 56 dispatch slots.

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
