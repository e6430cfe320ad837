module corewise/bench/go-blocking

go 1.21
