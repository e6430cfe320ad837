#!/usr/bin/env python3
"""Every command pymemcache supports, against a running server.

Usage: pymemcache_test.py PORT [HOST]. Exits non-zero on the first failure.
"""
import sys
import time

from pymemcache.client.base import Client
from pymemcache.exceptions import MemcacheClientError, MemcacheIllegalInputError

port = int(sys.argv[1])
host = sys.argv[2] if len(sys.argv) > 2 else "127.0.0.1"
c = Client((host, port), connect_timeout=5, timeout=10, default_noreply=False)
checked = []


def check(name, cond, detail=""):
    checked.append(name)
    if not cond:
        print(f"FAIL {name} {detail}")
        sys.exit(1)


c.flush_all()
# storage
check("set", c.set("k", b"v1", expire=0) is True)
check("get", c.get("k") == b"v1")
check("set noreply", c.set("nr", b"x", noreply=True) is True and c.get("nr") == b"x")
check("add existing", c.add("k", b"zz") is False)
check("add new", c.add("k2", b"a") is True)
check("replace missing", c.replace("missing", b"z") is False)
check("replace", c.replace("k2", b"b") is True and c.get("k2") == b"b")
check("append", c.append("k2", b"c") is True and c.get("k2") == b"bc")
check("prepend", c.prepend("k2", b"a") is True and c.get("k2") == b"abc")
check("set_many", c.set_many({"m1": b"1", "m2": b"2", "m3": b"3"}) == [])
check("get_many", c.get_many(["m1", "m2", "m3", "nope"]) == {"m1": b"1", "m2": b"2", "m3": b"3"})
# cas
val, cas = c.gets("k")
check("gets", val == b"v1" and cas is not None)
check("cas ok", c.cas("k", b"v2", cas) is True)
check("cas stale", c.cas("k", b"v3", cas) is False)
check("cas missing", c.cas("missing", b"v", b"1") is None)
many = c.gets_many(["k", "k2"])
check("gets_many", set(many) == {"k", "k2"} and many["k"][0] == b"v2")
# counters
c.set("n", b"10")
check("incr", c.incr("n", 5) == 15)
check("decr", c.decr("n", 20) == 0)
check("incr missing", c.incr("missing", 1) is None)
# touch / gat
check("touch", c.touch("k", 100) is True)
check("touch missing", c.touch("missing", 100) is False)
if hasattr(c, "gat"):
    check("gat", c.gat("k", 100) == b"v2")
if hasattr(c, "gats"):
    v, cs = c.gats("k", 100)
    check("gats", v == b"v2" and cs is not None)
# delete
check("delete", c.delete("k") is True)
check("delete missing", c.delete("k", noreply=False) is False)
check("delete_many", c.delete_many(["m1", "m2"]) is True and c.get("m1") is None)
# expiry
c.set("exp", b"x", expire=1)
time.sleep(2.1)
check("expiry", c.get("exp") is None)
# flags round-trip through the serializer-free path
c.set("big", b"x" * 100_000)
check("large value", c.get("big") == b"x" * 100_000)
# stats, version, limits, raw
st = c.stats()
check("stats", b"curr_items" in st or "curr_items" in st, str(list(st)[:5]))
settings = c.stats("settings")
check("stats settings", b"item_size_max" in settings or "item_size_max" in settings)
check("stats items", isinstance(c.stats("items"), dict))
check("stats slabs", isinstance(c.stats("slabs"), dict))
check("version", isinstance(c.version(), (bytes, str)) and len(c.version()) > 0)
check("cache_memlimit", c.cache_memlimit(64) is True)
if hasattr(c, "raw_command"):
    check("raw_command", c.raw_command("mn", b"MN") == b"MN")
try:
    c.set("k" * 251, b"x")
    check("key too long", False)
except (MemcacheIllegalInputError, MemcacheClientError):
    check("key too long", True)
check("flush_all", c.flush_all() is True and c.get("k2") is None)
c.quit()
# a new connection after quit works
c2 = Client((host, port), connect_timeout=5, timeout=10)
check("reconnect", c2.set("after", b"1") is True and c2.get("after") == b"1")
c2.close()
print(f"pymemcache: {len(checked)} checks passed")
