module github.com/perfbuf/perfbuf/bpfbuffer/ciliumbuffer

go 1.25.0

require (
	github.com/cilium/ebpf v0.21.0
	github.com/perfbuf/perfbuf v0.1.0
	golang.org/x/sys v0.37.0
)
