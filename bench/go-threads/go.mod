module corewise/bench/go-threads

go 1.21
