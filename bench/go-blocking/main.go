// Command go-blocking is the Go peer of `corewise-bench blocking`.
//
// A ticker goroutine wakes every -interval-us (time.Sleep to its next due
// time, skipping due times already passed, as a time.Ticker drops ticks)
// and records how late each wake-up was, for -duration-ms, while -blockers
// goroutines make blocking calls in a loop:
//
//   - sleep: syscall.Nanosleep(1 ms). Unlike time.Sleep (which only parks
//     the goroutine), syscall.Nanosleep goes through syscall.Syscall, so
//     the M really blocks in the kernel and the runtime must hand its P to
//     another M (sysmon retakes a P after ~20 µs in a system call).
//   - fs: os.ReadFile of a small regular file (regular files bypass the
//     netpoller: each read is a blocking system call on the M).
//   - compute: a busy loop with no call that yields; only asynchronous
//     preemption (Go 1.14+) lets the ticker run.
//
// GOMAXPROCS comes from the environment (the harness sets it) and the
// harness confines the process to the same CPUs as the other peers. The
// program prints one JSON line with the same fields as the Rust children
// (blocking/child.rs); a watchdog prints what was recorded and exits when
// the run does not end within -grace-ms after the duration.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// outcome mirrors the Rust `Outcome` (blocking/mod.rs).
type outcome struct {
	Peer         string    `json:"peer"`
	Kind         string    `json:"kind"`
	Error        *string   `json:"error"`
	Stalled      bool      `json:"stalled"`
	Expected     uint64    `json:"expected"`
	LatenessUs   []float64 `json:"lateness_us"`
	BlockerCalls uint64    `json:"blocker_calls"`
}

// ticks holds the lateness samples, shared with the watchdog.
type ticks struct {
	mu sync.Mutex
	us []float64
}

func (t *ticks) push(v float64) {
	t.mu.Lock()
	t.us = append(t.us, v)
	t.mu.Unlock()
}

func (t *ticks) snapshot() []float64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]float64{}, t.us...)
}

func emit(o outcome) {
	if o.LatenessUs == nil {
		o.LatenessUs = []float64{}
	}
	b, _ := json.Marshal(o)
	fmt.Println(string(b))
}

var sink uint64

func blocker(kind, file string, stop *atomic.Bool, calls *atomic.Uint64) {
	ts := syscall.Timespec{Sec: 0, Nsec: 1_000_000}
	x := uint64(1)
	for !stop.Load() {
		switch kind {
		case "sleep":
			_ = syscall.Nanosleep(&ts, nil)
		case "fs":
			b, _ := os.ReadFile(file)
			x += uint64(len(b))
		case "compute":
			for i := 0; i < 100_000; i++ {
				x = x*6364136223846793005 + 1442695040888963407
			}
		}
		calls.Add(1)
	}
	atomic.AddUint64(&sink, x)
}

func main() {
	kind := flag.String("kind", "sleep", "sleep, fs or compute")
	blockers := flag.Int("blockers", 2, "blocking goroutines")
	intervalUs := flag.Int64("interval-us", 10_000, "ticker period, µs")
	durationMs := flag.Int64("duration-ms", 3_000, "run length, ms")
	graceMs := flag.Int64("grace-ms", 2_000, "wait after the duration before reporting a stall, ms")
	flag.Parse()
	out := outcome{Peer: "go", Kind: *kind}
	if *kind != "sleep" && *kind != "fs" && *kind != "compute" {
		e := fmt.Sprintf("bad kind %q", *kind)
		out.Error = &e
		emit(out)
		return
	}
	interval := time.Duration(*intervalUs) * time.Microsecond
	duration := time.Duration(*durationMs) * time.Millisecond
	if interval <= 0 || duration <= 0 {
		e := "interval and duration must be positive"
		out.Error = &e
		emit(out)
		return
	}
	out.Expected = uint64(duration / interval)
	file := filepath.Join(os.TempDir(), fmt.Sprintf("cw-blocking-go-%d", os.Getpid()))
	if *kind == "fs" {
		if err := os.WriteFile(file, make([]byte, 4096), 0o600); err != nil {
			e := err.Error()
			out.Error = &e
			emit(out)
			return
		}
		defer os.Remove(file)
	}

	var t ticks
	var stop atomic.Bool
	var calls atomic.Uint64
	started := make(chan time.Time)
	done := make(chan struct{})
	go func() {
		start := time.Now()
		end := start.Add(duration)
		started <- start
		due := start.Add(interval)
		for {
			time.Sleep(time.Until(due))
			now := time.Now()
			t.push(float64(now.Sub(due).Nanoseconds()) / 1e3)
			if !now.Before(end) {
				break
			}
			// The next due time after now: missed ones are dropped.
			due = start.Add((now.Sub(start)/interval + 1) * interval)
		}
		close(done)
	}()
	start := <-started
	var wg sync.WaitGroup
	for i := 0; i < *blockers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			blocker(*kind, file, &stop, &calls)
		}()
	}
	time.Sleep(time.Until(start.Add(duration)))
	stop.Store(true)
	finished := make(chan struct{})
	go func() {
		<-done
		wg.Wait()
		close(finished)
	}()
	select {
	case <-finished:
	case <-time.After(interval + time.Duration(*graceMs)*time.Millisecond):
		out.Stalled = true
	}
	out.LatenessUs = t.snapshot()
	out.BlockerCalls = calls.Load()
	emit(out)
	if *kind == "fs" {
		os.Remove(file)
	}
	os.Exit(0)
}
