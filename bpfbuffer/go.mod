module github.com/perfbuf/perfbuf/bpfbuffer

go 1.25.0

require (
	github.com/aquasecurity/libbpfgo v0.7.0-libbpf-1.4
	github.com/perfbuf/perfbuf v0.1.0
	golang.org/x/sys v0.9.0
)
