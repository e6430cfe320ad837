//! Every command against the real server binary, in both modes.

mod common;

use common::{Client, Server};

fn classic(c: &mut Client) {
    // set / get / gets
    assert_eq!(c.store("set a 5 0 3", b"abc"), "STORED");
    let v = c.get_all("get a nope");
    assert_eq!(v, vec![("VALUE a 5 3".to_string(), b"abc".to_vec())]);
    let v = c.get_all("gets a");
    let cas: u64 = v[0].0.split(' ').nth(4).unwrap().parse().unwrap();
    // cas: stale, fresh, missing
    assert_eq!(
        c.store(&format!("cas a 0 0 1 {}", cas + 1000), b"x"),
        "EXISTS"
    );
    assert_eq!(c.store(&format!("cas a 6 0 1 {cas}"), b"y"), "STORED");
    assert_eq!(c.store("cas missing 0 0 1 1", b"y"), "NOT_FOUND");
    assert_eq!(
        c.get_all("get a")[0],
        ("VALUE a 6 1".to_string(), b"y".to_vec())
    );
    // add / replace / append / prepend
    assert_eq!(c.store("add a 0 0 1", b"z"), "NOT_STORED");
    assert_eq!(c.store("add b 0 0 1", b"b"), "STORED");
    assert_eq!(c.store("replace nope 0 0 1", b"z"), "NOT_STORED");
    assert_eq!(c.store("replace b 7 0 2", b"bb"), "STORED");
    assert_eq!(c.store("append b 0 0 2", b">>"), "STORED");
    assert_eq!(c.store("prepend b 0 0 2", b"<<"), "STORED");
    assert_eq!(c.store("append nope 0 0 1", b"z"), "NOT_STORED");
    assert_eq!(
        c.get_all("get b")[0],
        ("VALUE b 7 6".to_string(), b"<<bb>>".to_vec())
    );
    // multi-get keeps order
    let keys: Vec<String> = c.get_all("get b a").into_iter().map(|(h, _)| h).collect();
    assert_eq!(keys, vec!["VALUE b 7 6", "VALUE a 6 1"]);
    // incr / decr
    assert_eq!(c.set("n", b"10"), "STORED");
    assert_eq!(c.cmd("incr n 5"), "15");
    assert_eq!(c.cmd("decr n 100"), "0");
    assert_eq!(c.cmd("incr n 18446744073709551615"), "18446744073709551615");
    assert_eq!(c.cmd("incr n 2"), "1");
    assert_eq!(c.cmd("incr nope 1"), "NOT_FOUND");
    assert_eq!(
        c.cmd("incr a 1"),
        "CLIENT_ERROR cannot increment or decrement non-numeric value"
    );
    assert_eq!(
        c.cmd("incr n x"),
        "CLIENT_ERROR invalid numeric delta argument"
    );
    // touch / gat / gats
    assert_eq!(c.cmd("touch a 100"), "TOUCHED");
    assert_eq!(c.cmd("touch nope 100"), "NOT_FOUND");
    assert_eq!(c.get_all("gat 100 a")[0].1, b"y");
    assert_eq!(c.get_all("gats 0 a")[0].0.split(' ').count(), 5);
    assert_eq!(c.get_all("gat -1 a").len(), 1);
    assert_eq!(c.get("a"), None, "gat with a past time expires the item");
    // delete
    assert_eq!(c.cmd("delete b"), "DELETED");
    assert_eq!(c.cmd("delete b"), "NOT_FOUND");
    assert_eq!(c.cmd("delete b 0"), "NOT_FOUND");
    assert!(c
        .cmd("delete b 5")
        .starts_with("CLIENT_ERROR bad command line format"));
    // noreply everywhere: the next reply is the one that follows
    for line in [
        "set q 0 0 1 noreply\r\n1\r\n",
        "add q2 0 0 1 noreply\r\n1\r\n",
        "replace q 0 0 1 noreply\r\n2\r\n",
        "append q 0 0 1 noreply\r\n3\r\n",
        "prepend q 0 0 1 noreply\r\n0\r\n",
        "cas q 0 0 1 1 noreply\r\n9\r\n",
        "incr q 1 noreply\r\n",
        "decr q 1 noreply\r\n",
        "touch q 0 noreply\r\n",
        "delete q2 noreply\r\n",
        "verbosity 1 noreply\r\n",
    ] {
        c.send(line.as_bytes());
    }
    // "023" after prepend; incr then decr write the number over it, padded
    // with spaces to its length, as memcached does.
    assert_eq!(c.get("q").unwrap(), b"23 ");
    assert_eq!(c.get("q2"), None);
    // flush_all: now, and with a delay
    assert_eq!(c.cmd("flush_all"), "OK");
    assert_eq!(c.get("n"), None);
    assert_eq!(c.set("f", b"1"), "STORED");
    assert_eq!(c.cmd("flush_all 100"), "OK");
    assert_eq!(c.get("f").unwrap(), b"1", "a delayed flush waits");
    c.send(b"flush_all noreply\r\n");
    assert_eq!(c.get("f"), None);
    assert_eq!(
        c.cmd("flush_all abc"),
        "CLIENT_ERROR invalid exptime argument"
    );
    // stats
    assert_eq!(c.set("s", b"12345"), "STORED");
    let general = c.stats("");
    for name in [
        "pid",
        "uptime",
        "curr_items",
        "bytes",
        "get_hits",
        "cmd_set",
        "curr_connections",
        "limit_maxbytes",
        "evictions",
    ] {
        assert!(
            general.iter().any(|(n, _)| n == name),
            "missing stat {name}"
        );
    }
    assert!(c.stat("cmd_set") > 10);
    let settings = c.stats("settings");
    assert!(settings
        .iter()
        .any(|(n, v)| n == "item_size_max" && v == "1048576"));
    assert!(c
        .stats("items")
        .iter()
        .any(|(n, v)| n == "items:1:number" && v == "1"));
    assert!(c.stats("slabs").iter().any(|(n, _)| n == "active_slabs"));
    assert_eq!(c.cmd("stats nonsense"), "ERROR");
    assert_eq!(c.cmd("stats reset"), "RESET");
    // version / verbosity / unknown
    assert!(c.cmd("version").starts_with("VERSION "));
    assert_eq!(c.cmd("verbosity 1"), "OK");
    assert_eq!(c.cmd("verbosity"), "ERROR");
    assert_eq!(c.cmd("bogus"), "ERROR");
    assert_eq!(c.cmd(""), "ERROR");
}

fn meta(c: &mut Client) {
    assert_eq!(
        c.store("ms mk 2 T0 F9 c", b"hi").split(' ').next(),
        Some("HD")
    );
    c.send(b"mg mk v f s t k Oxy\r\n");
    assert_eq!(c.line(), "VA 2 f9 s2 t-1 kmk Oxy");
    assert_eq!(c.block(2), b"hi");
    assert_eq!(c.cmd("mg mk"), "HD");
    // The access clock ticks in whole seconds (as memcached's): a tick
    // between the last access and this one reads as one second.
    let hl = c.cmd("mg mk h l");
    assert!(hl == "HD h1 l0" || hl == "HD h1 l1", "{hl}");
    assert_eq!(c.cmd("mg nope v"), "EN");
    assert_eq!(c.cmd("mg nope k Oq"), "EN knope Oq");
    // quiet miss, then a no-op marks the end
    c.send(b"mg nope v q\r\nmn\r\n");
    assert_eq!(c.line(), "MN");
    // compare-and-swap
    let hd = c.cmd("mg mk c");
    let cas: u64 = hd.trim_start_matches("HD c").parse().unwrap();
    assert_eq!(c.store(&format!("ms mk 1 C{}", cas + 1), b"x"), "EX");
    assert_eq!(c.store(&format!("ms mk 1 C{cas}"), b"x"), "HD");
    assert_eq!(c.store("ms nope 1 C5", b"x"), "NF");
    // modes
    assert_eq!(c.store("ms mk 1 ME", b"z"), "NS");
    assert_eq!(c.store("ms mk 1 MA", b"z"), "HD");
    assert_eq!(c.store("ms mk 1 MP", b"a"), "HD");
    assert_eq!(c.store("ms nope 1 MR", b"z"), "NS");
    assert_eq!(c.get("mk").unwrap(), b"axz");
    assert_eq!(
        c.store("ms mk 1 MX", b"z"),
        "CLIENT_ERROR invalid mode for ms M token"
    );
    assert_eq!(c.cmd("mn"), "MN", "the bad ms's data block was skipped");
    // base64 keys
    assert_eq!(c.store("ms Zm9v 3 b k", b"bar"), "HD kZm9v b");
    assert_eq!(c.get("foo").unwrap(), b"bar");
    assert_eq!(
        c.store("ms !!! 1 b", b"x"),
        "CLIENT_ERROR error decoding key"
    );
    // arithmetic
    assert_eq!(c.cmd("ma cnt"), "NF");
    assert_eq!(c.cmd("ma cnt N0 J10"), "HD");
    c.send(b"ma cnt D5 v\r\n");
    assert_eq!(c.line(), "VA 2");
    assert_eq!(c.block(2), b"15");
    c.send(b"ma cnt MD D20 v\r\n");
    assert_eq!(c.line(), "VA 1");
    assert_eq!(c.block(1), b"0");
    assert_eq!(
        c.cmd("ma mk"),
        "CLIENT_ERROR cannot increment or decrement non-numeric value"
    );
    // delete, debug
    assert!(c.cmd("me cnt").starts_with("ME cnt exp=-1 la="));
    c.send(b"md cnt q\r\nmn\r\n");
    assert_eq!(c.line(), "MN", "a quiet delete that succeeds says nothing");
    assert_eq!(c.cmd("md cnt"), "NF");
    assert_eq!(c.cmd("me cnt"), "EN");
    // flag errors
    assert_eq!(c.cmd("mg mk v v"), "CLIENT_ERROR duplicate flag");
    assert_eq!(c.cmd("mg mk !"), "CLIENT_ERROR invalid flag");
    assert_eq!(c.cmd("mg"), "ERROR");
}

fn quit(s: &Server) {
    let mut c = s.client();
    c.send(b"quit\r\n");
    assert_eq!(c.line(), "", "quit closes the connection");
}

fn run_all(mode: &str) {
    let s = Server::start(&["--mode", mode]);
    let mut c = s.client();
    classic(&mut c);
    meta(&mut c);
    quit(&s);
}

#[test]
fn without_an_idle_spin_every_request_wakes_a_sleeping_core() {
    // --idle-spin-us 0: the core sleeps in the kernel whenever it is idle,
    // so each request below arrives at a sleeping core and must wake it.
    let s = Server::start(&["--idle-spin-us", "0"]);
    let mut c = s.client();
    classic(&mut c);
    meta(&mut c);
    quit(&s);
}

#[test]
fn every_command_conn_mode() {
    run_all("conn");
}

#[test]
fn every_command_dispatch_mode() {
    run_all("dispatch");
}

#[test]
fn expiry_relative_absolute_and_negative() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert_eq!(c.store("set past 0 -1 1", b"x"), "STORED");
    assert_eq!(c.get("past"), None);
    assert_eq!(
        c.store(&format!("set abs_past 0 {} 1", now - 10), b"x"),
        "STORED"
    );
    assert_eq!(c.get("abs_past"), None);
    assert_eq!(
        c.store(&format!("set abs_future 0 {} 1", now + 1000), b"x"),
        "STORED"
    );
    assert_eq!(c.get("abs_future").unwrap(), b"x");
    assert_eq!(c.store("set short 0 1 1", b"x"), "STORED");
    assert_eq!(c.store("set long 0 2592000 1", b"x"), "STORED");
    // One second of server time is at most two wall seconds away.
    std::thread::sleep(std::time::Duration::from_millis(2100));
    assert_eq!(c.get("short"), None);
    assert_eq!(c.get("long").unwrap(), b"x");
    assert!(c.stat("get_expired") >= 1);
}

#[test]
fn memory_limit_evicts_least_recently_used() {
    let s = Server::start(&["-m", "2", "-I", "64k"]);
    let mut c = s.client();
    let value = vec![b'v'; 10_000];
    assert_eq!(c.set("keep", &value), "STORED");
    for i in 0..600 {
        assert_eq!(c.set(&format!("k{i}"), &value), "STORED");
        if i % 50 == 0 {
            // Reading "keep" keeps it at the head of its shard's LRU.
            assert!(c.get("keep").is_some(), "recently used item evicted at {i}");
        }
    }
    assert!(c.stat("evictions") > 0);
    assert!(c.stat("bytes") <= 2 * 1024 * 1024);
    assert!(c.get("k599").is_some());
    assert!(c.get("k0").is_none());
}

#[test]
fn bad_flags_are_reported() {
    for args in [
        &["-I", "1x"][..],
        &["-m", "0"],
        &["--mode", "fast"],
        &["-U", "5"],
        &["-p", "99999"],
        &["--cpus", "3-1"],
        &["--idle-spin-us", "-1"],
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_corewise-kv"))
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} accepted");
        assert!(!out.stderr.is_empty(), "{args:?}: no message");
    }
}

#[test]
fn help_is_for_the_operator() {
    for flag in ["-h", "--help"] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_corewise-kv"))
            .arg(flag)
            .output()
            .unwrap();
        assert!(out.status.success(), "{flag}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.starts_with("A memcached-compatible server"),
            "{flag}:\n{text}"
        );
        // The library's doc comments (with their doctests) are not help.
        assert!(
            !text.contains("```") && !text.contains("assert"),
            "{flag}:\n{text}"
        );
        assert!(text.contains("--conn-limit"), "{flag}:\n{text}");
    }
}
