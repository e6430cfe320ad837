//! memcached 1.6.18's operator commands over TCP against the real binary,
//! side by side with memcached when it is installed: `slabs`, `lru`,
//! `lru_crawler` (crawl, enable/disable, metadump), `stats detail` (text
//! and binary), `stats conns`, and `shutdown` (refused without `-A`, exits
//! with it).

mod common;

use common::{bin_exchange, frame, Client, Pair, Server};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

fn raw(r: &[u8]) -> String {
    String::from_utf8_lossy(r).into_owned()
}

/// The reply with each run of `PREFIX` lines sorted (memcached lists them
/// in its hash table's order, corewise-kv by prefix).
fn prefixes_sorted(r: &[u8]) -> String {
    let text = raw(r);
    let mut lines: Vec<&str> = text.split_inclusive("\r\n").collect();
    let mut i = 0;
    while i < lines.len() {
        let run = lines[i..]
            .iter()
            .take_while(|l| l.starts_with("PREFIX "))
            .count();
        lines[i..i + run].sort_unstable();
        i += run.max(1);
    }
    lines.concat()
}

fn run(mode: &str) {
    let both = Pair::start(&["--mode", mode]);
    let check = |req: &str, want: &str| both.check(req.as_bytes(), want, raw);

    // slabs: automove levels, reassign's refusals (pages are a view, and
    // an empty cache has no spare page anywhere).
    check(
        "slabs automove 0\r\nslabs automove 1\r\nslabs automove 2\r\nslabs automove 3\r\n\
         slabs automove x\r\nslabs automove\r\nslabs foo\r\nslabs\r\n\
         slabs reassign 1 1\r\nslabs reassign 100 2\r\nslabs reassign -1 2\r\n\
         slabs reassign x y\r\nslabs reassign 1\r\nslabs reassign 0 2\r\n\
         slabs reassign 1 39\r\nslabs reassign 1 40\r\n",
        "OK\r\nOK\r\nOK\r\nERROR\r\nCLIENT_ERROR bad command line format\r\nERROR\r\n\
         ERROR\r\nERROR\r\nSAME src and dst class are identical\r\n\
         BADCLASS invalid src or dst class id\r\nBADCLASS invalid src or dst class id\r\n\
         CLIENT_ERROR bad command line format\r\nERROR\r\n\
         NOSPARE source class has no spare pages\r\nNOSPARE source class has no spare pages\r\n\
         BADCLASS invalid src or dst class id\r\n",
    );
    // lru: tune, mode, temp_ttl, checked as memcached checks them.
    check(
        "lru tune 10 25 0.1 2\r\nlru tune 50 40 0.1 2\r\nlru tune x\r\nlru mode\r\n\
         lru temp_ttl x\r\nlru temp_ttl -1\r\nlru mode flat\r\nlru mode segmented\r\n\
         lru mode x\r\nlru temp_ttl 10\r\nlru\r\n",
        "OK\r\nERROR hot and warm pcts must not exceed 80\r\nERROR\r\nERROR\r\nERROR\r\n\
         OK\r\nOK\r\nOK\r\nERROR\r\nOK\r\nERROR\r\n",
    );
    // shutdown without -A.
    check(
        "shutdown\r\nshutdown graceful\r\nshutdown x\r\n",
        "ERROR: shutdown not enabled\r\nERROR: shutdown not enabled\r\n\
         ERROR: shutdown not enabled\r\n",
    );
    // lru_crawler arguments (one crawl: memcached's runs in the background
    // and answers BUSY to a second one that comes too soon).
    check(
        "lru_crawler crawl 1,2\r\nlru_crawler crawl 99\r\nlru_crawler crawl x\r\n\
         lru_crawler crawl\r\nlru_crawler sleep 100\r\nlru_crawler tocrawl 10\r\n\
         lru_crawler metadump\r\nlru_crawler mgdump all\r\nlru_crawler\r\nlru_crawler foo\r\n\
         lru_crawler enable\r\n",
        "OK\r\nBADCLASS invalid class id\r\nBADCLASS invalid class id\r\nERROR\r\nOK\r\nOK\r\n\
         ERROR\r\nERROR\r\nERROR\r\nERROR\r\nERROR failed to start lru crawler thread\r\n",
    );
    // sleep and tocrawl take exactly one unsigned number; sleep at most a
    // second (in microseconds).
    check(
        "lru_crawler sleep x\r\nlru_crawler sleep 2000000\r\nlru_crawler sleep 1000000\r\n\
         lru_crawler sleep 5 x\r\nlru_crawler sleep -1\r\nlru_crawler sleep\r\n\
         lru_crawler tocrawl x\r\nlru_crawler tocrawl 5 6\r\n",
        "CLIENT_ERROR bad command line format\r\nCLIENT_ERROR sleep must be one second or less\r\n\
         OK\r\nERROR\r\nCLIENT_ERROR bad command line format\r\nERROR\r\n\
         CLIENT_ERROR bad command line format\r\nERROR\r\n",
    );

    // A last `noreply` silences `slabs automove`, `lru`, `extstore` and
    // `watch`, errors too (memcached's `set_noreply_maybe`; a `watch`
    // then starts nothing), and is one argument too many for `slabs
    // reassign` and every `lru_crawler` subcommand: `ERROR`, and nothing
    // done. `slabs automove ratio` takes a number.
    check(
        "slabs automove 1 noreply\r\nslabs automove 9 noreply\r\nslabs automove x noreply\r\n\
         slabs automove noreply\r\nslabs automove ratio 0.5\r\nslabs automove ratio x noreply\r\n\
         slabs automove ratio\r\nslabs reassign 1 2 noreply\r\nslabs reassign 1 2 3\r\n\
         lru noreply\r\nlru mode flat noreply\r\nlru mode x noreply\r\nlru tune x noreply\r\n\
         lru temp_ttl 5 noreply\r\nextstore\r\nextstore x noreply\r\nwatch x noreply\r\n\
         watch fetchers noreply\r\nlru_crawler crawl all noreply\r\nlru_crawler crawl 1,2 x\r\n\
         lru_crawler disable noreply\r\nlru_crawler metadump all noreply\r\n\
         lru_crawler enable noreply\r\nlru_crawler x noreply\r\n",
        "OK\r\nERROR\r\nERROR\r\nERROR\r\nERROR\r\nERROR\r\nERROR\r\nERROR\r\nERROR\r\nERROR\r\n\
         ERROR\r\n",
    );

    // stats detail in the binary protocol: on/off answer the terminator
    // alone, dump is one statistic named "detail".
    let stat = |key: &[u8], opaque: u32| frame(0x10, &[], key, &[], opaque);
    let frames = [
        stat(b"detail on", 1),
        frame(0x01, &[0; 8], b"p:k", b"v", 2),
        frame(0x00, &[], b"p:k", &[], 6),
        frame(0x04, &[], b"p:k", &[], 7),
        stat(b"detail dump", 3),
        stat(b"detail off", 4),
        stat(b"detail x", 5),
    ];
    let want = vec![
        (0x10, 0, 1, vec![]),
        (0x01, 0, 2, vec![]),
        (0x00, 0, 6, b"v".to_vec()),
        (0x04, 0, 7, vec![]),
        (0x10, 0, 3, b"PREFIX p get 1 h".to_vec()),
        (0x10, 0, 3, vec![]),
        (0x10, 0, 4, vec![]),
        (0x10, 1, 5, b"Not found".to_vec()),
    ];
    assert_eq!(bin_exchange(both.server.port, &frames), want, "corewise-kv");
    if let Some(m) = &both.memcached {
        assert_eq!(bin_exchange(m.1, &frames), want, "memcached");
    }

    // ... and in the text protocol: per-prefix gets, hits, sets and deletes.
    both.check(
        b"stats detail on\r\nstats detail off\r\nstats detail\r\nstats detail foo\r\n\
         stats detail on\r\nset a:b 0 0 1\r\nx\r\nget a:b\r\nget a:c\r\ndelete a:b\r\n\
         add a:b 0 0 1\r\ny\r\nget nopfx\r\nget a:b a:q\r\nstats detail dump\r\n\
         stats detail off\r\nget a:b\r\nstats detail dump\r\n",
        "OK\r\nOK\r\nCLIENT_ERROR usage: stats detail on|off|dump\r\n\
         CLIENT_ERROR usage: stats detail on|off|dump\r\nOK\r\nSTORED\r\n\
         VALUE a:b 0 1\r\nx\r\nEND\r\nEND\r\nDELETED\r\nSTORED\r\nEND\r\n\
         VALUE a:b 0 1\r\ny\r\nEND\r\nPREFIX a get 4 hit 2 set 2 del 1\r\nPREFIX p get 1 hit 1 set 1 del 1\r\nEND\r\nOK\r\n\
         VALUE a:b 0 1\r\ny\r\nEND\r\nPREFIX a get 4 hit 2 set 2 del 1\r\nPREFIX p get 1 hit 1 set 1 del 1\r\nEND\r\n",
        prefixes_sorted,
    );
    // lru_crawler metadump: one line per item (key URI-encoded, times as
    // unix times, class and size as memcached counts them), then END.
    check(
        &format!(
            "set md%1 0 0 1\r\nx\r\nset md:2 0 100 2\r\nxy\r\nset big 5 0 2000\r\n{}\r\n",
            "z".repeat(2000)
        ),
        "STORED\r\nSTORED\r\nSTORED\r\n",
    );
    let want = [
        "key=a%3Ab exp=-1 la=# cas=# fetch=yes cls=1 size=63",
        "key=md%251 exp=-1 la=# cas=# fetch=no cls=1 size=64",
        "key=md%3A2 exp=# la=# cas=# fetch=no cls=1 size=65",
    ];
    for port in std::iter::once(both.server.port).chain(both.memcached.as_ref().map(|m| m.1)) {
        // memcached's crawler walks its LRUs while its maintainer moves
        // items between them, and may miss one now and then: its dump is
        // taken again (up to 5 times). corewise-kv's must match at once.
        let tries = if port == both.server.port { 1 } else { 5 };
        let mut dump = metadump(port, "all");
        for _ in 1..tries {
            if dump.len() == 4 {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
            dump = metadump(port, "all");
        }
        let big = dump.pop().expect("four items");
        assert_eq!(
            dump, want,
            "port {port} (corewise-kv is on {})",
            both.server.port
        );
        assert_eq!(big, "key=big exp=-1 la=# cas=# fetch=no cls=15 size=2066");
        assert_eq!(metadump(port, "15").len(), 1, "port {port}");
    }
}

/// Reads from `s` through the next `END\r\n`.
fn until_end(s: &mut TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.ends_with(b"END\r\n") {
        let n = s.read(&mut buf).expect("read");
        assert!(n > 0, "closed");
        got.extend_from_slice(&buf[..n]);
    }
    got
}

/// `lru_crawler metadump <classes>`, alone on its connection (memcached
/// refuses commands pipelined after it): the lines, times and CAS as `#`,
/// sorted, the big item last.
fn metadump(port: u16, classes: &str) -> Vec<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(s, "lru_crawler metadump {classes}\r\n").unwrap();
    let got = until_end(&mut s);
    let text = String::from_utf8_lossy(&got[..got.len() - 5]).into_owned();
    let mut lines: Vec<String> = text
        .lines()
        .map(|l| {
            l.split(' ')
                .map(|w| match w.split_once('=') {
                    Some((k @ ("la" | "cas"), _)) => format!("{k}=#"),
                    Some(("exp", v)) if v != "-1" => "exp=#".to_string(),
                    _ => w.to_string(),
                })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    lines.sort_by_key(|l| (l.starts_with("key=big"), l.clone()));
    lines
}

#[test]
fn operator_commands_conn_mode() {
    run("conn");
}

#[test]
fn operator_commands_dispatch_mode() {
    run("dispatch");
}

/// The crawler frees expired items now; disabled, it refuses work.
#[test]
fn lru_crawler_crawl_reclaims_expired_items() {
    let s = Server::start(&[]);
    let mut c = s.client();
    for i in 0..20 {
        assert_eq!(c.store(&format!("set e{i} 0 1 1"), b"x"), "STORED");
    }
    assert_eq!(c.set("kept", b"y"), "STORED");
    std::thread::sleep(Duration::from_millis(2200));
    // Expired but not yet reclaimed: still counted.
    assert_eq!(c.stat("curr_items"), 21);
    assert_eq!(c.cmd("lru_crawler crawl all"), "OK");
    assert_eq!(c.stat("curr_items"), 1);
    assert_eq!(c.stat("crawler_reclaimed"), 20);
    assert_eq!(c.stat("expired_unfetched"), 20);
    assert_eq!(c.cmd("lru_crawler disable"), "OK");
    assert_eq!(
        c.cmd("lru_crawler crawl all"),
        "CLIENT_ERROR lru crawler disabled"
    );
    assert_eq!(
        c.cmd("lru_crawler metadump all"),
        "CLIENT_ERROR lru crawler disabled"
    );
    assert_eq!(c.cmd("lru_crawler enable"), "OK");
    assert_eq!(c.get("kept").as_deref(), Some(&b"y"[..]));
}

/// With `-A`, `shutdown` (and `shutdown graceful`) end the server; another
/// argument is refused.
#[test]
fn shutdown_with_dash_a_exits() {
    for how in ["shutdown", "shutdown graceful"] {
        let mut s = Server::start(&["-A"]);
        let mut c: Client = s.client();
        assert_eq!(c.cmd("shutdown now"), "CLIENT_ERROR invalid shutdown mode");
        assert_eq!(c.cmd(how), "", "{how}: the connection ends");
        let until = Instant::now() + Duration::from_secs(20);
        while s.alive() {
            assert!(Instant::now() < until, "{how}: still running");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// `stats conns`: the listener, then each connection with its address,
/// the listener's, its state (memcached's names: never spoke, waiting for
/// a request, running one) and the seconds since its last request.
fn stats_conns(mode: &str) {
    let s = Server::start(&["--mode", mode]);
    let mut spoke = s.client();
    assert!(spoke.cmd("version").starts_with("VERSION "));
    let silent = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    let mut asking = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    asking
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    // The silent connection is seen once the server has accepted it: ask
    // until it is listed.
    let addr = |t: &TcpStream| format!("tcp:{}", t.local_addr().unwrap());
    let until = Instant::now() + Duration::from_secs(20);
    let stats = loop {
        asking.write_all(b"stats conns\r\n").unwrap();
        let text = String::from_utf8_lossy(&until_end(&mut asking)).into_owned();
        if text.contains(&addr(&silent)) || Instant::now() > until {
            break text;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let fields: Vec<(String, String)> = stats
        .lines()
        .filter_map(|l| l.strip_prefix("STAT "))
        .filter_map(|l| l.split_once(' '))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let fd_of = |a: &str| {
        fields
            .iter()
            .find(|(k, v)| k.ends_with(":addr") && v == a)
            .map(|(k, _)| k.trim_end_matches(":addr").to_string())
            .unwrap_or_else(|| panic!("no connection {a} in {stats}"))
    };
    let get = |fd: &str, f: &str| {
        fields
            .iter()
            .find(|(k, _)| *k == format!("{fd}:{f}"))
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("no {fd}:{f} in {stats}"))
    };
    let listener = fd_of(&format!("tcp:127.0.0.1:{}", s.port));
    assert_eq!(get(&listener, "state"), "conn_listening");
    let stream = |c: &common::Client| c.stream().try_clone().unwrap();
    for (conn, state) in [
        (stream(&spoke), "conn_read"),
        (silent, "conn_new_cmd"),
        (asking, "conn_parse_cmd"),
    ] {
        let fd = fd_of(&addr(&conn));
        assert_eq!(get(&fd, "state"), state, "{stats}");
        assert_eq!(get(&fd, "listen_addr"), format!("tcp:127.0.0.1:{}", s.port));
        assert!(get(&fd, "secs_since_last_cmd").parse::<u64>().unwrap() < 20);
    }
}

#[test]
fn stats_conns_conn_mode() {
    stats_conns("conn");
}

#[test]
fn stats_conns_dispatch_mode() {
    stats_conns("dispatch");
}

/// `stats settings`: the settings corewise-kv shares with memcached have
/// memcached's names, order and values, and follow the commands that
/// change them; it names none that memcached does not, but its own mode.
#[test]
fn settings_match_memcached() {
    let both = Pair::start(&[]);
    if let Some(m) = &both.memcached {
        let names = |port: u16| -> Vec<String> {
            Client::connect(port)
                .stats("settings")
                .into_iter()
                .map(|(k, _)| k)
                .collect()
        };
        let (ours, theirs) = (names(both.server.port), names(m.1));
        let ours: Vec<String> = ours.into_iter().filter(|k| k != "corewise_mode").collect();
        let shared: Vec<String> = theirs
            .iter()
            .filter(|k| ours.contains(k))
            .cloned()
            .collect();
        assert_eq!(
            ours, shared,
            "corewise-kv's settings, in memcached's order: {theirs:?}"
        );
    }
    let keys = [
        "maxbytes",
        "maxconns",
        "udpport",
        "oldest",
        "evictions",
        "domain_socket",
        "shutdown_command",
        "growth_factor",
        "chunk_size",
        "stat_key_prefix",
        "detail_enabled",
        "cas_enabled",
        "binding_protocol",
        "reqs_per_event",
        "tcp_backlog",
        "auth_enabled_sasl",
        "auth_enabled_ascii",
        "item_size_max",
        "maxconns_fast",
        "slab_chunk_max",
        "slab_automove",
        "lru_crawler",
        "lru_crawler_sleep",
        "lru_crawler_tocrawl",
        "flush_enabled",
        "dump_enabled",
        "idle_timeout",
        "track_sizes",
        "ssl_enabled",
    ];
    let ports = std::iter::once(both.server.port).chain(both.memcached.as_ref().map(|m| m.1));
    for port in ports {
        let mut c = Client::connect(port);
        let settings = |c: &mut Client| {
            let all: std::collections::HashMap<String, String> =
                c.stats("settings").into_iter().collect();
            keys.iter()
                .map(|k| format!("{k}={}", all.get(*k).map_or("(none)", String::as_str)))
                .collect::<Vec<_>>()
                .join(" ")
        };
        assert_eq!(
            settings(&mut c),
            "maxbytes=67108864 maxconns=1024 udpport=0 oldest=0 evictions=on \
             domain_socket=NULL shutdown_command=no growth_factor=1.25 chunk_size=48 \
             stat_key_prefix=: detail_enabled=no cas_enabled=yes \
             binding_protocol=auto-negotiate reqs_per_event=20 tcp_backlog=1024 \
             auth_enabled_sasl=no auth_enabled_ascii=no item_size_max=1048576 \
             maxconns_fast=yes slab_chunk_max=524288 slab_automove=1 lru_crawler=yes \
             lru_crawler_sleep=100 lru_crawler_tocrawl=0 flush_enabled=yes \
             dump_enabled=yes idle_timeout=0 track_sizes=no ssl_enabled=no",
            "port {port}"
        );
        assert_eq!(c.cmd("slabs automove 2"), "OK");
        assert_eq!(c.cmd("stats detail on"), "OK");
        assert_eq!(c.cmd("lru_crawler sleep 50"), "OK");
        assert_eq!(c.cmd("lru_crawler tocrawl 7"), "OK");
        assert_eq!(c.cmd("lru_crawler disable"), "OK");
        assert_eq!(c.cmd("flush_all"), "OK");
        // memcached stops its crawler thread asynchronously: its setting may
        // lag the OK a little on a loaded host.
        let wanted = [
            "slab_automove=2",
            "detail_enabled=yes",
            "lru_crawler=no",
            "lru_crawler_sleep=50",
            "lru_crawler_tocrawl=7",
        ];
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut after = settings(&mut c);
        while !wanted.iter().all(|w| after.contains(w)) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
            after = settings(&mut c);
        }
        for changed in wanted {
            assert!(after.contains(changed), "port {port}: {after}");
        }
        // The flush's cut-off, in memcached's time base (its start dated
        // 62 seconds early, the cut-off the second before the flush's).
        let uptime = c.stat("uptime");
        let oldest: u64 = after
            .split(' ')
            .find_map(|kv| kv.strip_prefix("oldest="))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        assert!(
            (55..=65).contains(&oldest.saturating_sub(uptime)),
            "port {port}: oldest {oldest} at uptime {uptime}"
        );
    }
}
