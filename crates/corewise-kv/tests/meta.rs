//! memcached 1.6.18's meta-protocol flags over TCP against the real
//! binary: `N` (vivify on miss, the creator wins `W`, later readers see
//! `Z`), `R` (recache: the first reader under the TTL threshold wins),
//! `I` (`md ... I` marks stale instead of deleting: `X`, and `W` for the
//! first reader; `ms ... I C<older>` stores as stale), `u` (no LRU bump:
//! the item stays unfetched) and the `c` flag on `ms` replies that did not
//! store (`c0`). The expected bytes are memcached 1.6.18's; when
//! `memcached` is on PATH each exchange also runs against it, side by
//! side. CAS values differ between the two servers, so every ` c<n>` with
//! n > 0 is compared as ` c#`.

mod common;

use common::Pair;

/// The reply with every non-zero CAS replaced by `#`.
fn normalized(reply: &[u8]) -> String {
    let text = String::from_utf8_lossy(reply);
    let mut out = String::new();
    let mut rest = text.as_ref();
    while let Some(at) = rest.find(" c") {
        let (head, tail) = rest.split_at(at + 2);
        out.push_str(head);
        let digits = tail.bytes().take_while(u8::is_ascii_digit).count();
        if digits > 0 && !tail.starts_with('0') {
            out.push('#');
        } else {
            out.push_str(&tail[..digits]);
        }
        rest = &tail[digits..];
    }
    out.push_str(rest);
    out
}

fn run(mode: &str) {
    let both = Pair::start(&["--mode", mode]);
    let check = |req: &str, want: &str| both.check(req.as_bytes(), want, normalized);

    // N: a miss creates an empty item with the N TTL and wins; flags are
    // read in order, so a `t` before `N` still sees no expiry.
    check(
        "mg nv1 s v t N30\r\nmg nv1 s v t N30\r\nmg nv1 s v t c\r\n\
         ms nv1 2 T60\r\nhi\r\nmg nv1 s v t\r\n",
        "VA 0 s0 t-1 W\r\n\r\nVA 0 s0 t30 Z\r\n\r\nVA 0 s0 t30 c# Z\r\n\r\n\
         HD\r\nVA 2 s2 t60\r\nhi\r\n",
    );
    // ... with q (a hit is still answered), k and O, h and l.
    check(
        "mg nv2 v N30 q\r\nmg nv2 v N30 q k O1\r\nmg nv3 k O5 N30 s f h l\r\n\
         mg nv3 k O5 N30 s f h l\r\n",
        "VA 0 W\r\n\r\nVA 0 knv2 O1 Z\r\n\r\nHD knv3 O5 s0 f0 h0 l0 W\r\n\
         HD knv3 O5 s0 f0 h1 l0 Z\r\n",
    );
    // T and t in order; N on a hit changes nothing.
    check(
        "mg nv4 t N30 T60 v\r\nmg nv4 t v\r\nmg nv4 T90 t\r\n",
        "VA 0 t-1 W\r\n\r\nVA 0 t60 Z\r\n\r\nHD t90 Z\r\n",
    );

    // R: a TTL left under the threshold wins once; no TTL never wins.
    check(
        "ms rc1 2 T100\r\nhi\r\nmg rc1 v t R30\r\nmg rc1 v t R200\r\n\
         mg rc1 v t R200\r\nmg rc1 v\r\nms rc2 2\r\nhi\r\nmg rc2 R100 v\r\n\
         ms rc3 2 T10\r\nhi\r\nmg rc3 R0 v\r\nmg rc3 R-1 v\r\nmg rc3 R11 v\r\n",
        "HD\r\nVA 2 t100\r\nhi\r\nVA 2 t100 W\r\nhi\r\nVA 2 t100 Z\r\nhi\r\n\
         VA 2 Z\r\nhi\r\nHD\r\nVA 2\r\nhi\r\nHD\r\nVA 2\r\nhi\r\nVA 2\r\nhi\r\n\
         VA 2 W\r\nhi\r\n",
    );

    // I: md marks stale (new CAS, optional new TTL, token cleared); the
    // first reader gets X W, the next Z X; a new set clears it all.
    check(
        "ms iv1 2\r\nhi\r\nmd iv1 I T30\r\nmg iv1 v t c\r\nmg iv1 v t\r\n\
         ms iv1 3 I\r\nnew\r\nmg iv1 v\r\n",
        "HD\r\nHD\r\nVA 2 t30 c# X W\r\nhi\r\nVA 2 t30 Z X\r\nhi\r\n\
         HD\r\nVA 3\r\nnew\r\n",
    );
    check(
        "ms iv2 2 T100\r\nhi\r\nmd iv2 I\r\nmg iv2 t v\r\nmg iv2 R300 v\r\n\
         md iv2 I q\r\nmg iv2 v\r\nmd nokey I\r\nmd nokey I q\r\n\
         ms iv3 2\r\nhi\r\nmd iv3 I\r\nget iv3\r\n",
        "HD\r\nHD\r\nVA 2 t100 X W\r\nhi\r\nVA 2 Z X\r\nhi\r\nVA 2 X W\r\nhi\r\n\
         NF\r\nNF\r\nHD\r\nHD\r\nVALUE iv3 0 2\r\nhi\r\nEND\r\n",
    );
    // ms I with an older CAS stores, stale, keeping the TTL and token; a
    // newer CAS is EX; append with I is a plain CAS check.
    check(
        "ms si1 2 T100\r\nhi\r\nmg si1 N30 v\r\nms si1 3 I C1 T50 c\r\nnew\r\n\
         mg si1 v t\r\nmg si1 v t\r\nms si2 2\r\nhi\r\nms si2 3 I C99999999 c\r\nnew\r\n\
         mg si2 v\r\nms si3 2\r\nhi\r\nms si3 3 I C1 MR\r\nnew\r\nmg si3 v\r\n\
         ms si3 3 I C1 MA\r\nnew\r\nmg si3 v\r\n",
        "HD\r\nVA 2\r\nhi\r\nHD c#\r\nVA 3 t100 X W\r\nnew\r\nVA 3 t100 Z X\r\nnew\r\n\
         HD\r\nEX c0\r\nVA 2\r\nhi\r\nHD\r\nHD\r\nVA 3 X W\r\nnew\r\nEX\r\nVA 3 Z X\r\nnew\r\n",
    );

    // md x (newer than memcached 1.6.18, which refuses the flag; as later
    // memcached does it): the value is emptied and the item kept, with the
    // client flags of F (else 0), the TTL of T (else none) and its CAS (or
    // E's); q hides HD only; C must match; with I the emptied item is
    // stale (a new CAS, or E's). Run against corewise-kv alone; the CAS
    // values are set with E.
    let only = |req: &[u8], want: &str| {
        let got = common::exchange(both.server.port, req);
        assert_eq!(
            String::from_utf8_lossy(&got),
            want,
            "{:?}",
            String::from_utf8_lossy(req)
        );
    };
    only(
        b"ms xd1 3 F5 T100\r\nabc\r\nmd xd1 x\r\nmg xd1 v f s t\r\n\
          ms xd2 3 F5\r\nabc\r\nmd xd2 x F7 T60 q k O1\r\nmg xd2 v f t\r\nmd xd2 x k O1\r\n\
          md xd3 x\r\nmd xd3 x q\r\nms xd4 2\r\nhi\r\nmd xd4 x C1\r\nmg xd4 v\r\n",
        "HD\r\nHD\r\nVA 0 f0 s0 t-1\r\n\r\nHD\r\nVA 0 f7 t60\r\n\r\nHD kxd2 O1\r\n\
         NF\r\nNF\r\nHD\r\nEX\r\nVA 2\r\nhi\r\n",
    );
    only(
        b"ms xd5 2 E77\r\nhi\r\nmd xd5 x\r\nmg xd5 c v\r\nmd xd5 x C77 E88\r\nmg xd5 c v\r\n\
          ms xd6 2 E50\r\nhi\r\nmd xd6 x I T30\r\nmg xd6 v t\r\nmg xd6 v\r\n\
          md xd6 x I E90\r\nmg xd6 c v\r\nms YQ== 1 b\r\nq\r\nmd YQ== b x k\r\n\
          mg YQ== b v k\r\n",
        "HD\r\nHD\r\nVA 0 c77\r\n\r\nHD\r\nVA 0 c88\r\n\r\n\
         HD\r\nHD\r\nVA 0 t30 X W\r\n\r\nVA 0 Z X\r\n\r\nHD\r\nVA 0 c90 X W\r\n\r\n\
         HD\r\nHD kYQ== b\r\nVA 0 kYQ== b\r\n\r\n",
    );

    // u: the read does not mark the item fetched.
    check(
        "ms u1 2\r\nhi\r\nmg u1 u v h l\r\nmg u1 v h l\r\nmg u1 v h l\r\n",
        "HD\r\nVA 2 h0 l0\r\nhi\r\nVA 2 h0 l0\r\nhi\r\nVA 2 h1 l0\r\nhi\r\n",
    );

    // ma's t is the counter's TTL (-1 for none), the one after a T when
    // the T comes first; with q the reply of a changed counter is hidden
    // but not that of one N created, nor a miss.
    check(
        "ms ma1 1 T100\r\n1\r\nma ma1 t v\r\nma ma2 N30 v t\r\n\
         ms ma3 1\r\n1\r\nma ma3 T0 t\r\nma ma1 t T50 v\r\nma ma1 T50 t\r\n",
        "HD\r\nVA 1 t100\r\n2\r\nVA 1 t30\r\n0\r\nHD\r\nHD t-1\r\n\
         VA 1 t100\r\n3\r\nHD t50\r\n",
    );
    check(
        "ms mq1 1\r\n3\r\nma mq1 q v\r\nma mq2 N0 q\r\nma mq3 q\r\n\
         ma mq4 N0 q v t\r\n",
        "HD\r\nHD\r\nNF\r\nVA 1 t-1\r\n0\r\n",
    );

    // c on replies that did not store, and ms returns only O, k, c.
    check(
        "ms ex1 2\r\nhi\r\nms ex1 2 C1 c\r\nhi\r\nmd ex1 C1 c\r\nma ex1 C1 c\r\n\
         ms x1 2 f s t T10 F5 k O9 c\r\nhi\r\nms x1 2 ME c k\r\nhi\r\n\
         ms x2 2 MR c\r\nhi\r\nms x1 2 q c\r\nhi\r\n",
        "HD\r\nEX c0\r\nEX\r\nEX\r\nHD kx1 O9 c#\r\nNS c0 kx1\r\nNS c0\r\n",
    );

    // A flag memcached 1.6.18 does not have (S) is invalid on every
    // command; md and ma word every flag error `invalid or duplicate flag`.
    check(
        "ms fl 1\r\n1\r\nmg fl S\r\nms fl 1 S\r\n2\r\nmd fl S\r\nma fl S\r\n\
         ma fl Dx\r\nmd fl Cx\r\nmd fl q q\r\nmg fl v\r\n",
        "HD\r\nCLIENT_ERROR invalid flag\r\nCLIENT_ERROR invalid flag\r\n\
         CLIENT_ERROR invalid or duplicate flag\r\nCLIENT_ERROR invalid or duplicate flag\r\n\
         CLIENT_ERROR invalid or duplicate flag\r\nCLIENT_ERROR invalid or duplicate flag\r\n\
         CLIENT_ERROR invalid or duplicate flag\r\nVA 1\r\n1\r\n",
    );
    // Numbers that are not: `bad token` for T, N, R, C; F, D and J their own.
    check(
        "mg fl Tx\r\nmg fl N\r\nmg fl Rx\r\nms fl 1 Cx\r\n2\r\nms fl 1 Fx\r\n2\r\n\
         mg fl Dx\r\nmg fl Jx\r\n",
        "CLIENT_ERROR bad token in command line format\r\n\
         CLIENT_ERROR bad token in command line format\r\n\
         CLIENT_ERROR bad token in command line format\r\n\
         CLIENT_ERROR bad token in command line format\r\n\
         CLIENT_ERROR bad command line format\r\n\
         CLIENT_ERROR invalid numeric delta value\r\n\
         CLIENT_ERROR invalid numeric initial value\r\n",
    );
    // Modes: one upper-case letter; ms takes E A P R S, ma I + D -.
    check(
        "ms fl 1 Ma\r\n2\r\nms fl 1 M\r\n2\r\nms fl 1 MEE\r\n2\r\nms fl 1 MI\r\n2\r\n\
         ma fl Mi\r\nma fl MS\r\nma fl MII\r\nma fl M+ v\r\nmg fl MX v\r\n",
        "CLIENT_ERROR invalid mode for ms M token\r\n\
         CLIENT_ERROR incorrect length for M token\r\n\
         CLIENT_ERROR incorrect length for M token\r\n\
         CLIENT_ERROR invalid mode for ms M token\r\n\
         CLIENT_ERROR invalid mode for ma M token\r\n\
         CLIENT_ERROR invalid mode for ma M token\r\n\
         CLIENT_ERROR invalid or duplicate flag\r\nVA 1\r\n2\r\nVA 1\r\n2\r\n",
    );
    // An opaque of 31 bytes is echoed, one of 32 refused (after any other
    // error); ma returns c and t but not s, f, h, l.
    let o31 = "a".repeat(31);
    check(
        &format!("mg fl O{o31}\r\nmg fl O{o31}a\r\nmd fl O{o31}a\r\nmg fl O{o31}a T\r\nma fl s f h l t\r\n"),
        &format!(
            "HD O{o31}\r\nCLIENT_ERROR opaque token too long\r\n\
             CLIENT_ERROR opaque token too long\r\n\
             CLIENT_ERROR bad token in command line format\r\nHD t-1\r\n"
        ),
    );
    // me: a key is required; `b` right after it decodes the key; other
    // tokens are ignored. An item stored with a base64 key is named in
    // base64, so a key holding a space and CR LF keeps the reply one line.
    // The access time and CAS differ between the servers and are masked.
    let masked = |reply: &[u8]| {
        let text = String::from_utf8_lossy(reply);
        text.split("\r\n")
            .map(|l| match (l.find(" la="), l.find(" fetch=")) {
                (Some(a), Some(b)) => format!("{}{}", &l[..a], &l[b..]),
                _ => l.to_string(),
            })
            .collect::<Vec<_>>()
            .join("\r\n")
    };
    check(
        "ms\r\nms k\r\nmg\r\n",
        "ERROR\r\nCLIENT_ERROR bad command line format\r\nERROR\r\n",
    );
    both.check(
        b"me\r\nms e2 2\r\nhi\r\nme e2 extra tokens\r\nme ### b\r\nme nothere x\r\n\
          ms YSBiDQo= 1 b\r\nx\r\nme YSBiDQo= b\r\nme YSBiDQo= b more\r\n\
          ms ZTM= 2 b\r\nhi\r\nme ZTM= b\r\n",
        "CLIENT_ERROR bad command line format\r\nHD\r\n\
         ME e2 exp=-1 fetch=no cls=1 size=63\r\nCLIENT_ERROR bad command line format\r\n\
         EN\r\nHD\r\nME YSBiDQo= exp=-1 fetch=no cls=1 size=65\r\n\
         ME YSBiDQo= exp=-1 fetch=no cls=1 size=65\r\nHD\r\n\
         ME ZTM= exp=-1 fetch=no cls=1 size=63\r\n",
        masked,
    );
    // The item is named by its key as the request gave it (memcached names
    // it as it was stored: `e2` and `ZTM=` here).
    assert_eq!(
        masked(&common::exchange(
            both.server.port,
            b"me ZTI= b\r\nme ZTI= b more\r\nme e3\r\n",
        )),
        "ME ZTI= exp=-1 fetch=no cls=1 size=63\r\nME ZTI= exp=-1 fetch=no cls=1 size=63\r\n\
         ME e3 exp=-1 fetch=no cls=1 size=63\r\n",
    );
    // A key token over 250 bytes, base64 or not, is a bad command line;
    // ms then skips no data block (it is read as a command).
    let k251 = "k".repeat(251);
    let b252 = "QUJD".repeat(63);
    check(
        &format!("ms {k251} 1\r\nx\r\nms {b252} 1 b\r\nx\r\nmg {b252} b v\r\nmd {b252} b\r\n"),
        "CLIENT_ERROR bad command line format\r\nERROR\r\n\
         CLIENT_ERROR bad command line format\r\nERROR\r\n\
         CLIENT_ERROR bad command line format\r\nCLIENT_ERROR bad command line format\r\n",
    );
    // 17 flags are read, 18 are too many (17 for ms, whose data block is
    // then read as a command).
    let f17 = "v c f h k l s t u O1 T1 N1 R1 q P L Zz";
    check(
        &format!("mg fl {f17}\r\nmg fl {f17} v\r\nmd fl {f17} v\r\nma fl {f17} v\r\nms fl 1 {f17}\r\n2\r\n"),
        "CLIENT_ERROR invalid flag\r\nCLIENT_ERROR options flags are too long\r\n\
         CLIENT_ERROR options flags too long\r\nCLIENT_ERROR options flags too long\r\n\
         CLIENT_ERROR options flags too long\r\nERROR\r\n",
    );
}

#[test]
fn meta_flags_conn_mode() {
    run("conn");
}

#[test]
fn meta_flags_dispatch_mode() {
    run("dispatch");
}

/// The `l` value (seconds since last access) of `mg k l`'s reply.
fn last_access(c: &mut common::Client) -> u64 {
    let reply = c.cmd("mg k l");
    reply
        .strip_prefix("HD l")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("mg k l: {reply:?}"))
}

/// memcached moves an item's last access only from its second fetch on:
/// after a `set`, a wait and one `get`, `mg`'s `l` still counts from the
/// `set`. corewise-kv moves it on every later fetch; memcached does when
/// the item is still in its hot LRU and leaves it to its LRU maintainer
/// otherwise, so that part is checked on corewise-kv only.
#[test]
fn the_first_fetch_leaves_the_last_access_alone() {
    let both = Pair::start(&[]);
    let mut clients = vec![both.server.client()];
    clients.extend(
        both.memcached
            .as_ref()
            .map(|m| common::Client::connect(m.1)),
    );
    for c in &mut clients {
        assert_eq!(c.set("k", b"v"), "STORED");
    }
    std::thread::sleep(std::time::Duration::from_millis(2100));
    for (i, c) in clients.iter_mut().enumerate() {
        assert_eq!(c.get("k").as_deref(), Some(&b"v"[..]));
        // Both clocks count whole seconds: 2.1 s reads as 1 to 3.
        let after_one_get = last_access(c);
        assert!(
            after_one_get >= 1,
            "server {i}: l{after_one_get} after one get"
        );
    }
    let after_the_second = last_access(&mut clients[0]);
    assert!(
        after_the_second <= 1,
        "l{after_the_second} after two fetches"
    );
}
