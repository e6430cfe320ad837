// Command go-primitives is the Go peer of `corewise-bench primitives`.
//
// It measures goroutine primitives with the same clock as the Rust harness
// (the TSC on amd64, else CLOCK_MONOTONIC) and prints one JSON object to
// stdout: raw samples per op in "ticks" (TSC) or "ns", plus creation
// throughput and idle CPU. The harness converts ticks to ns.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

var (
	useTSC  bool
	cpuA    int
	cpuB    int
	settle  time.Duration
	quick   bool
	timeout = 5 * time.Second
	base    = time.Now()
)

func monoNs() uint64 { return uint64(time.Since(base)) }

func now() uint64 {
	if useTSC {
		return rdtsc()
	}
	return monoNs()
}

func delta(t0, t1 uint64) float64 {
	if t1 < t0 {
		return 0
	}
	return float64(t1 - t0)
}

// setAffinity pins thread tid (0 = the calling thread) to cpus.
func setAffinity(tid int, cpus ...int) error {
	var mask [16]uint64
	for _, c := range cpus {
		mask[c/64] |= 1 << (uint(c) % 64)
	}
	_, _, e := syscall.RawSyscall(syscall.SYS_SCHED_SETAFFINITY, uintptr(tid),
		unsafe.Sizeof(mask), uintptr(unsafe.Pointer(&mask[0])))
	if e != 0 {
		return e
	}
	return nil
}

// pinProcess sets the affinity of every thread of the process.
func pinProcess(cpus ...int) {
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return
	}
	for _, e := range ents {
		if tid, err := strconv.Atoi(e.Name()); err == nil {
			_ = setAffinity(tid, cpus...)
		}
	}
}

func die(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "go-primitives: "+format+"\n", a...)
	os.Exit(1)
}

func busyWait(d time.Duration) {
	s := time.Now()
	for time.Since(s) < d {
	}
}

// spinUntil spins until f() holds, failing after the timeout.
func spinUntil(what string, f func() bool) {
	s := time.Now()
	for i := 0; !f(); i++ {
		if i%1024 == 0 && time.Since(s) > timeout {
			die("timed out waiting during %s", what)
		}
	}
}

type collector struct {
	kept     []float64
	rejected uint64
	warm     int
	want     int
}

func newCollector(want int) *collector {
	w := want / 10
	if w < 20 {
		w = 20
	}
	return &collector{kept: make([]float64, 0, want), warm: w, want: want}
}

func (c *collector) done() bool {
	return len(c.kept) >= c.want || c.rejected > uint64(4*c.want+1000)
}

func (c *collector) offer(v float64, ok bool) {
	switch {
	case !ok:
		c.rejected++
	case c.warm > 0:
		c.warm--
	case len(c.kept) < c.want:
		c.kept = append(c.kept, v)
	}
}

func onB(cpu int) bool { return cpu < 0 || cpu == cpuB }

type stamp struct {
	tick atomic.Uint64
	cpu  atomic.Int64
}

func (s *stamp) record(t uint64) {
	s.cpu.Store(int64(currentCPU()))
	if t == 0 {
		t = 1
	}
	s.tick.Store(t)
}

func (s *stamp) wait(what string) (uint64, int) {
	var t uint64
	spinUntil(what, func() bool { t = s.tick.Load(); return t != 0 })
	return t, int(s.cpu.Load())
}

// lockedOnA runs f on a goroutine locked to an OS thread pinned to cpu A.
func lockedOnA(f func()) {
	done := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := setAffinity(0, cpuA); err != nil {
			die("pin to cpu %d: %v", cpuA, err)
		}
		f()
		_ = setAffinity(0, cpuA, cpuB)
		close(done)
	}()
	<-done
}

func createCrossCore(n int) *collector {
	c := newCollector(n)
	lockedOnA(func() {
		for !c.done() {
			s := new(stamp)
			t0 := now()
			go func() { s.record(now()) }()
			t1, cpu := s.wait("create_cross_core")
			c.offer(delta(t0, t1), onB(cpu))
			busyWait(settle)
		}
	})
	return c
}

func spawnJoin(n int) []float64 {
	c := newCollector(n)
	for !c.done() {
		ch := make(chan struct{})
		t0 := now()
		go func() { close(ch) }()
		<-ch
		c.offer(delta(t0, now()), true)
	}
	return c.kept
}

func nullYield(n int) []float64 {
	c := newCollector(n)
	for !c.done() {
		t0 := now()
		for i := 0; i < 10; i++ {
			runtime.Gosched()
		}
		c.offer(delta(t0, now())/10, true)
	}
	return c.kept
}

func oneWayYield(n int) []float64 {
	var counter atomic.Uint64
	var stop atomic.Bool
	done := make(chan struct{})
	go func() {
		for !stop.Load() {
			if v := counter.Load(); v%2 == 1 {
				counter.Store(v + 1)
			}
			runtime.Gosched()
		}
		close(done)
	}()
	c := newCollector(n)
	const batch = 20
	for !c.done() {
		start := counter.Load()
		t0 := now()
		for {
			v := counter.Load()
			if v >= start+batch {
				break
			}
			if v%2 == 0 {
				counter.Store(v + 1)
			}
			runtime.Gosched()
		}
		t1 := now()
		c.offer(delta(t0, t1)/float64(counter.Load()-start), true)
	}
	stop.Store(true)
	<-done
	return c.kept
}

func condNotify(n int) *collector {
	var mu sync.Mutex
	cond := sync.NewCond(&mu)
	var goRound, waiting uint64
	s := new(stamp)
	quit := make(chan struct{})
	go func() {
		mu.Lock()
		defer mu.Unlock()
		for round := uint64(1); ; round++ {
			waiting = round
			for goRound < round {
				cond.Wait()
			}
			if goRound == ^uint64(0) {
				close(quit)
				return
			}
			s.record(now())
		}
	}()
	c := newCollector(n)
	lockedOnA(func() {
		for round := uint64(1); !c.done(); round++ {
			spinUntil("cond ready", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return waiting >= round
			})
			busyWait(settle)
			s.tick.Store(0)
			mu.Lock()
			goRound = round
			mu.Unlock()
			t0 := now()
			cond.Signal()
			t1, cpu := s.wait("cond wake")
			c.offer(delta(t0, t1), onB(cpu))
		}
	})
	mu.Lock()
	goRound = ^uint64(0)
	mu.Unlock()
	cond.Signal()
	<-quit
	return c
}

func chanSignal(n int) *collector {
	ch := make(chan struct{})
	var ready atomic.Uint64
	s := new(stamp)
	quit := make(chan struct{})
	go func() {
		for round := uint64(1); ; round++ {
			ready.Store(round)
			if _, ok := <-ch; !ok {
				close(quit)
				return
			}
			s.record(now())
		}
	}()
	c := newCollector(n)
	lockedOnA(func() {
		for round := uint64(1); !c.done(); round++ {
			spinUntil("chan ready", func() bool { return ready.Load() >= round })
			busyWait(settle)
			s.tick.Store(0)
			t0 := now()
			ch <- struct{}{}
			t1, cpu := s.wait("chan wake")
			c.offer(delta(t0, t1), onB(cpu))
		}
	})
	close(ch)
	<-quit
	return c
}

func throughput(n int) float64 {
	var wg sync.WaitGroup
	res := make(chan float64)
	go func() {
		start := time.Now()
		wg.Add(n)
		for i := 0; i < n; i++ {
			go func() { wg.Done() }()
		}
		wg.Wait()
		res <- float64(n) / time.Since(start).Seconds()
	}()
	return <-res
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func idleCPU(window time.Duration) float64 {
	runtime.GC()
	time.Sleep(50 * time.Millisecond)
	c0, w0 := cpuTime(), time.Now()
	time.Sleep(window)
	c1, wall := cpuTime(), time.Since(w0)
	return 100 * float64(c1-c0) / float64(wall)
}

type output struct {
	Unit       string               `json:"unit"`
	Ops        map[string][]float64 `json:"ops"`
	Rejected   map[string]uint64    `json:"rejected"`
	Throughput float64              `json:"creation_throughput_per_s"`
	Idle       float64              `json:"idle_cpu_percent"`
}

func main() {
	clock := flag.String("clock", "tsc", "tsc or mono")
	flag.IntVar(&cpuA, "cpu-a", 0, "home cpu")
	flag.IntVar(&cpuB, "cpu-b", 1, "other cpu")
	settleUs := flag.Int("settle-us", 20, "pause before each notify, µs")
	idleMs := flag.Int("idle-ms", 2000, "idle CPU window, ms")
	flag.BoolVar(&quick, "quick", false, "fewer samples")
	flag.Parse()
	if cpuA < 0 || cpuB < 0 || cpuA >= 1024 || cpuB >= 1024 || cpuA == cpuB {
		die("bad cpus %d and %d", cpuA, cpuB)
	}
	useTSC = *clock == "tsc" && haveTSC
	settle = time.Duration(*settleUs) * time.Microsecond
	cheap, cross, children := 10000, 5000, 500000
	if quick {
		cheap, cross, children = 2000, 1000, 100000
	}
	out := output{Unit: "ns", Ops: map[string][]float64{}, Rejected: map[string]uint64{}}
	if useTSC {
		out.Unit = "ticks"
	}
	addC := func(name string, c *collector) {
		out.Ops[name] = c.kept
		out.Rejected[name] = c.rejected
	}

	// Cross-core ops: two Ps, the process may use both cpus.
	runtime.GOMAXPROCS(2)
	pinProcess(cpuA, cpuB)
	addC("create_cross_core", createCrossCore(cross))
	addC("condvar_notify_cross_core", condNotify(cross))
	addC("signal_cross_core", chanSignal(cross))

	// Same-core ops: one P, every thread pinned to cpu A.
	runtime.GOMAXPROCS(1)
	pinProcess(cpuA)
	out.Ops["spawn_join_same_core"] = spawnJoin(cheap)
	out.Ops["null_yield"] = nullYield(cheap)
	out.Ops["one_way_yield"] = oneWayYield(cheap / 2)

	runtime.GOMAXPROCS(2)
	pinProcess(cpuA, cpuB)
	out.Throughput = throughput(children)
	out.Idle = idleCPU(time.Duration(*idleMs) * time.Millisecond)

	enc := json.NewEncoder(os.Stdout)
	if err := enc.Encode(out); err != nil {
		die("encode: %v", err)
	}
}
