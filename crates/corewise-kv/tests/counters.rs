//! Every counter `stats` reports moves when it should: a table of actions,
//! each with the counters it must move and by how much, run against the
//! real server over TCP. A counter `stats` reports that no row moves fails
//! the test, so a new counter needs a row.

mod common;

use common::{Client, Server};
use std::collections::HashMap;
use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// How much a counter must move.
#[derive(Debug, Clone, Copy)]
enum Moves {
    /// By exactly this much.
    By(i64),
    /// By at least this much.
    AtLeast(i64),
}

use Moves::{AtLeast, By};

/// `stats` as numbers (the non-numeric ones left out).
fn numbers(c: &mut Client) -> HashMap<String, f64> {
    c.stats("")
        .into_iter()
        .filter_map(|(k, v)| v.parse::<f64>().ok().map(|v| (k, v)))
        .collect()
}

/// Settings and identities `stats` reports that are not counters.
const NOT_COUNTERS: &[&str] = &[
    "pid",
    "version",
    "pointer_size",
    "max_connections",
    "threads",
    // Always 0: the crawler runs inside the request that starts it.
    "lru_crawler_running",
];

/// Counters that move only under a flag this test's server does not have,
/// and the test that moves them.
const MOVED_ELSEWHERE: &[&str] = &[
    // -o idle_timeout: tests/flags.rs, idle_connections_are_closed_after_idle_timeout.
    "idle_kicks",
];

type Action = Box<dyn Fn(&Server, &mut Client)>;

fn row(
    action: impl Fn(&Server, &mut Client) + 'static,
    moves: &[(&str, Moves)],
) -> (Action, Vec<(String, Moves)>) {
    (
        Box::new(action),
        moves.iter().map(|(n, m)| (n.to_string(), *m)).collect(),
    )
}

/// Opens connections until the server has counted one more than before.
fn connect_counted(s: &Server, c: &mut Client, name: &str) -> TcpStream {
    let before = c.stat(name);
    let conn = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    let until = Instant::now() + Duration::from_secs(20);
    while c.stat(name) == before {
        assert!(Instant::now() < until, "{name} never moved");
        std::thread::sleep(Duration::from_millis(10));
    }
    conn
}

#[test]
fn every_stats_counter_moves() {
    let s = Server::start(&["-m", "1", "-c", "16"]);
    let mut c = s.client();
    let held = std::cell::RefCell::new(Vec::new());
    let held = std::rc::Rc::new(held);
    let h1 = std::rc::Rc::clone(&held);
    let h2 = std::rc::Rc::clone(&held);
    let h3 = std::rc::Rc::clone(&held);
    let rows = vec![
        row(
            // Items that expire unread, oldest first: `gone3`, then four
            // that do not expire, then `gone2` and `gone`. The read of
            // `gone` frees it (get_expired); the next store takes back
            // `gone3`'s memory at the LRU tail (reclaimed); the crawler
            // frees `gone2` (crawler_reclaimed).
            |_, c| {
                assert_eq!(c.store("set gone3 0 1 1", b"z"), "STORED");
                for i in 0..4 {
                    assert_eq!(c.set(&format!("p{i}"), b"z"), "STORED");
                }
                assert_eq!(c.store("set gone2 0 1 1", b"z"), "STORED");
                assert_eq!(c.store("set gone 0 1 1", b"z"), "STORED");
                std::thread::sleep(Duration::from_millis(2100));
                assert_eq!(c.get("gone"), None);
                assert_eq!(c.set("fresh", b"z"), "STORED");
                assert_eq!(c.cmd("lru_crawler crawl all"), "OK");
            },
            &[
                ("get_expired", By(1)),
                ("reclaimed", By(1)),
                ("expired_unfetched", By(2)),
                ("lru_crawler_starts", By(1)),
                ("crawler_reclaimed", By(1)),
                ("curr_items", By(5)),
                ("uptime", AtLeast(2)),
                ("time", AtLeast(2)),
            ],
        ),
        row(
            |_, c| assert_eq!(c.set("a", b"12"), "STORED"),
            &[
                ("cmd_set", By(1)),
                ("curr_items", By(1)),
                ("total_items", By(1)),
                ("bytes", AtLeast(1)),
                // The set (17 bytes) and the `stats ` request after it (8);
                // written: its reply, and the earlier `stats` reply.
                ("bytes_read", By(25)),
                ("bytes_written", AtLeast(8)),
            ],
        ),
        row(
            |_, c| assert_eq!(c.get_all("get a nokey").len(), 1),
            &[
                ("cmd_get", By(2)),
                ("get_hits", By(1)),
                ("get_misses", By(1)),
            ],
        ),
        row(
            |_, c| assert_eq!(c.cmd("touch a 100"), "TOUCHED"),
            &[("cmd_touch", By(1)), ("touch_hits", By(1))],
        ),
        row(
            |_, c| assert_eq!(c.cmd("touch nokey 100"), "NOT_FOUND"),
            &[("cmd_touch", By(1)), ("touch_misses", By(1))],
        ),
        row(
            |_, c| assert_eq!(c.cmd("incr a 1"), "13"),
            &[("incr_hits", By(1))],
        ),
        row(
            |_, c| assert_eq!(c.cmd("incr nokey 1"), "NOT_FOUND"),
            &[("incr_misses", By(1))],
        ),
        row(
            |_, c| assert_eq!(c.cmd("decr a 1"), "12"),
            &[("decr_hits", By(1))],
        ),
        row(
            |_, c| assert_eq!(c.cmd("decr nokey 1"), "NOT_FOUND"),
            &[("decr_misses", By(1))],
        ),
        row(
            |_, c| {
                let (line, _) = c.get_all("gets a").pop().unwrap();
                let cas = line.rsplit(' ').next().unwrap().to_string();
                assert_eq!(c.store(&format!("cas a 0 0 1 {cas}"), b"x"), "STORED");
            },
            &[("cas_hits", By(1)), ("cmd_set", By(1))],
        ),
        row(
            |_, c| assert_eq!(c.store("cas a 0 0 1 1", b"y"), "EXISTS"),
            &[("cas_badval", By(1))],
        ),
        row(
            |_, c| assert_eq!(c.store("cas nokey 0 0 1 1", b"y"), "NOT_FOUND"),
            &[("cas_misses", By(1))],
        ),
        row(
            |_, c| assert_eq!(c.cmd("delete a"), "DELETED"),
            &[("delete_hits", By(1)), ("curr_items", By(-1))],
        ),
        row(
            |_, c| assert_eq!(c.cmd("delete nokey"), "NOT_FOUND"),
            &[("delete_misses", By(1))],
        ),
        row(
            // A watcher that never reads: its socket fills, then its queue,
            // then lines are dropped (and counted).
            move |s, c| {
                let mut w = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
                w.write_all(b"watch fetchers\r\n").unwrap();
                let until = Instant::now() + Duration::from_secs(20);
                while c.stat("log_watchers") == 0 {
                    assert!(Instant::now() < until, "the watcher never started");
                    std::thread::sleep(Duration::from_millis(10));
                }
                let keys = " k".repeat(1000);
                while c.stat("log_watcher_skipped") == 0 {
                    assert!(Instant::now() < until, "nothing was skipped");
                    for _ in 0..20 {
                        c.send(format!("get{keys}\r\n").as_bytes());
                        assert_eq!(c.line(), "END");
                    }
                }
                h3.borrow_mut().push(w);
            },
            &[
                ("log_watchers", By(1)),
                ("log_watcher_sent", AtLeast(8192)),
                ("log_watcher_skipped", AtLeast(1)),
            ],
        ),
        row(
            |_, c| assert_eq!(c.cmd("me nokey"), "EN"),
            &[("cmd_meta", By(1))],
        ),
        row(
            // 25 requests in one read, more than -R's 20: the connection
            // sends its replies and lets the others run once.
            |_, c| {
                c.send(&b"mn\r\n".repeat(25));
                for _ in 0..25 {
                    assert_eq!(c.line(), "MN");
                }
            },
            &[("conn_yields", By(1))],
        ),
        row(
            // A delayed flush: items stored before it are gone after it
            // (`flush_all 1` takes effect at once and frees them, so a
            // read of them is a plain miss).
            |_, c| {
                assert_eq!(c.set("old", b"1"), "STORED");
                assert_eq!(c.cmd("flush_all 2"), "OK");
                std::thread::sleep(Duration::from_millis(2100));
                assert_eq!(c.get("old"), None);
            },
            &[("cmd_flush", By(1)), ("get_flushed", By(1))],
        ),
        row(
            move |s, c| {
                let conn = connect_counted(s, c, "total_connections");
                h1.borrow_mut().push(conn);
            },
            &[
                ("curr_connections", By(1)),
                ("connection_structures", By(1)),
                ("total_connections", By(1)),
            ],
        ),
        row(
            // -c 16: fill the server, then one more is refused.
            move |s, c| {
                while c.stat("curr_connections") < 16 {
                    let conn = connect_counted(s, c, "curr_connections");
                    h2.borrow_mut().push(conn);
                }
                connect_counted(s, c, "rejected_connections");
            },
            &[("rejected_connections", By(1))],
        ),
        row(
            |_, c| {
                let too_large = vec![b'v'; 2_000_000];
                let reply = c.store("set big 0 0 2000000", &too_large);
                assert_eq!(reply, "SERVER_ERROR object too large for cache");
            },
            &[("store_too_large", By(1)), ("cmd_set", By(0))],
        ),
        row(
            // Within -I 1m as memcached counts an item, but more than the
            // one 1 MB shard can hold with this server's overhead.
            |_, c| {
                let reply = c.store("set big 0 0 1048500", &vec![b'v'; 1_048_500]);
                assert_eq!(reply, "SERVER_ERROR out of memory storing object");
            },
            &[("store_no_memory", By(1)), ("cmd_set", By(1))],
        ),
        row(
            |_, c| assert_eq!(c.cmd("cache_memlimit 9"), "OK"),
            &[("limit_maxbytes", By(8 * 1024 * 1024))],
        ),
        row(
            // 9 MB of 900-byte values (10 with this server's overhead),
            // never read: the oldest are evicted.
            |_, c| {
                for i in 0..10_000 {
                    c.send(format!("set e{i} 0 0 900 noreply\r\n").as_bytes());
                    c.send(&[b'v'; 900]);
                    c.send(b"\r\n");
                }
                assert!(c.cmd("version").starts_with("VERSION "));
            },
            &[
                ("evictions", AtLeast(1)),
                ("evicted_unfetched", AtLeast(1)),
                ("rusage_user", AtLeast(0)),
                ("rusage_system", AtLeast(0)),
            ],
        ),
    ];
    // Every counter has a row (the runtime's `corewise_*` figures are
    // tested with the runtime, in tests/runtime_stats.rs).
    let reported = numbers(&mut c);
    for name in reported.keys() {
        assert!(
            NOT_COUNTERS.contains(&name.as_str())
                || MOVED_ELSEWHERE.contains(&name.as_str())
                || name.starts_with("corewise_")
                || rows.iter().any(|(_, m)| m.iter().any(|(n, _)| n == name)),
            "stats reports {name}, which no row moves"
        );
    }
    let mut cpu = 0.0;
    for (action, moves) in &rows {
        let before = numbers(&mut c);
        action(&s, &mut c);
        let after = numbers(&mut c);
        for (name, want) in moves {
            let delta = after[name] - before[name];
            match want {
                By(n) => assert_eq!(delta, *n as f64, "{name}"),
                AtLeast(n) => assert!(delta >= *n as f64, "{name} moved {delta}, want {n}+"),
            }
            if name.starts_with("rusage_") {
                cpu += delta;
            }
        }
    }
    assert!(cpu > 0.0, "10 000 sets used no CPU time");
    drop(held);
}

/// The counters after the same requests, in `stats` and per slab class in
/// `stats slabs`, match memcached 1.6.18's (run side by side when it is
/// installed): a get-and-touch counts as a touch, a
/// meta get with `T` that hits as a touch and one that misses as a get, a
/// vivifying `ma` miss is not an incr miss, and a too-large store is not a
/// delete.
#[test]
fn counters_match_memcached() {
    let both = common::Pair::start(&[]);
    let mut req = b"set a 0 0 2\r\n12\r\nget a nokey\r\ngets a\r\ngat 100 a nokey\r\n\
        gats 100 a\r\ntouch a 100\r\ntouch nokey 1\r\nincr a 1\r\nincr nokey 1\r\n\
        decr a 1\r\ndecr nokey 1\r\ncas a 0 0 1 1\r\nx\r\ncas nokey 0 0 1 1\r\nx\r\n\
        add a 0 0 1\r\nx\r\nreplace nokey 0 0 1\r\nx\r\nappend a 0 0 1\r\nx\r\n\
        delete a\r\ndelete nokey\r\nms m 2\r\nhi\r\nmg m v\r\nmg nokey v\r\n\
        mg m T30 v\r\nmg nokey2 T30 v\r\nmg m N30 v\r\nmg viv N30 v\r\nmd m\r\n\
        md nokey\r\nma cnt N0 J5\r\nma cnt\r\nma nokey\r\nme viv\r\nset big 0 0 2000000\r\n"
        .to_vec();
    req.extend_from_slice(&[b'x'; 2_000_000]);
    req.extend_from_slice(b"\r\n");
    let want = [
        ("cmd_get", 8),
        ("cmd_set", 7),
        ("cmd_touch", 6),
        ("get_hits", 5),
        ("get_misses", 3),
        ("touch_hits", 4),
        ("touch_misses", 2),
        ("incr_hits", 2),
        ("incr_misses", 2),
        ("decr_hits", 1),
        ("decr_misses", 1),
        ("cas_hits", 0),
        ("cas_badval", 1),
        ("cas_misses", 1),
        ("delete_hits", 2),
        ("delete_misses", 2),
        ("store_too_large", 1),
        ("cmd_meta", 1),
        ("curr_items", 2),
    ];
    let ports = std::iter::once(both.server.port).chain(both.memcached.as_ref().map(|m| m.1));
    for port in ports {
        common::exchange(port, &req);
        let mut c = Client::connect(port);
        let got = numbers(&mut c);
        for (name, n) in want {
            assert_eq!(got[name], f64::from(n), "{name} on port {port}");
        }
        // The listener, the start-up probe, the exchange and this client:
        // memcached counts its listening connection too.
        assert_eq!(got["total_connections"], 4.0, "on port {port}");
        assert!(got["connection_structures"] >= got["curr_connections"] + 1.0);
        // The same requests per slab class: every item here is in class 1.
        // memcached frees a deleted item's chunk only when the worker that
        // sent it drops its reference, which can come just after the reply
        // reached us: used_chunks may read one high for a moment, so the
        // table is read again until it settles (or 5 s pass).
        let until = Instant::now() + Duration::from_secs(5);
        let slabs = loop {
            let slabs: HashMap<String, String> = c.stats("slabs").into_iter().collect();
            let settled = slabs.get("1:used_chunks").map(String::as_str) == Some("2");
            if settled || Instant::now() > until {
                break slabs;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        for (name, n) in [
            ("chunk_size", 96),
            ("total_pages", 1),
            ("used_chunks", 2),
            ("get_hits", 5),
            ("cmd_set", 7),
            ("delete_hits", 2),
            ("incr_hits", 2),
            ("decr_hits", 1),
            ("cas_hits", 0),
            ("cas_badval", 1),
            ("touch_hits", 4),
        ] {
            let v = slabs.get(&format!("1:{name}")).map(String::as_str);
            assert_eq!(v, Some(n.to_string().as_str()), "1:{name} on port {port}");
        }
    }
}

/// `stats reset` zeroes the counters memcached 1.6.18 zeroes (item counters
/// included), side by side with it when installed; gauges stay.
#[test]
fn stats_reset_zeroes_counters() {
    let both = common::Pair::start(&[]);
    let ports = std::iter::once(both.server.port).chain(both.memcached.as_ref().map(|m| m.1));
    let ports: Vec<u16> = ports.collect();
    for &port in &ports {
        common::exchange(
            port,
            b"set r 0 0 1\r\nx\r\nget r nokey\r\nset e 0 1 1\r\nx\r\n",
        );
    }
    std::thread::sleep(Duration::from_millis(2100));
    for &port in &ports {
        common::exchange(port, b"get e\r\ntouch r 0\r\nme r\r\n");
        let mut c = Client::connect(port);
        assert_eq!(c.stat("get_expired"), 1, "port {port}");
        assert_eq!(c.cmd("stats reset"), "RESET");
        let got = numbers(&mut c);
        for name in [
            "cmd_get",
            "cmd_set",
            "cmd_touch",
            "cmd_meta",
            "get_hits",
            "get_misses",
            "get_expired",
            "touch_hits",
            "total_items",
            "expired_unfetched",
            "reclaimed",
            "rejected_connections",
        ] {
            assert_eq!(got[name], 0.0, "{name} on port {port}");
        }
        assert_eq!(got["curr_items"], 1.0, "port {port}");
        let slabs: HashMap<String, String> = c.stats("slabs").into_iter().collect();
        assert_eq!(
            slabs.get("1:get_hits").map(String::as_str),
            Some("0"),
            "port {port}"
        );
        assert_eq!(
            slabs.get("1:cmd_set").map(String::as_str),
            Some("0"),
            "port {port}"
        );
    }
}

/// `bytes` counts each item as memcached 1.6.18 does (48-byte header,
/// 8-byte CAS, key and its terminator, a 4-byte flags suffix when flags
/// are not zero, value and CRLF), through stores, in-place edits and
/// deletes; side by side with memcached when installed.
#[test]
fn bytes_counts_items_as_memcached() {
    let both = common::Pair::start(&[]);
    let ports = std::iter::once(both.server.port).chain(both.memcached.as_ref().map(|m| m.1));
    for port in ports {
        let mut c = Client::connect(port);
        let steps: [(&[u8], u64); 6] = [
            (b"set a 0 0 1\r\nx\r\n", 61),
            (b"set zz:2 7 0 1\r\nx\r\n", 61 + 68),
            (b"append a 0 0 4\r\nyyyy\r\n", 65 + 68),
            (b"set n 0 0 2\r\n99\r\nincr n 1\r\n", 65 + 68 + 63),
            (b"delete zz:2\r\n", 65 + 63),
            (b"delete a\r\ndelete n\r\n", 0),
        ];
        for (req, want) in steps {
            common::exchange(port, req);
            assert_eq!(
                c.stat("bytes"),
                want,
                "after {:?} on port {port}",
                String::from_utf8_lossy(req)
            );
        }
    }
}
