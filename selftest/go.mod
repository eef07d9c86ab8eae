module github.com/perfbuf/perfbuf/selftest

go 1.25.0

require (
	github.com/aquasecurity/libbpfgo v0.7.0-libbpf-1.4
	github.com/cilium/ebpf v0.21.0
	github.com/perfbuf/perfbuf v0.1.0
	github.com/perfbuf/perfbuf/bpfbuffer v0.1.0
	github.com/perfbuf/perfbuf/bpfbuffer/ciliumbuffer v0.1.0
	github.com/perfbuf/perfbuf/internal/bpfrun v0.1.0
	golang.org/x/sys v0.37.0
)
