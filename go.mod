module github.com/perfbuf/perfbuf

go 1.25.0

require golang.org/x/sys v0.9.0
