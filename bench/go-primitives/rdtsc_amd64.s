#include "textflag.h"

// func rdtsc() uint64
TEXT ·rdtsc(SB),NOSPLIT,$0-8
	LFENCE
	RDTSC
	SHLQ	$32, DX
	ORQ	DX, AX
	MOVQ	AX, ret+0(FP)
	RET

// func rdtscpAux() uint32
TEXT ·rdtscpAux(SB),NOSPLIT,$0-4
	RDTSCP
	MOVL	CX, ret+0(FP)
	RET
