// Command go-threads is the Go peer of `corewise-bench threads`.
//
// With -scenario sleepers or parked it runs that scenario with -n
// goroutines and prints one JSON line with the same fields as the Rust
// children's outcome. With -scenario serve it is a goroutine-per-connection
// echo server on 127.0.0.1: it prints its port on the first line and
// serves 64-byte echoes until it is killed. GOMAXPROCS comes from the
// environment (the harness sets it).
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// outcome mirrors the Rust `Outcome` (threads/mod.rs).
type outcome struct {
	Error             *string  `json:"error"`
	N                 int      `json:"n"`
	WallMs            *float64 `json:"wall_ms,omitempty"`
	CreateMs          *float64 `json:"create_ms,omitempty"`
	WakeMs            *float64 `json:"wake_ms,omitempty"`
	RssPerThreadBytes *float64 `json:"rss_per_thread_bytes,omitempty"`
	PeakRssKib        *uint64  `json:"peak_rss_kib,omitempty"`
}

// statusKib reads a line of /proc/self/status (VmRSS, VmHWM) in KiB.
func statusKib(key string) (uint64, bool) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, key) {
			fs := strings.Fields(l)
			if len(fs) < 2 {
				return 0, false
			}
			v, err := strconv.ParseUint(fs[1], 10, 64)
			return v, err == nil
		}
	}
	return 0, false
}

func ms(d time.Duration) *float64 {
	v := d.Seconds() * 1e3
	return &v
}

// sleepers: n goroutines each sleep 10 ms; wall time from the first spawn
// to the last join.
func sleepers(n int, out *outcome) {
	var wg sync.WaitGroup
	t0 := time.Now()
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			time.Sleep(10 * time.Millisecond)
			wg.Done()
		}()
	}
	wg.Wait()
	out.WallMs = ms(time.Since(t0))
}

// parked: n goroutines blocked at once on one sync.Cond (as the Rust
// children block on a condition variable). Each counts itself under the
// mutex and waits; the one that completes the count closes allIn. Once
// the spawner then takes the mutex, every goroutine is inside Wait.
func parked(n int, out *outcome) {
	var (
		mu    sync.Mutex
		cond  = sync.NewCond(&mu)
		open  bool
		count int
		allIn = make(chan struct{})
		wg    sync.WaitGroup
	)
	before, _ := statusKib("VmRSS:")
	t0 := time.Now()
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mu.Lock()
			count++
			if count == n {
				close(allIn)
			}
			for !open {
				cond.Wait()
			}
			mu.Unlock()
		}()
	}
	if n > 0 {
		<-allIn
	}
	mu.Lock()
	mu.Unlock()
	out.CreateMs = ms(time.Since(t0))
	after, _ := statusKib("VmRSS:")
	per := (float64(after) - float64(before)) * 1024 / float64(max(n, 1))
	out.RssPerThreadBytes = &per
	t1 := time.Now()
	mu.Lock()
	open = true
	cond.Broadcast()
	mu.Unlock()
	wg.Wait()
	out.WakeMs = ms(time.Since(t1))
}

// serve: a goroutine per accepted connection, echoing 64-byte messages.
func serve() {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintf(os.Stderr, "listen: %v\n", err)
		os.Exit(3)
	}
	fmt.Println(l.Addr().(*net.TCPAddr).Port)
	for i := 0; ; i++ {
		c, err := l.Accept()
		if err != nil {
			fmt.Fprintf(os.Stderr, "accept after %d connections: %v\n", i, err)
			os.Exit(3)
		}
		go func(c net.Conn) {
			defer c.Close()
			var buf [64]byte
			for {
				if _, err := io.ReadFull(c, buf[:]); err != nil {
					return
				}
				if _, err := c.Write(buf[:]); err != nil {
					return
				}
			}
		}(c)
	}
}

func main() {
	scenario := flag.String("scenario", "", "sleepers, parked or serve")
	n := flag.Int("n", 0, "goroutines")
	flag.Parse()
	out := outcome{N: *n}
	switch *scenario {
	case "sleepers":
		sleepers(*n, &out)
	case "parked":
		parked(*n, &out)
	case "serve":
		serve()
	default:
		e := fmt.Sprintf("bad scenario %q", *scenario)
		out.Error = &e
	}
	if hwm, ok := statusKib("VmHWM:"); ok {
		out.PeakRssKib = &hwm
	}
	b, _ := json.Marshal(out)
	fmt.Println(string(b))
}
