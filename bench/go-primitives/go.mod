module corewise/bench/go-primitives

go 1.21
