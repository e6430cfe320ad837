package main

// rdtsc reads the time-stamp counter after an lfence (assembly).
func rdtsc() uint64

// rdtscpAux returns IA32_TSC_AUX, which Linux sets to (node << 12) | cpu.
func rdtscpAux() uint32

const haveTSC = true

// currentCPU is the CPU the calling goroutine runs on.
func currentCPU() int { return int(rdtscpAux() & 0xfff) }
